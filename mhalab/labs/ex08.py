"""Exercises of notebook 08 (a real encoder), in the notebook's order: the paraphrase gap, attention with
[CLS] and [SEP] hidden and renormalised (the explorer's toggle), and a previous-token score read from a
cache of every layer.

All three run on hidden inputs: caches of random attention patterns, each an ``ActivationCache`` as
``run_with_cache`` returns it (one with 11 layers, where sorting the hook names puts ``blocks.10`` before
``blocks.2``), patterns with rows that put everything on [CLS], and
similarity matrices that are not symmetric (row i: the first sentence of pair i, column j: the second of j).
When grading, the values are drawn fresh and two more cases of other sizes are added. The prompts forbid
nothing: any helper of mhalab or torch may run.
"""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, expect_shape, judge, pattern_cache, previous_token_mistakes
from .verdicts import Wrong


def _patterns(shape, generator, causal=False, sharp=3.0) -> torch.Tensor:
    scores = torch.randn(*shape, generator=generator) * sharp
    if causal:
        T = shape[-1]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1)


# ------------------------------------------------------------------------------------ exercise 1
def _cache_cases(check: Check) -> list:
    """Caches as run_with_cache returns them: the fixed sizes, and when grading two drawn fresh (one deep enough
    that sorted names are out of order)."""
    g, r = check.generator(7), check.rng(70)
    sizes = [(3, 2, 4, 6), (11, 1, 2, 5), (1, 3, 3, 9)]
    if check.grading:
        sizes += [(r.randint(2, 6), r.randint(1, 3), r.randint(1, 6), r.randint(3, 12)),
                  (r.randint(11, 16), r.randint(1, 2), r.randint(1, 4), r.randint(3, 8))]
    cases = []
    for N, B, H, T in sizes:
        cases.append(pattern_cache([_patterns((B, H, T, T), g) for _ in range(N)]))
    return cases


def _check_prev_from_cache(previous_token_scores, check: Check) -> None:
    for cache in _cache_cases(check):
        N = len(cache)
        B, H, T, _ = next(iter(cache.values())).shape
        label = f"a cache of {N} layers, each [{B}, {H}, {T}, {T}]"
        got = check.call(previous_token_scores, cache, label=label)
        try:
            got = as_float64(got, "the result")  # a tensor, an array or nested lists of numbers
            expect_shape(got, (N, H), "the result")
        except Wrong as wrong:
            if isinstance(got, torch.Tensor) and tuple(got.shape) == (H, N):
                raise Wrong(f"previous_token_scores({label}): layers are the rows, heads the columns: [n_layers, "
                            "n_heads]") from None
            raise Wrong(f"previous_token_scores({label}): {wrong} ([n_layers, n_heads])") from None
        want = check.reference(cache)
        by_name = torch.stack([cache[k].diagonal(-1, -2, -1).mean(dim=(0, 2)) for k in sorted(cache)])
        judge(got, want, f"previous_token_scores({label})", lambda: {
            "the layers are out of order: sorting the names puts blocks.10 before blocks.2; take them by layer "
            "number (cache[f'blocks.{i}.attn.hook_pattern'] for i in range(n_layers))": by_name,
            **previous_token_mistakes(list(cache.values())),
        })


register(Exercise(
    "08", 3, "a previous-token score for every head, from a cache",
    _check_prev_from_cache,
    hint=["cache[f'blocks.{i}.attn.hook_pattern'] is layer i's attention [batch, head, query, key]. The previous "
          "token of query q is key q - 1 (queries 1 .. T-1).",
          "torch.diagonal(pattern, offset=-1, dim1=-2, dim2=-1) is [batch, head, T-1]; average it over the batch and "
          "the queries, for each layer in order, and stack the layers into [n_layers, n_heads]."],
    solution=(
        "def previous_token_scores(cache):\n"
        "    # cache: {'blocks.{i}.attn.hook_pattern': [B, H, T, T]} -> [n_layers, n_heads]\n"
        "    n_layers = len(cache)\n"
        "    rows = []\n"
        "    for i in range(n_layers):                                  # by layer number, not by sorted name\n"
        "        pattern = cache[f'blocks.{i}.attn.hook_pattern']\n"
        "        below = torch.diagonal(pattern, offset=-1, dim1=-2, dim2=-1)   # [B, H, T-1]: pattern[q, q-1]\n"
        "        rows.append(below.mean(dim=(0, 2)))                   # [H]\n"
        "    return torch.stack(rows)"
    ),
    minutes=10, difficulty=2, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 2
def _hide_cases(check: Check) -> list:
    """The fixed sizes, and when grading two drawn fresh."""
    g, r = check.generator(8), check.rng(71)
    sizes = [(2, 3, 6), (1, 2, 4), (1, 1, 7)]
    if check.grading:
        sizes += [(r.randint(1, 3), r.randint(1, 4), r.randint(4, 12)) for _ in range(2)]
    cases = []
    for B, H, T in sizes:
        pattern = _patterns((B, H, T, T), g)
        pattern[0, 0, 1] = 0.0  # a query that puts everything on [CLS] and [SEP]: nothing left to show
        pattern[0, 0, 1, 0], pattern[0, 0, 1, -1] = 0.75, 0.25
        cases.append(pattern)
    return cases


def _check_hide(hide_cls_and_sep, check: Check) -> None:
    for pattern in _hide_cases(check):
        label = f"pattern {list(pattern.shape)}"
        got = check.call(hide_cls_and_sep, pattern, label=label)
        B, H, T, _ = pattern.shape
        try:
            expect_shape(got, (B, H, T, T), "the result")
        except Wrong as wrong:
            extra = (": keep every key, with [CLS] and [SEP] set to 0, so the positions still line up"
                     if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, T, T - 2) else "")
            raise Wrong(f"hide_cls_and_sep({label}): {wrong}{extra}") from None
        if isinstance(got, torch.Tensor) and torch.isnan(got).any():
            raise Wrong(f"hide_cls_and_sep({label}): there are NaNs: a query that put all its attention on [CLS] and "
                        "[SEP] has nothing left to divide by; give such a row zeros")
        kept = pattern.double().clone()
        kept[..., [0, -1]] = 0.0
        judge(got, check.reference(pattern.double()), f"hide_cls_and_sep({label})", lambda: {
            "the rows no longer sum to 1: divide each row by what is left of it (renormalise)": kept,
            "that renormalises each column (over the queries); each row (one query's weights over the keys) should sum "
            "to 1":
                torch.nan_to_num(kept / kept.sum(-2, keepdim=True)),
            "only [CLS] (key 0) is hidden; [SEP] is the last key, -1": _only_first(pattern),
        })


def _only_first(pattern: torch.Tensor) -> torch.Tensor:
    shown = pattern.double().clone()
    shown[..., 0] = 0.0
    total = shown.sum(-1, keepdim=True)
    return torch.where(total > 0, shown / total.clamp(min=1e-300), torch.zeros_like(shown))


register(Exercise(
    "08", 2, "hide [CLS] and [SEP], renormalise the rest",
    _check_hide,
    hint=["pattern[..., q, k] is query q's weight on key k. [CLS] is key 0, [SEP] the last key (-1): set those "
          "two columns to zero.",
          "Then divide each row by its new sum (pattern.sum(-1, keepdim=True)). Where a row's sum is 0 (a query "
          "that looked only at [CLS] and [SEP]) return zeros, not NaN: torch.where helps."],
    solution=(
        "def hide_cls_and_sep(pattern):\n"
        "    # pattern: [B, H, T, T] -> the same shape, keys 0 and T-1 at 0, rows summing to 1 (or all 0)\n"
        "    shown = pattern.clone()\n"
        "    shown[..., [0, -1]] = 0.0\n"
        "    total = shown.sum(-1, keepdim=True)                # [B, H, T, 1]: what is left of each row\n"
        "    return torch.where(total > 0, shown / total.clamp(min=1e-12), torch.zeros_like(shown))"
    ),
    minutes=10, difficulty=2, importance=2,
))


# ------------------------------------------------------------------------------------ exercise 3
def _gap_cases(check: Check) -> list:
    """The fixed sizes, and when grading two drawn fresh."""
    g, r = check.generator(9), check.rng(72)
    cases = []
    for n in [4, 7, 2] + ([r.randint(2, 12) for _ in range(2)] if check.grading else []):
        a, b = torch.randn(n, 16, generator=g), torch.randn(n, 16, generator=g)
        b = b + 2 * a  # paraphrase-like: row i is close to column i
        a, b = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)
        cases.append(a @ b.T)  # [n, n], not symmetric
    return cases


def _check_gap(paraphrase_gap, check: Check) -> None:
    for S in _gap_cases(check):
        n = S.size(0)
        label = f"similarity {list(S.shape)}"
        got = check.call(paraphrase_gap, S, label=label)
        D = S.double()
        upper = D.triu(1)
        judge(got, check.reference(S.double()), f"paraphrase_gap({label})", lambda: {
            "the mismatched mean includes the true pairs (the diagonal); leave them out: n*n - n entries":
                float(D.diagonal().mean() - D.mean()),
            "the sign is flipped: matched minus mismatched": -check.reference(S.double()),
            "that uses only the entries above the diagonal; the matrix is not symmetric (row i is the first sentence "
            "of pair i, column j the second of pair j), so every off-diagonal entry is a mismatched pair":
                float(D.diagonal().mean() - upper.sum() / (n * (n - 1) / 2)),
            "that is the mean similarity of the true pairs alone; subtract the mismatched pairs' mean":
                float(D.diagonal().mean()),
        })


register(Exercise(
    "08", 1, "the paraphrase gap",
    _check_gap,
    hint="similarity[i, j] compares the first sentence of pair i with the second of pair j. The true pairs are "
         "the diagonal; every other entry (n*n - n of them) is a mismatched pair. Return one number.",
    solution=(
        "def paraphrase_gap(similarity):\n"
        "    n = similarity.shape[0]\n"
        "    matched = similarity.diagonal().mean()\n"
        "    mismatched = (similarity.sum() - similarity.diagonal().sum()) / (n * n - n)\n"
        "    return float(matched - mismatched)"
    ),
    minutes=10, difficulty=1, importance=2,
))
