"""Exercises of notebook 02 (how the split works): split the heads, merge them back, mask the future."""

from __future__ import annotations

import torch
from torch import Tensor

from .core import Exercise, Wrong, register

# Hidden cases: (batch, tokens, d_model, n_heads). None of them is the notebook's example.
_SPLIT_CASES = [(2, 5, 12, 3), (1, 1, 8, 8), (3, 4, 6, 1), (2, 3, 10, 5), (1, 7, 16, 4)]


def _numbered(*shape: int) -> Tensor:
    """A float tensor whose entries are their own memory offsets: every misplaced number shows."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float32).view(*shape)


def _as_tensor(result, what: str) -> Tensor:
    if not isinstance(result, Tensor):
        raise Wrong(f"{what} should return a torch.Tensor, got {type(result).__name__}")
    return result


# ------------------------------------------------------------------------------------ exercise 1
def _check_split(split_heads) -> None:
    for B, T, D, H in _SPLIT_CASES:
        dk = D // H
        x = _numbered(B, T, D)
        got = _as_tensor(split_heads(x.clone(), H), "split_heads")
        want = x.view(B, T, H, dk).transpose(1, 2)  # [B, H, T, dk]
        case = f"x of shape [{B}, {T}, {D}] with n_heads={H}"
        if tuple(got.shape) != tuple(want.shape):
            if tuple(got.shape) == (B, T, H, dk) and H != T:
                raise Wrong(
                    f"for {case} you returned shape [B, T, H, dk] = {list(got.shape)}; the head axis must come "
                    f"before the token axis: [B, H, T, dk] = {list(want.shape)}"
                )
            if tuple(got.shape) in ((B, H, T, D), (B, T, D)):
                raise Wrong(
                    f"for {case} you returned shape {list(got.shape)}; each head works in d_k = d_model / n_heads "
                    f"= {dk} features, so the result is [B, H, T, d_k] = {list(want.shape)}"
                )
            raise Wrong(f"for {case} expected shape [B, H, T, d_k] = {list(want.shape)}, got {list(got.shape)}")
        if torch.equal(got, want):
            continue
        if torch.equal(got, x.reshape(B, H, T, dk)):
            raise Wrong(
                f"right shape, numbers in the wrong places (for {case}): your head 0 holds all the features of "
                "the first tokens instead of a slice of the features of every token. Reshaping straight to "
                "[B, H, T, dk] cuts along the wrong axis: every head must see every token"
            )
        if torch.equal(got, x.view(B, T, dk, H).permute(0, 3, 1, 2)):
            raise Wrong(
                f"right shape, but (for {case}) your head 0 gets features 0, {H}, {2 * H}, ... (every n_heads-th "
                f"feature); the convention (mhalab and torch.nn.MultiheadAttention) gives head i the contiguous "
                f"slice of features i*d_k to (i+1)*d_k - 1"
            )
        raise Wrong(
            f"right shape but wrong numbers for {case}: head i, token t should hold features "
            "i*d_k ... (i+1)*d_k - 1 of token t"
        )


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
    wrong=[
        lambda x, n_heads: x.view(x.size(0), n_heads, x.size(1), x.size(2) // n_heads),  # no transpose
        lambda x, n_heads: x.view(x.size(0), x.size(1), n_heads, x.size(2) // n_heads),  # [B, T, H, dk]
        lambda x, n_heads: x.view(x.size(0), x.size(1), x.size(2) // n_heads, n_heads).permute(0, 3, 1, 2),
    ],
))


# ------------------------------------------------------------------------------------ exercise 2
def _check_merge(merge_heads) -> None:
    for B, T, D, H in _SPLIT_CASES:
        dk = D // H
        heads = _numbered(B, H, T, dk)  # as attention returns them: laid out head by head
        got = _as_tensor(merge_heads(heads.clone()), "merge_heads")
        want = heads.transpose(1, 2).reshape(B, T, D)
        case = f"heads of shape [{B}, {H}, {T}, {dk}]"
        if tuple(got.shape) != (B, T, D):
            if tuple(got.shape) == (B, T, dk):
                raise Wrong(f"for {case} you returned {list(got.shape)}: one head's width; the heads are "
                            f"concatenated, so the result is [B, T, H * d_k] = [{B}, {T}, {D}]")
            raise Wrong(f"for {case} expected shape [B, T, H * d_k] = [{B}, {T}, {D}], got {list(got.shape)}")
        if torch.equal(got, want):
            continue
        if torch.equal(got, heads.reshape(B, T, D)):
            raise Wrong(
                f"right shape, numbers in the wrong places (for {case}): your token 0 holds numbers from "
                "several tokens of head 0. The head axis has to be moved back next to the feature axis "
                "before the two are joined"
            )
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
    wrong=[
        lambda x: x.reshape(x.size(0), x.size(2), x.size(1) * x.size(3)),  # no transpose
        lambda x: x[:, 0],  # only the first head
    ],
))


# ------------------------------------------------------------------------------------ exercise 3
def _score_cases():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(shape, generator=g) * 2 for shape in ((5, 5), (2, 3, 7, 7), (1, 1), (4, 2, 2))]


def _check_causal(causal_attention_weights) -> None:
    for scores in _score_cases():
        L = scores.size(-1)
        got = _as_tensor(causal_attention_weights(scores.clone()), "causal_attention_weights")
        allowed = torch.ones(L, L).tril().bool()  # query i may see keys j <= i
        want = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        case = f"scores of shape {list(scores.shape)}"
        if tuple(got.shape) != tuple(scores.shape):
            raise Wrong(f"for {case} expected weights of the same shape, got {list(got.shape)}")
        if torch.isnan(got).any():
            raise Wrong(
                f"NaN in your weights for {case}: a row with every key forbidden has nothing to normalise. "
                "Query i must be allowed to see key i itself (the diagonal), so the first row keeps one key"
            )
        future = ~allowed
        if L > 1 and (got[..., future].abs() > 1e-6).any():
            past = torch.ones(L, L).tril(-1).bool()  # keys strictly before the query
            if (got[..., past].abs() < 1e-6).all():
                raise Wrong(
                    f"for {case} your weights let queries see the future and hide the past: row i is query i, "
                    "column j is key j, and query i may see keys j <= i (the lower triangle)"
                )
            if torch.allclose(got, scores.masked_fill(future, 0.0).softmax(-1), atol=1e-5):
                raise Wrong(
                    f"for {case} future keys still get weight: a masked score set to 0 still gets exp(0) in the "
                    "softmax. Forbidden scores must become -inf (or a huge negative number)"
                )
            raise Wrong(f"for {case} some query puts weight on a later key (j > i); those must get exactly 0")
        sums = got.sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
            raise Wrong(
                f"for {case} the rows of your weights sum to {sums.min():.3f} ... {sums.max():.3f}, not 1: "
                "mask the scores before the softmax, not the weights after it"
            )
        if L > 1 and (got.diagonal(dim1=-2, dim2=-1) == 0).any():
            raise Wrong(f"for {case} some query gives its own key zero weight: the diagonal (j = i) is allowed")
        if not torch.allclose(got, want, atol=1e-5):
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
    wrong=[
        # off by one: a token may not see itself (row 0 becomes all -inf -> NaN)
        lambda s: s.masked_fill(~torch.ones(s.size(-1), s.size(-1)).tril(-1).bool(), float("-inf")).softmax(-1),
        # the transposed mask: queries see the future
        lambda s: s.masked_fill(~torch.ones(s.size(-1), s.size(-1)).triu().bool(), float("-inf")).softmax(-1),
        # masking with 0 instead of -inf
        lambda s: s.masked_fill(~torch.ones(s.size(-1), s.size(-1)).tril().bool(), 0.0).softmax(-1),
        # masking the weights after the softmax
        lambda s: s.softmax(-1) * torch.ones(s.size(-1), s.size(-1)).tril(),
    ],
))
