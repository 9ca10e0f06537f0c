"""Answers to the exercises of notebooks 08 and 09 written from their prompts alone (issue 30), in the styles
learners write: loops, masks, NumPy, the cache read by short name (``cache["pattern", i]``, as notebook 07
teaches) or by full name, hooks by name, by predicate or by plain torch hooks. Hooks are ``fn(act, hook)`` and
point names are exact or predicates, so they run with positional and keyword hook calls alike.
labs_corpus.py adds them to its CORPUS: RIGHT must pass, WRONG must fail with the message given.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
import torch.nn.functional as F


# ------------------------------------------------------------------------------------ 08.1
def p_by_permuted_matrix(similarity):  # every re-paired matrix built, its whole gap compared
    import itertools

    n = similarity.shape[0]

    def gap(S):
        off = ~torch.eye(n, dtype=torch.bool)
        return S.diagonal().mean() - (S[off].mean() if n > 1 else 0)

    true_gap = gap(similarity)
    count = total = 0
    for perm in itertools.permutations(range(n)):
        total += 1
        if gap(similarity[:, list(perm)]) >= true_gap:
            count += 1
    return count / total


def p_python_lists(similarity):  # plain Python numbers, the matched sum of each re-pairing
    from itertools import permutations

    S = similarity.tolist()
    n = len(S)
    true = sum(S[i][i] for i in range(n))
    hits = [sum(S[i][p[i]] for i in range(n)) >= true for p in permutations(range(n))]
    return sum(hits) / len(hits)


def p_as_tensor(similarity):  # every permutation at once, a 0-d tensor back
    import itertools

    n = similarity.shape[0]
    perms = torch.tensor(list(itertools.permutations(range(n))))  # [n!, n]
    matched = similarity[torch.arange(n), perms].mean(-1)  # [n!]
    return (matched >= similarity.diagonal().mean()).double().mean()


def p_gap_formula_floats(similarity):  # the gap in Python floats: one pair divides by zero
    import itertools

    n = similarity.shape[0]
    total = float(similarity.sum())

    def gap(matched):
        return matched / n - (total - matched) / (n * n - n)

    true = gap(float(similarity.trace()))
    perms = list(itertools.permutations(range(n)))
    return sum(gap(float(similarity[range(n), list(p)].sum())) >= true for p in perms) / len(perms)


# ------------------------------------------------------------------------------------ 08.2
def share_per_head_loop(pattern, values_out, keys):  # head by head, the norms as [B, T]
    B, H, T, _ = pattern.shape
    queries = [q for q in range(T) if q not in keys]
    out = torch.zeros(H)
    for h in range(H):
        norms = values_out[:, :, h, :].norm(dim=-1)       # [B, T]
        contrib = pattern[:, h] * norms[:, None, :]        # [B, T, T]
        ratio = contrib[:, :, keys].sum(-1) / contrib.sum(-1)
        out[h] = ratio[:, queries].mean()
    return out


def share_transpose_mask(pattern, values_out, keys):  # values_out turned to [B, H, T, D] first
    f = values_out.transpose(1, 2)
    w = pattern * torch.linalg.vector_norm(f, dim=-1).unsqueeze(-2)
    mask = torch.zeros(pattern.shape[-1], dtype=torch.bool)
    mask[keys] = True
    return (w[..., mask].sum(-1) / w.sum(-1))[:, :, ~mask].mean(-1).mean(0)


def share_from_weighted_norms(pattern, values_out, keys):  # every ||a f(x)|| vector norm, as in the paper
    weighted = pattern.unsqueeze(-1) * values_out.permute(0, 2, 1, 3).unsqueeze(2)   # [B, H, T, T, D]
    norms = weighted.norm(dim=-1)                                                     # [B, H, T, T]
    per_query = norms[..., keys].sum(-1) / norms.sum(-1)
    rest = [i for i in range(pattern.shape[2]) if i not in set(keys)]
    return per_query[:, :, rest].mean(dim=2).mean(dim=0)


# ------------------------------------------------------------------------------------ 08.3
def offset_dict_of_means(pattern, max_offset):  # a dict {k: [H] means}, read back in the tie order
    inner = pattern[:, :, 1:-1, 1:-1]
    L = inner.shape[-1]
    means = {}
    for d in range(1, max_offset + 1):
        for k in (-d, d):
            if d < L:
                means[k] = inner.diagonal(offset=k, dim1=2, dim2=3).mean(dim=(0, 2))
    offsets, best = [], []
    for h in range(pattern.shape[1]):
        k_best = max(means, key=lambda k: means[k][h])  # max keeps the first of equals: the dict's order
        offsets.append(k_best)
        best.append(float(means[k_best][h]))
    return torch.tensor(offsets), torch.tensor(best)


def offset_query_loop(pattern, max_offset):  # every (query, key) pair by hand, plain Python
    B, H, T, _ = pattern.shape
    result_k, result_m = [], []
    for h in range(H):
        best_k, best_m = None, None
        for d in range(1, max_offset + 1):
            for k in (-d, d):
                vals = [float(pattern[b, h, q, q + k]) for b in range(B) for q in range(1, T - 1)
                        if 1 <= q + k <= T - 2]
                if vals and (best_m is None or sum(vals) / len(vals) > best_m):
                    best_k, best_m = k, sum(vals) / len(vals)
        result_k.append(best_k)
        result_m.append(best_m)
    return result_k, result_m


def offset_band_masks(pattern, max_offset):  # a band mask per offset, [CLS] and [SEP] masked out of it
    T = pattern.shape[-1]
    real = torch.zeros(T, dtype=torch.bool)
    real[1:-1] = True
    candidates, scores = [], []
    for d in range(1, max_offset + 1):
        for k in (-d, d):
            band = torch.diag(torch.ones(T - d), diagonal=k).bool() & real[:, None] & real[None, :]
            if band.sum() == 0:
                continue
            candidates.append(k)
            scores.append((pattern * band).sum(dim=(-2, -1)).mean(0) / band.sum())  # [H]
    scores = torch.stack(scores)  # [candidates, H]
    return torch.tensor(candidates)[scores.argmax(0)], scores.max(0).values


def offset_counting_missing_as_zero(pattern, max_offset):  # each diagonal padded with zeros to L entries
    inner = pattern[..., 1:-1, 1:-1]
    L = inner.shape[-1]
    order = [k for d in range(1, min(max_offset, L - 1) + 1) for k in (-d, d)]
    means = torch.stack([F.pad(inner.diagonal(k, -2, -1), (0, abs(k))).mean(dim=(0, 2)) for k in order])
    return torch.tensor(order)[means.argmax(0)], means.max(0).values


# ------------------------------------------------------------------------------------ 09.1
def fit_divisors_descending(config, seq_len, batch, memory_bytes, bytes_per_value):  # the divisors listed first
    divisors = [g for g in range(1, config.n_heads + 1) if config.n_heads % g == 0]
    one_head = 2 * config.d_head * bytes_per_value * config.n_layers * seq_len * batch
    for g in reversed(divisors):
        if g * one_head <= memory_bytes:
            return g
    return 0


def fit_while(config, seq_len, batch, memory_bytes, bytes_per_value):  # bytes per token first, then a while loop
    per_token = 2 * config.n_layers * config.d_head * bytes_per_value   # one K/V head, every layer
    g = config.n_heads
    while g > 0 and (config.n_heads % g or g * per_token * seq_len * batch > memory_bytes):
        g -= 1
    return g


def fit_room_first(config, seq_len, batch, memory_bytes, bytes_per_value):  # how many fit, then the divisor below
    room = memory_bytes // (2 * config.d_head * config.n_layers * seq_len * batch * bytes_per_value)
    room = min(room, config.n_heads)
    while room > 0 and config.n_heads % room != 0:
        room -= 1
    return room


# ------------------------------------------------------------------------------------ 09.2
def targets_reversed_list(tokens):  # the earlier tokens as a list, searched from the end
    ids = tokens.tolist()
    out = []
    for i in range(len(ids)):
        earlier = ids[:max(i - 1, 0)]  # p + 1 < i
        out.append(len(earlier) - earlier[::-1].index(ids[i]) if ids[i] in earlier else -1)
    return out


def targets_positions_dict(tokens):  # every token's positions so far
    seen, out = {}, []
    for i, t in enumerate(tokens.tolist()):
        ps = [p for p in seen.get(t, []) if p + 1 < i]
        out.append(ps[-1] + 1 if ps else -1)
        seen.setdefault(t, []).append(i)
    return out


def targets_nonzero(tokens):  # torch: the matches before i - 1, a tensor back
    out = torch.full((len(tokens),), -1)
    for i in range(2, len(tokens)):
        hits = (tokens[:i - 1] == tokens[i]).nonzero()
        if len(hits):
            out[i] = hits[-1, 0] + 1
    return out


def _targets_last_seen(tokens):  # the last position seen: its follower may be the query itself
    last, out = {}, []
    for i, t in enumerate(tokens.tolist()):
        out.append(last[t] + 1 if t in last else -1)
        last[t] = i
    return out


# ------------------------------------------------------------------------------------ 09.3
def _nll_second_copy(logits, tokens, L):
    return F.cross_entropy(logits[:, L:-1].reshape(-1, logits.shape[-1]), tokens[:, L + 1:].reshape(-1)).item()


def second_copy_per_layer(model, tokens, heads, L):  # one hook per layer, exact names, hooks_attached
    from mhalab.hooks import hooks_attached

    def off(hs):
        def fn(z, hook):
            z = z.clone()
            z[:, :, hs] = 0
            return z
        return fn

    layers = {}
    for layer, head in heads:
        layers.setdefault(layer, []).append(head)
    with torch.no_grad(), hooks_attached(model, [(f"blocks.{l}.attn.hook_z", off(hs)) for l, hs in layers.items()]):
        logits = model(tokens)
    return _nll_second_copy(logits, tokens, L)


def second_copy_predicate(model, tokens, heads, L):  # one hook chosen by a predicate, the layer from hook.name
    def fn(z, hook):
        layer = int(hook.name.split(".")[1])
        keep = torch.ones(z.shape[2])
        for l, h in heads:
            if l == layer:
                keep[h] = 0.0
        return z * keep[None, None, :, None]

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), fn)])
    logp = logits.log_softmax(-1)[:, L:-1]  # [B, L, V]: the predictions of the second copy
    return -logp.gather(-1, tokens[:, L + 1:, None]).mean()


def second_copy_with_cache(model, tokens, heads, L):  # hooks around run_with_cache, a list of exact names cached
    def fn(z, hook):
        z = z.clone()
        z[:, :, [h for l, h in heads if f"blocks.{l}.attn.hook_z" == hook.name]] = 0.0
        return z

    names = [f"blocks.{l}.attn.hook_z" for l in sorted({l for l, _ in heads})]
    with model.hooks(fwd_hooks=[(name, fn) for name in names]):
        logits, _ = model.run_with_cache(tokens, names_filter=names)
    return _nll_second_copy(logits, tokens, L)


# The mistakes learners made (issue 30): each passed before, or got a message that did not help.
def _hooked(model, tokens, heads, point, index):
    def fn(act, hook):
        act = act.clone()
        act[:, :, [index(h) for l, h in heads if hook.name == f"blocks.{l}.attn.hook_{point}"]] = 0.0
        return act

    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith(f"attn.hook_{point}"), fn)])


def second_copy_zeroing_v(model, tokens, heads, L):  # hook_v at the query head's index
    return _nll_second_copy(_hooked(model, tokens, heads, "v", lambda h: h), tokens, L)


def second_copy_zeroing_v_group(model, tokens, heads, L):  # hook_v at the head's K/V group: its whole group off
    per_group = model.config.n_heads // model.config.n_key_value_heads
    return _nll_second_copy(_hooked(model, tokens, heads, "v", lambda h: h // per_group), tokens, L)


def second_copy_one_digit_layer(model, tokens, heads, L):  # the layer read as one character of the name
    def fn(z, hook):
        z = z.clone()
        z[:, :, [h for l, h in heads if l == int(hook.name[7])]] = 0.0
        return z

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), fn)])
    return _nll_second_copy(logits, tokens, L)


def second_copy_unshifted(model, tokens, heads, L):  # logits at p scored against token p, on the second copy
    logits = _hooked(model, tokens, heads, "z", lambda h: h)
    return F.cross_entropy(logits[:, L + 1:].flatten(0, 1), tokens[:, L + 1:].flatten()).item()


def second_copy_unshifted_from_L(model, tokens, heads, L):  # logits at p scored against token p, p = L .. 2L-1
    logits = _hooked(model, tokens, heads, "z", lambda h: h)
    return F.cross_entropy(logits[:, L:-1].flatten(0, 1), tokens[:, L:-1].flatten()).item()


def second_copy_starting_late(model, tokens, heads, L):  # the second copy's first token left out
    logits = _hooked(model, tokens, heads, "z", lambda h: h)
    return F.cross_entropy(logits[:, L + 1:-1].flatten(0, 1), tokens[:, L + 2:].flatten()).item()


RIGHT = {
    "08.1": [p_by_permuted_matrix, p_python_lists, p_as_tensor],
    "08.2": [share_per_head_loop, share_transpose_mask, share_from_weighted_norms],
    "08.3": [offset_dict_of_means, offset_query_loop, offset_band_masks],
    "09.1": [fit_divisors_descending, fit_while, fit_room_first],
    "09.2": [targets_reversed_list, targets_positions_dict, targets_nonzero],
    "09.3": [second_copy_per_layer, second_copy_predicate, second_copy_with_cache],
}

WRONG = {
    "08.1": [
        (p_gap_formula_floats, "one pairing, the true one"),  # ZeroDivisionError on one pair, after the others
    ],
    "08.3": [
        (offset_counting_missing_as_zero, "a query without a key at offset k"),
    ],
    "09.1": [
        # how many fit, capped at n_heads, but not a divisor
        (lambda config, seq_len, batch, memory_bytes, bytes_per_value: min(
            memory_bytes // (2 * config.d_head * config.n_layers * seq_len * batch * bytes_per_value),
            config.n_heads), "must divide n_heads"),
    ],
    "09.2": [
        (_targets_last_seen, "the target must come before the query"),
    ],
    "09.3": [
        (second_copy_zeroing_v, "hook_v holds the 2 K/V heads"),  # (IndexError for a head >= 2, else named)
        (second_copy_zeroing_v_group, "switches off all 3 query heads that share it"),
        (second_copy_one_digit_layer, "the layer has two digits"),
        (second_copy_unshifted, "against the token at that same position"),
        (second_copy_unshifted_from_L, "positions L .. 2L-1 against the tokens at those same positions"),
        (second_copy_starting_late, "leaves out the second copy's first token"),
    ],
}


# Whole answer cells written from the prompts (tests/labs_cells.py): each one's function is a right answer too.
from labs_cells import CELLS  # noqa: E402


def _cell_function(source: str):
    """The function an answer cell defines (its check line left out)."""
    namespace = {"torch": torch, "F": F, "np": np, "math": math}
    exec(re.sub(r"^q\d\.check\(.*\)$", "", source, flags=re.M), namespace)
    return next(v for k, v in namespace.items() if callable(v) and getattr(v, "__module__", "") is None and k[0] != "_")


for _key, _cells in CELLS.items():
    RIGHT[_key] = RIGHT[_key] + [_cell_function(cell) for cell in _cells]
