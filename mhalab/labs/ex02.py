"""Exercises of notebook 02 (how the split works): what a head holds after a reshape without its transpose,
relabelling the heads without changing the layer, a sliding-window mask, and the whole multi-head attention."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, consistent_mistake, expect_shape, first_match, only_output, unseparated
from .verdicts import Wrong

# ------------------------------------------------------------------------------------ exercise 1
# The reshape bug: x [B, T, D] viewed straight as [B, h, T, d_k]. A case is (n_heads, T, d_k, head, position).
_HOLD_CASES = [(3, 5, 2, 1, 3), (4, 3, 2, 2, 1), (2, 6, 3, 1, 5), (1, 4, 5, 0, 2), (5, 2, 1, 4, 1), (3, 3, 2, 2, 2),
               (2, 7, 4, 0, 6), (6, 4, 3, 5, 0), (4, 1, 3, 3, 0), (3, 4, 2, 0, 3)]


def _from_offsets(offsets, row: int) -> tuple[tuple[int, int], ...]:
    """The (token, feature) pairs of x [T, row] that the memory offsets ``offsets`` hold."""
    return tuple((o // row, o % row) for o in offsets)


def _holds(h: int, T: int, dk: int, head: int, pos: int) -> tuple[tuple[int, int], ...]:
    """The checker's own reading (the answer is the solution's): slot [head, pos] of the view is d_k numbers at
    offset (head·T + pos)·d_k of x's memory, where a token is a row of d_model = h·d_k numbers."""
    return _from_offsets(((head * T + pos) * dk + f for f in range(dk)), h * dk)


def _hold_mistakes(h: int, T: int, dk: int, head: int, pos: int) -> dict[str, tuple]:
    """{message: the pairs that reading gives} for one case."""
    D, fs = h * dk, range(dk)
    return {
        "that is where the right split (view as [B, T, h, d_k], then transpose) puts head `head`'s slice of token "
        "`position`; a view straight to [B, h, T, d_k] moves no number: it reads the queries' memory, row after "
        "row, in the new shape": tuple((pos, head * dk + f) for f in fs),
        "that reads the view as if tokens and heads swapped places (token = head); a view only re-reads memory in "
        "order: count how many numbers come before the slot": tuple((head, pos * dk + f) for f in fs),
        "in [B, h, T, d_k] one step along the head axis skips a whole head's T·d_k numbers, not T":
            _from_offsets((head * T + pos * dk + f for f in fs), D),
        "in [B, h, T, d_k] one step along the head axis skips a whole head's T·d_k numbers, not d_model":
            _from_offsets((head * D + pos * dk + f for f in fs), D),
        "in [B, h, T, d_k] one step along the position axis skips d_k numbers, not d_model":
            _from_offsets((head * T * dk + pos * D + f for f in fs), D),
        "a token of the queries is a row of d_model = n_heads·d_k numbers, not d_k: the token is offset // d_model "
        "and the feature offset % d_model": _from_offsets(((head * T + pos) * dk + f for f in fs), dk),
    }


def _same_pairs(a, b) -> bool:
    return tuple(map(tuple, a)) == tuple(map(tuple, b))


def _hold_cases(check: Check) -> list[tuple[int, int, int, int, int]]:
    """The fixed cases; when grading, three drawn fresh as well (redrawn until every reading is told apart)."""
    cases = list(_HOLD_CASES)
    if not check.grading:
        return cases
    for attempt in range(20):
        r = check.rng(10 + 1000 * attempt)
        drawn = []
        for _ in range(3):
            h, T, dk = r.randint(2, 6), r.randint(2, 8), r.randint(1, 5)
            drawn.append((h, T, dk, r.randrange(h), r.randrange(T)))
        every = cases + drawn
        if not unseparated([_holds(*c) for c in every], [_hold_mistakes(*c) for c in every], _same_pairs):
            break
    return cases + drawn


def _pairs_of(value, dk: int) -> tuple[tuple[int, int], ...] | None:
    """``value`` as d_k (token, feature) pairs of whole numbers (a list of pairs, of tensors or arrays of two, an
    array or a tensor [d_k, 2]), else None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if tuple(value.shape) != (dk, 2) or value.dtype in (torch.bool, np.bool_):
            return None
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) != dk:
        return None
    out = []
    for pair in value:
        if isinstance(pair, (torch.Tensor, np.ndarray)) and tuple(pair.shape) == (2,):  # list(t) of a [d_k, 2] t
            pair = list(pair)
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            return None
        numbers = []
        for n in pair:
            if isinstance(n, (torch.Tensor, np.ndarray)) and n.ndim == 0:
                n = n.item()
            if isinstance(n, bool) or not isinstance(n, (int, float, np.integer)) or not float(n).is_integer():
                return None
            numbers.append(int(n))
        out.append(tuple(numbers))
    return tuple(out)


def _label(h: int, T: int, dk: int, head: int, pos: int) -> str:
    return f"n_heads={h}, T={T}, d_k={dk}, head={head}, position={pos}"


def _check_holds(what_head_holds, check: Check) -> None:
    cases, got = _hold_cases(check), []
    for case in cases:
        value = check.call(what_head_holds, *case, label=_label(*case))
        pairs = _pairs_of(value, case[2])
        if pairs is None:
            raise Wrong(f"for {_label(*case)}: return the slot's d_k = {case[2]} numbers as a list of (token, "
                        f"feature) pairs of whole numbers, in order, got {check.last_call[1]}")
        got.append(pairs)
    wants = [_pairs_of(check.reference(*c), c[2]) for c in cases]
    if got == wants:
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    message = consistent_mistake(got, wants, [_hold_mistakes(*c) for c in cases], _same_pairs)
    raise Wrong(f"for {_label(*cases[bad])} the slot does not hold {list(got[bad])}: " + (
        message or "x [B, T, d_model] is stored token after token, d_model numbers each; the view [B, h, T, d_k] "
                   "reads the same numbers in order, d_k at a time. Count how many numbers come before the slot"))


register(Exercise(
    "02", 1, "the reshape bug",
    _check_holds,
    hint=["A view never moves a number: the queries and the view share one row of memory (per sequence), read in "
          "order. In the view, how many numbers come before slot [head, position]? (Each head is a [T, d_k] block.)",
          "Slot [head, position] starts at offset (head·T + position)·d_k. In the queries [B, T, d_model], offset o "
          "is token o // d_model, feature o % d_model."],
    solution=(
        "def what_head_holds(n_heads, T, d_k, head, position):\n"
        "    d_model = n_heads * d_k\n"
        "    start = (head * T + position) * d_k        # numbers before the slot, in memory\n"
        "    return [((start + f) // d_model, (start + f) % d_model) for f in range(d_k)]"
    ),
    minutes=15, difficulty=3, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 2
# Relabel the heads: (d_model, n_heads, order). Orders that are their own inverse cannot tell a learner who moved the
# heads the other way, so most are not.
_RELABEL_CASES = [(12, 3, (1, 2, 0)), (16, 4, (2, 0, 3, 1)), (6, 2, (1, 0)), (10, 5, (4, 2, 0, 1, 3)), (8, 1, (0,)),
                  (12, 4, (3, 2, 0, 1)), (18, 6, (5, 0, 1, 2, 3, 4))]


def _relabel_cases(check: Check) -> list[tuple[int, int, tuple[int, ...]]]:
    cases = list(_RELABEL_CASES)
    if check.grading:
        r = check.rng(30)
        for _ in range(2):
            h = r.randint(3, 6)
            order = list(range(h))
            while [order[i] for i in order] == list(range(h)):  # not its own inverse
                r.shuffle(order)
            cases.append((h * r.randint(1, 4), h, tuple(order)))
    return cases


def _rows(order, dk: int) -> Tensor:
    """The feature indices of the heads in ``order``, block after block."""
    return torch.cat([torch.arange(i * dk, (i + 1) * dk) for i in order])


def _relabelled(W_Q, W_K, W_V, W_O, order, dk, *, inverse=False, o_side="columns", qkv_side="rows", move_v=True,
                move_qk=True) -> tuple[Tensor, ...]:
    """The four weights after relabelling, with the plausible mistakes as options."""
    if inverse:
        order = torch.argsort(torch.tensor(order)).tolist()
    idx = _rows(order, dk)
    take = {"rows": lambda W: W[idx], "columns": lambda W: W[:, idx], "none": lambda W: W}
    Q, K = (take[qkv_side](W) if move_qk else W for W in (W_Q, W_K))
    return Q, K, take[qkv_side](W_V) if move_v else W_V, take[o_side](W_O)


def _relabel_mistakes(W, order, dk) -> dict[str, tuple[Tensor, ...]]:
    return {
        "you moved the heads the other way: new head p must be old head order[p], so block p of the new weights is "
        "block order[p] of the old ones (you put block p at place order[p])": _relabelled(*W, order, dk, inverse=True),
        "W_O is [d_model, h·d_k] ([out, in], as nn.Linear keeps it): the concatenated heads are its input, so a "
        "head's block of W_O is d_k columns, not rows": _relabelled(*W, order, dk, o_side="rows"),
        "W_O must move with the heads: block p of the concatenation is now old head order[p]'s output, so W_O's "
        "block p must be what multiplied it before": _relabelled(*W, order, dk, o_side="none"),
        "W_Q, W_K and W_V are [out, in] (as nn.Linear keeps them): a head's queries, keys and values are d_k "
        "outputs, so its block is d_k rows, not columns": _relabelled(*W, order, dk, qkv_side="columns"),
        "the values must move with their head too: new head p must read old head order[p]'s values":
            _relabelled(*W, order, dk, move_v=False),
        "the queries and keys must move with their head too: new head p must attend as old head order[p] did":
            _relabelled(*W, order, dk, move_qk=False),
        "W_O moved the other way from the heads: its block p must be old block order[p], as for W_Q, W_K, W_V":
            _relabelled(*_relabelled(*W, order, dk, o_side="none"), order, dk, inverse=True, qkv_side="none"),
        "the heads' own projections must move too: new head p's queries, keys and values are old head "
        "order[p]'s": _relabelled(*W, order, dk, qkv_side="none"),
    }


def _heads(x, W_Q, W_K, W_V, W_O, n_heads) -> tuple[Tensor, Tensor]:
    """Each head's causal attention pattern [B, H, T, T] and its write into the output [B, H, T, D] (float64)."""
    x, W_Q, W_K, W_V, W_O = (t.double() for t in (x, W_Q, W_K, W_V, W_O))
    B, T, D = x.shape
    dk = W_Q.size(0) // n_heads
    q, k, v = (t.view(B, T, n_heads, dk).transpose(1, 2) for t in (x @ W_Q.T, x @ W_K.T, x @ W_V.T))
    forbidden = ~torch.ones(T, T, dtype=torch.bool).tril()
    pattern = (q @ k.transpose(-2, -1) / dk**0.5).masked_fill(forbidden, float("-inf")).softmax(-1)
    blocks = W_O.T.reshape(n_heads, dk, W_O.size(0))                                    # [H, dk, D]
    return pattern, torch.einsum("bhtk,hkd->bhtd", pattern @ v, blocks)


def _check_relabel(relabel_heads, check: Check) -> None:
    g = check.generator(31)
    for D, H, order in _relabel_cases(check):
        dk, case = D // H, f"d_model={D}, n_heads={H}, order={list(order)}"
        W = _weights(check, D, 40 + H)
        result = check.call(relabel_heads, *W, H, list(order), label=f"the four weights, {case}")
        if not isinstance(result, (tuple, list)) or len(result) != 4:
            raise Wrong(f"for {case}: return the four new weights (W_Q, W_K, W_V, W_O), got {check.last_call[1]}")
        got = tuple(as_float64(w, f"new weight {i} for {case}") for i, w in enumerate(result))
        for name, w in zip(("W_Q", "W_K", "W_V", "W_O"), got):
            expect_shape(w, (D, D), f"the new {name} for {case}")
        x = torch.randn(2, 5, D, generator=g)
        pattern, writes = _heads(x, *W, H)
        new_pattern, new_writes = _heads(x, *got, H)
        idx = torch.tensor(order)
        if (torch.allclose(new_pattern, pattern[:, idx], rtol=1e-4, atol=1e-6)
                and torch.allclose(new_writes, writes[:, idx], rtol=1e-4, atol=1e-6)):
            continue
        mistake = first_match(torch.cat(got), {m: torch.cat(ws).double()
                                               for m, ws in _relabel_mistakes(W, order, dk).items()})
        if mistake:
            raise Wrong(f"for {case}: {mistake}")
        same = torch.allclose(new_writes.sum(1), writes.sum(1), rtol=1e-4, atol=1e-6)
        raise Wrong(f"for {case}: " + (
            "the layer computes what it did, but new head p is not old head order[p]: its attention pattern or its "
            "write differs" if same else
            "the layer's output changed: relabelling the heads must leave it as it was, every new head p doing "
            "exactly what old head order[p] did"))


register(Exercise(
    "02", 2, "relabel the heads",
    _check_relabel,
    hint=["Which rows or columns of each weight belong to head i? W_Q, W_K, W_V map the token to the heads' "
          "features (their output side); W_O maps the concatenated heads back (its input side). nn.Linear keeps a "
          "weight as [out, in].",
          "Build the indices of the heads' features in the new order, torch.cat of arange(i·d_k, (i+1)·d_k) for i "
          "in order; take those rows of W_Q, W_K, W_V and those columns of W_O."],
    solution=(
        "def relabel_heads(W_Q, W_K, W_V, W_O, n_heads, order):\n"
        "    d_k = W_Q.size(0) // n_heads\n"
        "    idx = torch.cat([torch.arange(i * d_k, (i + 1) * d_k) for i in order])  # old features, new order\n"
        "    return W_Q[idx], W_K[idx], W_V[idx], W_O[:, idx]   # a head owns rows of W_Q/K/V, columns of W_O"
    ),
    minutes=15, difficulty=3, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 3
# A sliding-window causal mask: (T, window), with windows of 1, windows as long as T and longer, and off-by-ones.
_WINDOW_CASES = [(6, 3), (5, 1), (4, 4), (4, 9), (7, 2), (1, 1), (8, 7), (3, 2), (9, 4)]


def _band(T: int, low: int, high: int) -> Tensor:
    """[T, T] bool: True where low <= i - j <= high (query i, key j)."""
    offset = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    return (offset >= low) & (offset <= high)


def _window_mistakes(T: int, w: int) -> dict[str, Tensor]:
    right = _band(T, 0, w - 1)
    return {
        "the mask is inverted: True must mean 'may attend' (as causal_allowed_mask)": ~right,
        "the mask is transposed: row i is query i, column j key j, and query i may see only keys j <= i":
            right.T.clone(),
        "that is the causal mask: the window must hide keys more than window - 1 positions back too":
            _band(T, 0, T),
        "each query sees window + 1 keys: itself and the window - 1 keys before it make window in all":
            _band(T, 0, w),
        "each query sees window - 1 keys: itself and the window - 1 keys before it make window in all":
            _band(T, 0, w - 2),
        "each query must see itself (i - j = 0) and the window - 1 keys before it": _band(T, 1, w),
        "each query may not see later keys: a sliding-window mask is causal too":
            _band(T, -(w - 1), w - 1),
    }


def _window_cases(check: Check) -> list[tuple[int, int]]:
    cases = list(_WINDOW_CASES)
    if check.grading:
        r = check.rng(50)
        cases += [(T, r.randint(1, T + 2)) for T in (r.randint(2, 12), r.randint(2, 12))]
    return cases


def _mask_of(value) -> Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        return torch.from_numpy(np.array(value))
    except (TypeError, ValueError):
        return None


def _check_window(sliding_window_allowed, check: Check) -> None:
    cases, got = _window_cases(check), []
    for T, w in cases:
        case = f"T={T}, window={w}"
        mask = _mask_of(check.call(sliding_window_allowed, T, w, label=case))
        if mask is None or mask.dtype != torch.bool:
            raise Wrong(f"for {case}: return a boolean [T, T] tensor, True where query i may see key j, got "
                        f"{check.last_call[1]}")
        expect_shape(mask, (T, T), f"the mask for {case}")
        got.append(mask)
    wants = [check.reference(T, w) for T, w in cases]
    bad = next((i for i, (g, m) in enumerate(zip(got, wants)) if not torch.equal(g, m)), None)
    if bad is None:
        return
    message = consistent_mistake(got, wants, [_window_mistakes(*c) for c in cases], torch.equal)
    T, w = cases[bad]
    wrong = got[bad] != wants[bad]
    raise Wrong(f"for T={T}, window={w}: {int(wrong.sum())} of {T * T} entries are wrong (the first at query "
                f"{wrong.nonzero()[0, 0].item()}, key {wrong.nonzero()[0, 1].item()}): " + (
                    message or "query i may see key j when j <= i and i - j < window, whatever T"))


register(Exercise(
    "02", 3, "a sliding-window mask",
    _check_window,
    hint="Work with the offset i - j of query i and key j (torch.arange(T)[:, None] - torch.arange(T)): which "
         "offsets may a query see? Check window = 1 (only itself) and a window longer than the sequence.",
    solution=(
        "def sliding_window_allowed(T, window):\n"
        "    offset = torch.arange(T)[:, None] - torch.arange(T)[None, :]   # [T, T]: i - j\n"
        "    return (offset >= 0) & (offset < window)                        # itself and window - 1 before it"
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


# The exercise is the split, the mask and the merge: a multi-head attention module may not do them for the answer
# (one attention per head, such as F.scaled_dot_product_attention, may run).
_FORBID = ("torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward",
           "mhalab.attention.MultiHeadAttention")


def _run(check: Check, fn, x, weights, H, label):
    result = check.call(fn, x, *weights, H, label=label, forbid=_FORBID)
    name = f"what multi_head_attention({label}) returned"
    return as_float64(only_output(result, name), name)


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
    minutes=30, difficulty=4, importance=5,
))
