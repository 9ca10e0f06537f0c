"""Exercises of notebook 02 (how the split works): split the heads, merge them back, mask the future."""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import as_float64, call_answer, expect_shape, first_match, observe
from .core import Exercise, Wrong, register

# Hidden cases: (batch, tokens, d_model, n_heads). None of them is the notebook's example.
_SPLIT_CASES = [(2, 5, 12, 3), (1, 1, 8, 8), (3, 4, 6, 1), (2, 3, 10, 5), (1, 7, 16, 4)]


def _numbered(*shape: int) -> Tensor:
    """A float tensor whose entries are their own memory offsets: every misplaced number shows."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(*shape)


def _shares_memory(result, x: Tensor) -> bool:
    return isinstance(result, Tensor) and result.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


# ------------------------------------------------------------------------------------ exercise 1
def _check_split(split_heads) -> None:
    for B, T, D, H in _SPLIT_CASES:
        dk, case = D // H, f"x of shape [{B}, {T}, {D}] with n_heads={H}"
        x = _numbered(B, T, D)  # a fresh input per call, so the result can be compared with its memory
        result = call_answer(split_heads, x, H, label=case, copy_args=False)
        view = observe(lambda: _shares_memory(result, x))
        got, want = as_float64(result, f"what split_heads({case}) returned"), _numbered(B, T, D).view(B, T, H, dk).transpose(1, 2)
        if got.shape != want.shape:
            if tuple(got.shape) == (B, T, H, dk) and H != T:
                raise Wrong(f"for {case} you returned shape [B, T, H, dk] = {list(got.shape)}; the head axis must come "
                            f"before the token axis: [B, H, T, dk] = {list(want.shape)}")
            if tuple(got.shape) in ((B, H, T, D), (B, T, D)):
                raise Wrong(f"for {case} you returned shape {list(got.shape)}; each head works in d_k = d_model / n_heads "
                            f"= {dk} features, so the result is [B, H, T, d_k] = {list(want.shape)}")
            expect_shape(got, want.shape, f"the result for {case} ([B, H, T, d_k])")
        if not torch.equal(got, want.double()):
            if torch.equal(got, x.reshape(B, H, T, dk).double()):
                raise Wrong(f"right shape, numbers in the wrong places (for {case}): your head 0 holds all the features of "
                            "the first tokens instead of a slice of the features of every token. Reshaping straight to "
                            "[B, H, T, dk] cuts along the wrong axis: every head must see every token")
            if torch.equal(got, _numbered(B, T, D).view(B, T, dk, H).permute(0, 3, 1, 2).double()):
                raise Wrong(f"right shape, but (for {case}) your head 0 gets features 0, {H}, {2 * H}, ... (every n_heads-th "
                            "feature); the convention (mhalab and torch.nn.MultiheadAttention) gives head i the contiguous "
                            "slice of features i*d_k to (i+1)*d_k - 1")
            raise Wrong(f"right shape but wrong numbers for {case}: head i, token t should hold features "
                        "i*d_k ... (i+1)*d_k - 1 of token t")
        if not view:
            raise Wrong(f"right numbers, but for {case} your result is a copy: it does not share memory with x. Use "
                        "only view/reshape and transpose/permute, which change strides; .contiguous(), torch.stack, "
                        ".clone() and NumPy copy the data")


def _split_reference(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # [B, T, H, dk] -> [B, H, T, dk]


register(Exercise(
    "02", 1, "split into heads",
    _check_split,
    hint="Two steps: cut each token's d_model features into n_heads groups of d_k (a view), then swap two "
         "axes so the head axis comes before the token axis. Check with the numbered tensor of the notebook.",
    solution=(
        "def split_heads(x, n_heads):\n"
        "    B, T, D = x.shape\n"
        "    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # [B, T, H, dk] -> [B, H, T, dk]"
    ),
    reference=_split_reference,
))


# ------------------------------------------------------------------------------------ exercise 2
def _check_merge(merge_heads) -> None:
    for B, T, D, H in _SPLIT_CASES:
        dk, case = D // H, f"heads of shape [{B}, {H}, {T}, {D // H}]"
        heads = _numbered(B, H, T, dk)  # as attention returns them: laid out head by head
        got = as_float64(call_answer(merge_heads, heads, label=case), f"what merge_heads({case}) returned")
        want = heads.transpose(1, 2).reshape(B, T, D).double()
        if tuple(got.shape) == (B, T, dk) and dk != D:
            raise Wrong(f"for {case} you returned {list(got.shape)}: one head's width; the heads are "
                        f"concatenated, so the result is [B, T, H * d_k] = [{B}, {T}, {D}]")
        expect_shape(got, (B, T, D), f"the result for {case} ([B, T, H * d_k])")
        if torch.equal(got, want):
            continue
        if torch.equal(got, heads.reshape(B, T, D).double()):
            raise Wrong(f"right shape, numbers in the wrong places (for {case}): your token 0 holds numbers from "
                        "several tokens of head 0. The head axis has to be moved back next to the feature axis "
                        "before the two are joined")
        raise Wrong(f"right shape but wrong numbers for {case}: token t should hold head 0's d_k outputs for "
                    "token t, then head 1's, and so on")


register(Exercise(
    "02", 2, "merge the heads",
    _check_merge,
    hint="Undo the split in reverse order: put the head axis back next to the features, then join the two "
         "axes into one. After attention the tensor is laid out head by head, so `.view` may refuse: "
         "`.reshape` copies when it must.",
    solution=(
        "def merge_heads(x):\n"
        "    B, H, T, dk = x.shape\n"
        "    return x.transpose(1, 2).reshape(B, T, H * dk)  # [B, T, H, dk] -> [B, T, D]"
    ),
    reference=lambda x: x.transpose(1, 2).reshape(x.size(0), x.size(2), x.size(1) * x.size(3)),
))


# ------------------------------------------------------------------------------------ exercise 3
def _score_cases():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(shape, generator=g) * 2 for shape in ((5, 5), (2, 3, 7, 7), (1, 1), (4, 2, 2))]


def _causal_mistakes(scores: Tensor) -> dict[str, Tensor]:
    """What each plausible mistake returns for ``scores`` (float64): message -> weights."""
    L = scores.size(-1)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()  # query i may see keys j <= i
    inf = float("-inf")
    return {
        "the mask is inverted: -inf went where keys are allowed (j <= i) and the future was kept. masked_fill fills "
        "where its mask is True, so give it the forbidden positions (j > i)": scores.masked_fill(allowed, inf).softmax(-1),
        "the mask is transposed: queries see the future and not the past. Row i is query i, column j is key j, and "
        "query i may see keys j <= i (the lower triangle)": scores.masked_fill(~allowed.T, inf).softmax(-1),
        "the softmax runs over the queries (dim -2); each query's weights must sum to 1 over the keys, the last axis":
            scores.masked_fill(~allowed, inf).softmax(-2),
        "future keys still get weight: a masked score set to 0 still gets exp(0) in the softmax. Forbidden scores "
        "must become -inf (or a huge negative number)": scores.masked_fill(~allowed, 0.0).softmax(-1),
        "the rows of your weights do not sum to 1: mask the scores before the softmax, not the weights after it":
            scores.softmax(-1) * allowed,
        "every query hides its own key too; the diagonal (j = i) is allowed, and the first query has nothing else "
        "to look at (its row becomes NaN)": scores.masked_fill(~allowed.tril(-1), inf).softmax(-1),
        "no key is masked: every key j > i must get exactly zero weight": scores.softmax(-1),
    }


def _check_causal(causal_attention_weights) -> None:
    for scores in _score_cases():
        case = f"scores of shape {list(scores.shape)}"
        got = as_float64(call_answer(causal_attention_weights, scores, label=case), f"the weights for {case}")
        expect_shape(got, scores.shape, f"the weights for {case} (the same shape as the scores)")
        s = scores.double()
        want = _causal_reference(s)
        if first_match(got, {"": want}) is not None:
            continue
        mistake = first_match(got, _causal_mistakes(s))
        if mistake:
            raise Wrong(f"for {case}: {mistake}")
        L = s.size(-1)
        if torch.isnan(got).any():
            raise Wrong(f"NaN in your weights for {case}: some row has every key masked; query i may always see key i")
        if (got[..., ~torch.ones(L, L, dtype=torch.bool).tril()].abs() > 1e-6).any():
            raise Wrong(f"for {case} some query puts weight on a later key (j > i); those must get exactly 0")
        diff = (got - want).abs().max().item()
        raise Wrong(f"for {case} your weights differ from the causal softmax by up to {diff:.3g}; "
                    "did you scale or shift the scores? (they come in already scaled)")


def _causal_reference(scores):
    L = scores.size(-1)
    allowed = torch.ones(L, L, dtype=torch.bool, device=scores.device).tril()  # [L, L]: key j <= query i
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


register(Exercise(
    "02", 3, "causal masking",
    _check_causal,
    hint="Row i holds query i's scores over keys j. Build a boolean [L, L] matrix that is True where j <= i "
         "(torch.tril), put -inf in the scores where it is False, then softmax over the keys (the last axis).",
    solution=(
        "def causal_attention_weights(scores):\n"
        "    L = scores.size(-1)\n"
        "    allowed = torch.ones(L, L, dtype=torch.bool).tril()  # [L, L]: True where key j <= query i\n"
        "    return scores.masked_fill(~allowed, float('-inf')).softmax(dim=-1)"
    ),
    reference=_causal_reference,
))
