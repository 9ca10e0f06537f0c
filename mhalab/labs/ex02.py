"""Exercises of notebook 02 (how the split works): split the heads, merge them back, mask the future."""

from __future__ import annotations

import torch
from torch import Tensor

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, expect_shape, first_match
from .verdicts import Wrong

# Hidden cases: (batch, tokens, d_model, n_heads). None of them is the notebook's example.
_SPLIT_CASES = [(2, 5, 12, 3), (1, 1, 8, 8), (3, 4, 6, 1), (2, 3, 10, 5), (1, 7, 16, 4)]


def _split_cases(check: Check) -> list[tuple[int, int, int, int]]:
    """The fixed cases, and when grading two drawn fresh (so no table of answers can hold them)."""
    if not check.grading:
        return list(_SPLIT_CASES)
    r = check.rng(20)
    fresh = [(r.randint(1, 3), r.randint(2, 9), r.randint(2, 6)) for _ in range(2)]
    return list(_SPLIT_CASES) + [(B, T, H * r.randint(2, 5), H) for B, T, H in fresh]


def _numbered(*shape: int) -> Tensor:
    """A float tensor whose entries are their own memory offsets: every misplaced number shows."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(*shape)


# ------------------------------------------------------------------------------------ exercise 1
def _check_split(split_heads, check: Check) -> None:
    for B, T, D, H in _split_cases(check):
        dk, case = D // H, f"x of shape [{B}, {T}, {D}] with n_heads={H}"
        x = _numbered(B, T, D)  # a fresh input per call, so the result can be compared with its memory
        result = check.call(split_heads, x, H, label=case, copy_args=False, facts=("shares_memory",))
        view = check.observe("shares_memory")
        got = as_float64(result, f"what split_heads({case}) returned")
        want = check.reference(_numbered(B, T, D), H)
        if got.shape != want.shape:
            if tuple(got.shape) == (B, T, H, dk) and H != T:
                raise Wrong(f"for {case} you returned shape [B, T, H, dk] = {list(got.shape)}; the head axis must come "
                            f"before the token axis: [B, H, T, dk] = {list(want.shape)}")
            if tuple(got.shape) in ((B, H, T, D), (B, T, D)):
                raise Wrong(f"for {case} you returned shape {list(got.shape)}; each head works in d_k = d_model / "
                            f"n_heads = {dk} features, so the result is [B, H, T, d_k] = {list(want.shape)}")
            expect_shape(got, want.shape, f"the result for {case} ([B, H, T, d_k])")
        if not torch.equal(got, want.double()):
            if torch.equal(got, x.reshape(B, H, T, dk).double()):
                raise Wrong(f"right shape, numbers in the wrong places (for {case}): your head 0 holds all the "
                            "features of the first tokens instead of a slice of the features of every token. "
                            "Reshaping straight to [B, H, T, dk] cuts along the wrong axis: every head must see every "
                            "token")
            if torch.equal(got, _numbered(B, T, D).view(B, T, dk, H).permute(0, 3, 1, 2).double()):
                raise Wrong(f"right shape, but (for {case}) your head 0 gets features 0, {H}, {2 * H}, ... (every "
                            "n_heads-th feature); the convention (mhalab and torch.nn.MultiheadAttention) gives head "
                            "i the contiguous slice of features i*d_k to (i+1)*d_k - 1")
            raise Wrong(f"right shape but wrong numbers for {case}: head i, token t should hold features "
                        "i*d_k ... (i+1)*d_k - 1 of token t")
        if not view:
            raise Wrong(f"right numbers, but for {case} your result is a copy: it does not share memory with x. Use "
                        "only view/reshape and transpose/permute, which change strides; .contiguous(), torch.stack, "
                        ".clone() and NumPy copy the data")


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
    minutes=10, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 2
def _check_merge(merge_heads, check: Check) -> None:
    for B, T, D, H in _split_cases(check):
        dk, case = D // H, f"heads of shape [{B}, {H}, {T}, {D // H}]"
        heads = _numbered(B, H, T, dk)  # as attention returns them: laid out head by head
        got = as_float64(check.call(merge_heads, heads, label=case), f"what merge_heads({case}) returned")
        want = check.reference(heads).double()
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
    minutes=5, difficulty=1, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 3
def _score_cases(check: Check):
    g = check.generator(2)
    return [torch.randn(shape, generator=g) * 2 for shape in ((5, 5), (2, 3, 7, 7), (1, 1), (4, 2, 2))]


def _causal_mistakes(scores: Tensor) -> dict[str, Tensor]:
    """What each plausible mistake returns for ``scores`` (float64): message -> weights."""
    L = scores.size(-1)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()  # query i may see keys j <= i
    inf = float("-inf")
    return {
        "the mask is inverted: -inf went where keys are allowed (j <= i) and the future was kept. masked_fill fills "
        "where its mask is True, so give it the forbidden positions (j > i)":
            scores.masked_fill(allowed, inf).softmax(-1),
        "the mask is transposed: queries see the future and not the past. Row i is query i, column j is key j, and "
        "query i may see keys j <= i (the lower triangle)": scores.masked_fill(~allowed.T, inf).softmax(-1),
        "the softmax runs over the queries (dim -2); each query's weights must sum to 1 over the keys, the last "
        "axis": scores.masked_fill(~allowed, inf).softmax(-2),
        "future keys still get weight: a masked score set to 0 still gets exp(0) in the softmax. Forbidden scores "
        "must become -inf (or a huge negative number)": scores.masked_fill(~allowed, 0.0).softmax(-1),
        "the rows of your weights do not sum to 1: mask the scores before the softmax, not the weights after it":
            scores.softmax(-1) * allowed,
        "every query hides its own key too; the diagonal (j = i) is allowed, and the first query has nothing else "
        "to look at (its row becomes NaN)": scores.masked_fill(~allowed.tril(-1), inf).softmax(-1),
        "no key is masked: every key j > i must get exactly zero weight": scores.softmax(-1),
    }


def _check_causal(causal_attention_weights, check: Check) -> None:
    for scores in _score_cases(check):
        case = f"scores of shape {list(scores.shape)}"
        got = as_float64(check.call(causal_attention_weights, scores, label=case), f"the weights for {case}")
        expect_shape(got, scores.shape, f"the weights for {case} (the same shape as the scores)")
        s = scores.double()
        want = check.reference(s)
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
    minutes=10, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 4: the capstone
# The learner's whole multi-head attention, checked in stages, each with its own diagnosis, then against
# torch.nn.MultiheadAttention with the same weights. Stages 2-5 compare loosely (they name structural
# mistakes); stage 6 asks for agreement within 1e-5.
_LOOSE = dict(rtol=1e-2, atol=1e-2)


def _weights(check: Check, D: int, seed: int) -> tuple[Tensor, ...]:
    g = check.generator(seed)
    return tuple(torch.randn(D, D, generator=g) / D**0.5 for _ in range(4))  # W_Q, W_K, W_V, W_O: [out, in]


def _mha(x, W_Q, W_K, W_V, W_O, n_heads, *, split="right", merge="right", scale="d_k", causal=True, flipped=False,
         swapped=False, over=-1, itself=True):
    """Multi-head causal self-attention, with the plausible mistakes as options (float64): ``swapped`` Q and K,
    the softmax ``over`` another axis, a mask that hides the key of the query ``itself``."""
    x, W_Q, W_K, W_V, W_O = (t.double() for t in (x, W_Q, W_K, W_V, W_O))
    B, T, D = x.shape
    H, dk = n_heads, D // n_heads
    cut = {"right": lambda t: t.view(B, T, H, dk).transpose(1, 2),       # [B, H, T, dk]
           "no-transpose": lambda t: t.reshape(B, H, T, dk),
           "strided": lambda t: t.view(B, T, dk, H).permute(0, 3, 1, 2)}[split]
    q, k, v = cut(x @ W_Q.T), cut(x @ W_K.T), cut(x @ W_V.T)
    if swapped:
        q, k = k, q
    scores = q @ k.transpose(-2, -1) / {"d_k": dk**0.5, "none": 1.0, "d_model": D**0.5, "d_k^1": float(dk)}[scale]
    if causal:  # flipped: the mask of a learner who filled the past (j < i) instead of the future
        forbidden = (
            torch.ones(T, T, dtype=torch.bool).tril(-1)
            if flipped
            else ~torch.ones(T, T, dtype=torch.bool).tril(0 if itself else -1)
        )
        if not itself:
            forbidden[0, 0] = False  # (else the first query has no key at all: NaN, caught at stage 2)
        scores = scores.masked_fill(forbidden, float("-inf"))
    z = scores.softmax(over) @ v  # [B, H, T, dk]
    joined = {"right": lambda z: z.transpose(1, 2).reshape(B, T, D),
              "no-transpose": lambda z: z.reshape(B, T, D),
              "strided": lambda z: z.permute(0, 2, 3, 1).reshape(B, T, D)}[merge](z)
    return joined @ W_O.T  # [B, T, D]


def _torch_mha(x, W_Q, W_K, W_V, W_O, n_heads) -> Tensor:
    """What torch.nn.MultiheadAttention computes with the same weights and a causal mask."""
    B, T, D = x.shape
    module = torch.nn.MultiheadAttention(D, n_heads, bias=False, batch_first=True).double()
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([W_Q, W_K, W_V]).double())
        module.out_proj.weight.copy_(W_O.double())
        future = ~torch.ones(T, T, dtype=torch.bool).tril()  # True = may not attend
        return module(x.double(), x.double(), x.double(), attn_mask=future, need_weights=False)[0]


def _stage(n: int, name: str, message: str) -> Wrong:
    return Wrong(f"stage {n} of 6 ({name}): {message}")


def _run(check: Check, fn, x, weights, H, label):
    result = check.call(fn, x, *weights, H, label=label)
    return as_float64(result, f"what multi_head_attention({label}) returned")


def _check_mha(multi_head_attention, check: Check) -> None:
    W12 = _weights(check, 12, 0)
    g = check.generator(3)
    # stage 1: the shape
    x = torch.randn(2, 5, 12, generator=g)
    got = _run(check, multi_head_attention, x, W12, 3, "x [2, 5, 12], n_heads=3")
    if got.shape != x.shape:
        if tuple(got.shape) == (2, 3, 5, 4):
            raise _stage(1, "shapes", "you return the heads [B, H, T, d_k]; merge them back into [B, T, d_model] and "
                                      "apply W_O")
        raise _stage(1, "shapes", "for x [2, 5, 12] the output should have the shape of x, [2, 5, 12], not "
                                  f"{list(got.shape)}")
    # stage 2: one head, one token: its weight is 1, so the output is x W_Vᵀ W_Oᵀ
    x1 = torch.randn(2, 1, 12, generator=g)
    got = _run(check, multi_head_attention, x1, W12, 1, "x [2, 1, 12], n_heads=1")
    if torch.isnan(got).any():
        raise _stage(2, "one head, one token", "NaN in the output: a lone token must be allowed to see its own key "
                     "(the causal mask allows keys j <= i, the diagonal included). Is your mask inverted? masked_fill "
                     "fills where its mask is True, so give it the forbidden keys, j > i")
    if first_match(got, {"": _mha(x1, *W12, 1)}, **_LOOSE) is None:
        mistake = first_match(got, {
            "W_O is missing: the heads' output goes through the output projection": x1.double() @ W12[2].double().T,
            "the weights are applied untransposed; like nn.Linear, a projection is x @ W.T (W is [out, in])":
                x1.double() @ W12[2].double() @ W12[3].double(),
            "the output comes from the queries or keys, not the values":
                x1.double() @ W12[0].double().T @ W12[3].double().T,
        }, **_LOOSE)
        raise _stage(2, "one head, one token", mistake or "with one token its attention weight is 1, so the output "
                     "must be x W_Vᵀ W_Oᵀ: check the value projection and W_O")
    # stage 3: the scale, on the last token (which may see every key, whatever the mask)
    x6 = torch.randn(2, 6, 12, generator=g)
    got = _run(check, multi_head_attention, x6, W12, 1, "x [2, 6, 12], n_heads=1")
    if first_match(got[:, -1], {"": _mha(x6, *W12, 1)[:, -1]}, **_LOOSE) is None:
        mistake = first_match(got[:, -1], {
            "the scores are not scaled: divide Q Kᵀ by sqrt(d_k)": _mha(x6, *W12, 1, scale="none")[:, -1],
            "the scores are divided by d_k; the scale is 1 / sqrt(d_k)": _mha(x6, *W12, 1, scale="d_k^1")[:, -1],
        }, **_LOOSE)
        other = None if mistake else first_match(got[:, -1], {
            "Q and K are swapped: the scores are Q Kᵀ, a query's row against every key (x W_Qᵀ for the queries, "
            "x W_Kᵀ for the keys)": _mha(x6, *W12, 1, swapped=True)[:, -1],
            "the softmax runs over the queries (dim -2); each query's weights must sum to 1 over the keys, the last "
            "axis":
                _mha(x6, *W12, 1, over=-2)[:, -1],
            "the last token does not see itself: the causal mask allows keys j <= i, the diagonal included (tril(), "
            "not tril(-1))": _mha(x6, *W12, 1, itself=False)[:, -1],
        }, **_LOOSE)
        if other:
            raise _stage(3, "the scores", other)
        if (
            mistake is None
            and first_match(got[:, -1], {"": _mha(x6, *W12, 1, flipped=True)[:, -1]}, **_LOOSE) is not None
        ):
            raise _stage(3, "the mask", "the last token sees only itself: your mask is flipped, so query i sees keys "
                         "j >= i (itself and the future) instead of j <= i. masked_fill fills where its mask is True: "
                         "give it the future, j > i (torch.ones(T, T).triu(1).bool())")
        raise _stage(3, "the scale" if mistake else "the scores", mistake or "the last token (which may see every "
                                                                             "token) gets the wrong output, and "
                     "this check cannot tell why: check scores = Q Kᵀ / sqrt(d_k), the softmax over the keys (the last "
                     "axis), and that the mask lets the last token see every key")
    # stage 4: the mask: a future token must change nothing earlier
    changed = x6.clone()
    changed[:, -1] += torch.randn(2, 12, generator=g)
    again = _run(check, multi_head_attention, changed, W12, 1, "x [2, 6, 12] with its last token changed, n_heads=1")
    if torch.isnan(got).any():
        raise _stage(4, "the mask", "NaN in the output: some query has every key masked; query i may see keys j <= i, "
                                    "itself included")
    if not torch.allclose(got[:, :-1], again[:, :-1], atol=1e-6, rtol=0):
        raise _stage(4, "the mask", "changing the last token changed the outputs of earlier tokens: a token may only "
                                    "see itself and the tokens before it (mask the scores of keys j > i with -inf "
                                    "before the softmax)")
    if first_match(got, {"": _mha(x6, *W12, 1)}, **_LOOSE) is None:
        raise _stage(4, "the mask", "no token sees the future, but earlier tokens get the wrong output: query i may "
                                    "see every key j <= i, itself included")
    # stage 5: the head split and merge
    got = _run(check, multi_head_attention, x6, W12, 3, "x [2, 6, 12], n_heads=3")
    if first_match(got, {"": _mha(x6, *W12, 3)}, **_LOOSE) is None:
        variants = {}
        for split in ("right", "no-transpose", "strided"):
            for merge in ("right", "no-transpose", "strided"):
                if (split, merge) != ("right", "right"):
                    variants[(split, merge)] = _mha(x6, *W12, 3, split=split, merge=merge)
        variants[("scale", "d_model")] = _mha(x6, *W12, 3, scale="d_model")
        found = first_match(got, {repr(k): v for k, v in variants.items()}, **_LOOSE)
        messages = {
            "no-transpose": "your split reshapes [B, T, d_model] straight to [B, H, T, d_k]: a transpose in the wrong "
                            "place (view as [B, T, H, d_k], then transpose(1, 2)), so each head sees a block of tokens",
            "strided": "head i should get the contiguous features i*d_k ... (i+1)*d_k - 1, not every n_heads-th "
                       "feature",
        }
        if found == repr(("scale", "d_model")):
            message = "the scores are divided by sqrt(d_model); each head scales by sqrt(d_k), its own width"
        elif found:
            split, merge = eval(found)  # noqa: S307 (our own repr)
            if split != "right":
                message = messages[split]
            else:
                message = ("your merge joins [B, H, T, d_k] straight into [B, T, d_model]: a transpose is missing "
                           "there (transpose(1, 2) back to [B, T, H, d_k] first)" if merge == "no-transpose"
                           else messages["strided"])
        else:
            message = "one head works, several do not: check how you split the width into heads and merge them back"
        raise _stage(5, "the head split", message)
    # stage 6: the whole module against torch.nn.MultiheadAttention with the same weights
    for B, T, D, H, seed in [(2, 7, 16, 4, 1), (1, 9, 24, 6, 2), (3, 1, 8, 2, 3), (2, 5, 12, 12, 4)]:
        weights, x = _weights(check, D, seed), torch.randn(B, T, D, generator=g)
        label = f"x [{B}, {T}, {D}], n_heads={H}"
        got = _run(check, multi_head_attention, x, weights, H, label)
        want = _torch_mha(x, *weights, H)
        if first_match(got, {"": want}, rtol=1e-5, atol=1e-5) is None:
            if got.shape != want.shape:
                raise _stage(6, "torch.nn.MultiheadAttention", f"for {label} the output has shape {list(got.shape)}, "
                                                               f"not {list(want.shape)}")
            diff = (got - want).abs().max().item()
            raise _stage(6, "torch.nn.MultiheadAttention", f"for {label} your output differs from torch's by up to "
                                                           f"{diff:.2g} (allowed: 1e-5); is some step computed in "
                                                           "lower precision, or with an approximation?")


register(Exercise(
    "02", 4, "the whole multi-head attention",
    _check_mha,
    hint=["Project: Q = x @ W_Q.T (and K, V). Split: view [B, T, H, d_k], transpose to [B, H, T, d_k].",
          "Scores Q Kᵀ / sqrt(d_k), -inf where key j > query i, softmax over the keys, times V; then transpose back, "
          "reshape to [B, T, d_model] and project with W_O.T."],
    solution=(
        "def multi_head_attention(x, W_Q, W_K, W_V, W_O, n_heads):\n"
        "    B, T, D = x.shape\n"
        "    d_k = D // n_heads\n"
        "    def split(t):                                            # [B, T, D] -> [B, H, T, d_k]\n"
        "        return t.view(B, T, n_heads, d_k).transpose(1, 2)\n"
        "    Q, K, V = split(x @ W_Q.T), split(x @ W_K.T), split(x @ W_V.T)\n"
        "    scores = Q @ K.transpose(-2, -1) / d_k ** 0.5             # [B, H, T, T]\n"
        "    allowed = torch.ones(T, T, dtype=torch.bool).tril()      # query i sees keys j <= i\n"
        "    weights = scores.masked_fill(~allowed, float('-inf')).softmax(dim=-1)\n"
        "    heads = weights @ V                                      # [B, H, T, d_k]\n"
        "    merged = heads.transpose(1, 2).reshape(B, T, D)          # [B, T, D]\n"
        "    return merged @ W_O.T"
    ),
    points=3,  # a whole module, in six stages
    minutes=30, difficulty=3, importance=5,
))
