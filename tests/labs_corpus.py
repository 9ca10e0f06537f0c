"""Answers to every exercise, as learners write them: alternative right answers (another dtype, container,
formulation, parameter names) that must pass, and plausible wrong ones with (part of) the message each must
produce. test_labs.py runs them all and fails for an exercise that has no entries here."""

from __future__ import annotations

import math

import numpy as np
import torch


def _tril(n, k=0):
    return torch.ones(n, n).tril(k).bool()


# ------------------------------------------------------------------------------------ 01
def attention_einsum(query, key, value):  # other parameter names, einsum
    w = torch.einsum("...ld,...sd->...ls", query, key).div(query.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("...ls,...sd->...ld", w, value)


def attention_float64(Q, K, V):
    Q, K, V = Q.double(), K.double(), V.double()
    return torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V


def attention_numpy(Q, K, V):
    q, k, v = Q.numpy(), K.numpy(), V.numpy()
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def attention_two_params(Q, K):
    return Q


def attention_quarter_roots(Q, K, V):  # another reading of the scale: Q and K each take d_k^(-1/4)
    r = Q.shape[-1] ** 0.25
    return ((Q / r) @ (K / r).transpose(-2, -1)).softmax(-1) @ V


def attention_logsumexp(Q, K, V):  # a hand-written softmax, stable by logsumexp
    s = Q @ K.mT * Q.shape[-1] ** -0.5
    return (s - s.logsumexp(-1, keepdim=True)).exp() @ V


def attention_loop(Q, K, V):  # one query at a time, batch axes flattened into one
    d, L, S = Q.shape[-1], Q.shape[-2], K.shape[-2]
    q, k, v = Q.reshape(-1, L, d), K.reshape(-1, S, d), V.reshape(-1, S, V.shape[-1])  # [N, L, d], [N, S, d], ...
    out = torch.zeros(q.shape[0], L, V.shape[-1])
    for n in range(q.shape[0]):
        for i in range(L):
            scores = torch.stack([q[n, i].dot(k[n, j]) for j in range(S)]) / math.sqrt(d)
            out[n, i] = torch.softmax(scores, 0) @ v[n]
    return out.reshape(*Q.shape[:-1], V.shape[-1])  # [..., L, d_v]


def attention_torch_fused(Q, K, V):
    return torch.nn.functional.scaled_dot_product_attention(Q, K, V)


def attention_exp_by_hand(Q, K, V):  # e^x of the raw scores: overflows when they are large
    e = (Q @ K.mT / math.sqrt(Q.shape[-1])).exp()
    return e / e.sum(-1, keepdim=True) @ V


def attention_exp_float64(Q, K, V):  # the same in float64: e^x still overflows beyond 709
    e = (Q.double() @ K.double().mT / math.sqrt(Q.shape[-1])).exp()
    return e / e.sum(-1, keepdim=True) @ V.double()


def attention_global_max(Q, K, V):  # stabilised by the largest score of the whole matrix, not of each row
    s = Q @ K.mT / math.sqrt(Q.shape[-1])
    e = (s - s.max()).exp()
    return e / e.sum(-1, keepdim=True) @ V


def attention_mm(Q, K, V):  # torch.mm and .t(): matrices only
    return torch.softmax(torch.mm(Q, K.t()) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def attention_dot_T(Q, K, V):  # K.T reverses every axis of a batched K
    return torch.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1) @ V


def attention_no_dim(Q, K, V):  # F.softmax without dim=
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nn.functional.softmax(Q @ K.mT / math.sqrt(Q.shape[-1])) @ V


def query_numpy(K, j, weight):
    S, d = K.shape
    return K[j].numpy() * np.log(weight * (S - 1) / (1 - weight)) * np.sqrt(d)


def query_float64_loop(keys, index, w):
    S, d = keys.shape
    q = torch.zeros(d, dtype=torch.float64)
    for i in range(d):
        q[i] = keys[index, i].item() * math.log(w * (S - 1) / (1 - w)) * math.sqrt(d)
    return q


# ------------------------------------------------------------------------------------ 02
def holds_numpy(n_heads, T, d_k, head, position):  # np.unravel_index on x's [T, d_model] grid: an array [d_k, 2]
    start = (head * T + position) * d_k
    return np.stack(np.unravel_index(np.arange(start, start + d_k), (T, n_heads * d_k)), axis=-1)


def holds_by_viewing(h, T, dk, head, pos):  # the other reading: do the bug on numbered memory and read it back
    D = h * dk
    x = torch.arange(T * D).view(1, T, D)
    return [divmod(int(v), D) for v in x.view(1, h, T, dk)[0, head, pos]]


def holds_loop(n_heads, T, d_k, head, position):  # a loop, a tensor [d_k, 2] back
    out = torch.zeros(d_k, 2, dtype=torch.long)
    offset = head * T * d_k + position * d_k
    for f in range(d_k):
        out[f, 0], out[f, 1] = (offset + f) // (n_heads * d_k), (offset + f) % (n_heads * d_k)
    return out


def holds_as_first_feature(n_heads, T, d_k, head, position):  # a reading of the format: (token, first feature)
    start = (head * T + position) * d_k
    return (start // (n_heads * d_k), start % (n_heads * d_k))


def relabel_loop(W_Q, W_K, W_V, W_O, n_heads, order):  # block by block
    d = W_Q.shape[0] // n_heads
    rows = [lambda W, i=i: W[i * d:(i + 1) * d] for i in order]
    return (torch.cat([r(W_Q) for r in rows]), torch.cat([r(W_K) for r in rows]), torch.cat([r(W_V) for r in rows]),
            torch.cat([W_O[:, i * d:(i + 1) * d] for i in order], dim=1))


def relabel_numpy(wq, wk, wv, wo, heads, order):  # NumPy in, NumPy float64 out, as a list
    d = wq.shape[0] // heads
    idx = np.concatenate([np.arange(i * d, (i + 1) * d) for i in order])
    return [w.double().numpy()[idx] for w in (wq, wk, wv)] + [wo.double().numpy()[:, idx]]


def relabel_by_view(W_Q, W_K, W_V, W_O, n_heads, order):  # [H, d_k, D] and [D, H, d_k] views
    D = W_Q.shape[0]
    order = torch.tensor(order)
    qkv = [W.view(n_heads, D // n_heads, -1)[order].reshape(D, -1) for W in (W_Q, W_K, W_V)]
    return (*qkv, W_O.view(D, n_heads, D // n_heads)[:, order].reshape(D, D))


def relabel_permutation_matrix(W_Q, W_K, W_V, W_O, n_heads, order):  # the other reading: P W and W_O Pᵀ
    D, d = W_Q.shape[0], W_Q.shape[0] // n_heads
    P = torch.eye(D)[torch.cat([torch.arange(i * d, (i + 1) * d) for i in order])]
    return P @ W_Q, P @ W_K, P @ W_V, W_O @ P.T


def relabel_mistaken(qkv="rows", move_v=True, move_qk=True):  # a mistake of where a head's blocks are
    def relabel(W_Q, W_K, W_V, W_O, n_heads, order):
        d = W_Q.shape[0] // n_heads
        idx = torch.cat([torch.arange(i * d, (i + 1) * d) for i in order])
        take = {"rows": lambda W: W[idx], "columns": lambda W: W[:, idx], "none": lambda W: W}[qkv]
        Q, K = (take(W) if move_qk else W for W in (W_Q, W_K))
        return Q, K, take(W_V) if move_v else W_V, W_O[:, idx]
    return relabel


def relabel_inverse(W_Q, W_K, W_V, W_O, n_heads, order):  # block p goes to place order[p]
    d = W_Q.shape[0] // n_heads
    new = [torch.empty_like(W) for W in (W_Q, W_K, W_V, W_O)]
    for p, i in enumerate(order):
        for W, N in zip((W_Q, W_K, W_V), new):
            N[i * d:(i + 1) * d] = W[p * d:(p + 1) * d]
        new[3][:, i * d:(i + 1) * d] = W_O[:, p * d:(p + 1) * d]
    return tuple(new)


def relabel_o_rows(W_Q, W_K, W_V, W_O, n_heads, order):  # W_O's rows moved, as the others'
    d = W_Q.shape[0] // n_heads
    idx = torch.cat([torch.arange(i * d, (i + 1) * d) for i in order])
    return W_Q[idx], W_K[idx], W_V[idx], W_O[idx]


def relabel_o_kept(W_Q, W_K, W_V, W_O, n_heads, order):  # only the heads' own projections moved
    d = W_Q.shape[0] // n_heads
    idx = torch.cat([torch.arange(i * d, (i + 1) * d) for i in order])
    return W_Q[idx], W_K[idx], W_V[idx], W_O


def window_tril_triu(T, window):  # ones, lower triangle, then cut the band
    return torch.ones(T, T).tril().triu(-(window - 1)).bool()


def window_numpy(T, w):  # NumPy: np.tri minus the keys too far back
    return np.tri(T, dtype=bool) & ~np.tri(T, k=-w, dtype=bool)


def window_loop(T, window):  # a loop over queries, the window clipped at the start
    allowed = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        allowed[i, max(0, i - window + 1):i + 1] = True
    return allowed


def window_from_causal(T, window):  # the other reading: mhalab's causal mask, minus the keys window or more back
    from mhalab.masks import causal_allowed_mask

    return causal_allowed_mask(T) & ~causal_allowed_mask(T).tril(-window)


def _offsets(T):
    return torch.arange(T)[:, None] - torch.arange(T)[None, :]


def mha_einsum(inputs, wq, wk, wv, wo, heads):  # other names, einsum, float64, a loop over heads
    x = inputs.double()
    B, T, D = x.shape
    d = D // heads
    outs = []
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        q, k, v = (torch.einsum("btd,ed->bte", x, w.double()[sl]) for w in (wq, wk, wv))
        s = torch.einsum("bid,bjd->bij", q, k) / math.sqrt(d)
        s = s + torch.full((T, T), float("-inf")).triu(1)
        outs.append(s.softmax(-1) @ v)
    return torch.cat(outs, -1) @ wo.double().T


def mha_numpy(x, W_Q, W_K, W_V, W_O, n_heads):
    x, W_Q, W_K, W_V, W_O = (t.double().numpy() for t in (x, W_Q, W_K, W_V, W_O))
    B, T, D = x.shape
    d = D // n_heads
    split = lambda t: t.reshape(B, T, n_heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(x @ W_Q.T), split(x @ W_K.T), split(x @ W_V.T)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + np.triu(np.full((T, T), -np.inf), 1)
    w = np.exp(s - s.max(-1, keepdims=True))
    z = (w / w.sum(-1, keepdims=True)) @ v
    return z.transpose(0, 2, 1, 3).reshape(B, T, D) @ W_O.T


def mha_mistaken(*, forbidden=None, swapped=False, over=-1, allowed_diagonal=0, fill=float("-inf")):
    """A whole multi-head attention with one natural mistake: masked_fill given ``forbidden(T)``, Q and K
    swapped, the softmax over another axis, the mask's diagonal moved (-1: a query does not see itself), a
    finite fill instead of -inf."""
    def mha(x, W_Q, W_K, W_V, W_O, n_heads):
        B, T, D = x.shape
        dk = D // n_heads
        def split(t):
            return t.view(B, T, n_heads, dk).transpose(1, 2)
        Q, K, V = split(x @ W_Q.T), split(x @ W_K.T), split(x @ W_V.T)
        if swapped:
            Q, K = K, Q
        masked = forbidden(T) if forbidden is not None else ~torch.ones(T, T, dtype=torch.bool).tril(allowed_diagonal)
        scores = (Q @ K.transpose(-2, -1) / dk**0.5).masked_fill(masked, fill)
        return (scores.softmax(over) @ V).transpose(1, 2).reshape(B, T, D) @ W_O.T
    return mha


def mha_masking(forbidden):  # a whole multi-head attention whose masked_fill gets forbidden(T)
    return mha_mistaken(forbidden=forbidden)


def mha_with_torch_module(x, W_Q, W_K, W_V, W_O, n_heads):  # 02.4 wrapped around torch's module: forbidden
    B, T, D = x.shape
    m = torch.nn.MultiheadAttention(D, n_heads, bias=False, batch_first=True).to(x.dtype)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.cat([W_Q, W_K, W_V]))
        m.out_proj.weight.copy_(W_O)
        return m(x, x, x, attn_mask=~_tril(T), need_weights=False)[0]


def mha_with_torch_functional(x, W_Q, W_K, W_V, W_O, n_heads):  # 02.4 through F's multi-head forward: forbidden
    T = x.size(1)
    out, _ = torch.nn.functional.multi_head_attention_forward(
        x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), x.size(-1), n_heads, torch.cat([W_Q, W_K, W_V]),
        None, None, None, False, 0.0, W_O, None, need_weights=False, attn_mask=~_tril(T))
    return out.transpose(0, 1)                   # [T, B, D] -> [B, T, D]


def mha_torch_sdpa(x, W_Q, W_K, W_V, W_O, n_heads):  # 02.4 with torch's scaled_dot_product_attention on the heads
    B, T, D = x.shape
    def split(t):
        return t.view(B, T, n_heads, D // n_heads).transpose(1, 2)
    z = torch.nn.functional.scaled_dot_product_attention(split(x @ W_Q.T), split(x @ W_K.T), split(x @ W_V.T),
                                                         is_causal=True)
    return z.transpose(1, 2).reshape(B, T, D) @ W_O.T


def mha_with_weights(x, W_Q, W_K, W_V, W_O, n_heads):  # 02.4 returning (output, weights) as the module does
    B, T, D = x.shape
    return mha_torch_sdpa(x, W_Q, W_K, W_V, W_O, n_heads), torch.full((B, T, T), 1.0 / T)


# Issue 22's refusals: the course's own helpers are fair where the prompt forbids nothing (02.4 forbids modules).
def mha_with_mhalab_module(x, W_Q, W_K, W_V, W_O, n_heads):  # 02.4 through mhalab.MultiHeadAttention: forbidden
    from mhalab import MultiHeadAttention

    m = MultiHeadAttention(x.size(-1), n_heads, bias=False).to(x.dtype)
    with torch.no_grad():
        m.qkv_proj.weight.copy_(torch.cat([W_Q, W_K, W_V]))
        m.out_proj.weight.copy_(W_O)
        return m(x, is_causal=True)[0]


def mha_with_mhalab_sdpa(x, W_Q, W_K, W_V, W_O, n_heads):  # 02.4 through mhalab.scaled_dot_product_attention
    from mhalab import scaled_dot_product_attention
    from mhalab.masks import causal_allowed_mask

    B, T, D = x.shape
    def split(t):
        return t.view(B, T, n_heads, D // n_heads).transpose(1, 2)
    z, _ = scaled_dot_product_attention(split(x @ W_Q.T), split(x @ W_K.T), split(x @ W_V.T),
                                        mask=causal_allowed_mask(T))
    return z.transpose(1, 2).reshape(B, T, D) @ W_O.T


def crossover_by_loop(width, heads, kv_heads=None, head_width=None):  # 04.1 by counting, T after T
    kv_heads = heads if kv_heads is None else kv_heads
    head_width = width // heads if head_width is None else head_width
    T = 1
    while heads * T * T <= 2 * kv_heads * head_width * T:   # the patterns, against K and V
        T += 1
    return T


def crossover_numpy(d_model, n_heads, n_kv_heads=None, d_head=None):  # 04.1 in float64, an np.int64 out
    g = np.float64(n_heads if n_kv_heads is None else n_kv_heads)
    d = np.float64(d_model // n_heads if d_head is None else d_head)
    return np.floor(2 * g * d / n_heads).astype(np.int64) + 1


def crossover_with_mhalab_count(d_model, n_heads, n_kv_heads=None, d_head=None):  # 04.1 with mhalab's cache count
    from mhalab.counting import kv_cache_per_token

    cache = kv_cache_per_token(d_model, n_heads, n_key_value_heads=n_kv_heads, d_head=d_head).elements
    return torch.tensor(cache // n_heads + 1)   # a 0-d tensor


def _crossover_parts(d_model, n_heads, n_kv_heads, d_head):
    return (n_heads if n_kv_heads is None else n_kv_heads), (d_model // n_heads if d_head is None else d_head)


def crossover_mistaken(kind):  # 04.1 as a learner who misreads one thing
    def answer(d_model, n_heads, n_kv_heads=None, d_head=None):
        g, d = _crossover_parts(d_model, n_heads, n_kv_heads, d_head)
        x = 2 * g * d / n_heads
        return {"ceil": lambda: math.ceil(x), "floor": lambda: math.floor(x), "round": lambda: round(x),
                "equal": lambda: x, "K only": lambda: math.floor(x / 2) + 1,
                "one head": lambda: 2 * g * d + 1, "no GQA": lambda: 2 * d + 1,
                "d_model/h": lambda: math.floor(2 * g * (d_model / n_heads) / n_heads) + 1,
                "d_model wide": lambda: math.floor(2 * g * d_model / n_heads) + 1,
                "2 d_model": lambda: 2 * d_model // n_heads + 1,
                "inverse": lambda: math.floor(2 * n_heads * d / g) + 1,
                "None is one": lambda: math.floor(2 * (1 if n_kv_heads is None else g) * d / n_heads) + 1,
                "causal half": lambda: next(T for T in range(1, 10**6)
                                            if n_heads * T * (T + 1) / 2 > 2 * g * d * T),
                "one token": lambda: math.floor(math.sqrt(2 * g * d / n_heads)) + 1}[kind]()
    return answer


def batch_with_kv_cache_per_token(config, seq_len, memory_bytes, bytes_per_value):  # 04.2 with mhalab's count
    from mhalab.counting import kv_cache_per_token

    per_token = kv_cache_per_token(config["d_model"], config["n_heads"], n_key_value_heads=config["n_key_value_heads"],
                                   d_head=config["d_head"], n_layers=config["n_layers"]).elements
    return memory_bytes // (per_token * seq_len * bytes_per_value)




def reach_sets(blocks, side, position, src_len, tgt_len):  # 03.2 with sets of positions, lists of bools out
    changed = {"source": set(), "target": set()}
    changed[side].add(position)
    for kind in blocks:
        if kind == "encoder" and changed["source"]:
            changed["source"] = set(range(src_len))
        elif kind == "decoder" and changed["target"]:
            changed["target"] |= set(range(min(changed["target"]), tgt_len))
        elif kind == "cross" and changed["source"]:
            changed["target"] = set(range(tgt_len))
    return ([i in changed["source"] for i in range(src_len)], [i in changed["target"] for i in range(tgt_len)])


def reach_numpy_any(b, s, p, S, T):  # the order does not matter: which kinds appear decides it (NumPy out)
    source, target = np.zeros(S, dtype=bool), np.zeros(T, dtype=bool)
    if s == "source":
        source[p] = True
        source[:] |= "encoder" in b
        target[:] |= "cross" in b
    else:
        target[p] = True
        if "decoder" in b:
            target[p:] = True
    return source, target


def reach_measured(blocks, side, position, src_len, tgt_len):  # 03.2 measured: edit a vector, run random blocks
    g = torch.Generator().manual_seed(0)
    D = 8
    attn = {kind: torch.nn.MultiheadAttention(D, 2, batch_first=True).double()
            for kind in ("encoder", "decoder", "cross")}
    for m in attn.values():
        for w in m.parameters():  # small weights: no softmax saturates, so whatever may change does
            w.data = 0.3 * torch.randn(w.shape, generator=g, dtype=torch.float64)

    def run(source, target):
        with torch.no_grad():
            for kind in blocks:
                if kind == "encoder":
                    source = source + attn[kind](source, source, source)[0]
                elif kind == "decoder":
                    future = torch.ones(tgt_len, tgt_len, dtype=torch.bool).triu(1)
                    target = target + attn[kind](target, target, target, attn_mask=future)[0]
                else:
                    target = target + attn[kind](target, source, source)[0]
        return source, target

    streams = (torch.randn(1, src_len, D, generator=g, dtype=torch.float64),
               torch.randn(1, tgt_len, D, generator=g, dtype=torch.float64))
    edited = [x.clone() for x in streams]
    edited[side == "target"][0, position] += 1.0
    return tuple((a != b).any(-1)[0] for a, b in zip(run(*streams), run(*edited)))


def reach_mistaken(*, encoder="all", decoder="later", cross="source", itself=True, last_only=False, swap=False):
    """03.2 as a learner who misreads one kind: what each rule does is named by its value."""
    def reach(blocks, side, position, src_len, tgt_len):
        source, target = torch.zeros(src_len, dtype=torch.bool), torch.zeros(tgt_len, dtype=torch.bool)
        if itself:
            (source if side == "source" else target)[position] = True
        edited_source, edited_target = side == "source", side == "target"
        for kind in (blocks[-1:] if last_only else blocks):
            s_any, t_any = bool(source.any()) or edited_source, bool(target.any()) or edited_target
            first = int(target.nonzero()[0]) if target.any() else position
            if kind == "encoder":
                if encoder == "all" and s_any:
                    source[:] = True
                elif encoder == "causal" and s_any:
                    source[int(source.nonzero()[0]):] = True
                elif encoder == "reads target" and (s_any or t_any):
                    source[:] = True
            elif kind == "decoder":
                if decoder == "reads source" and (s_any or source.any()):
                    target[:] = True
                if t_any:
                    last = int(target.nonzero()[-1]) if target.any() else position
                    if decoder in ("later", "reads source"):
                        target[first:] = True
                    elif decoder == "earlier":
                        target[:last + 1] = True
                    elif decoder == "all":
                        target[:] = True
                    elif decoder == "from t - 1":
                        target[max(first - 1, 0):] = True
            elif kind == "cross":
                if cross == "swapped":
                    if t_any:
                        source[:] = True
                    continue
                if s_any:
                    if cross in ("source", "target too", "target later"):
                        target[:] = True
                    elif cross == "same index":
                        target[:src_len] |= source[:tgt_len]
                    elif cross == "causal":
                        j = int(source.nonzero()[0])
                        target[j:] = True
                if t_any and edited_target and not itself:
                    target[position] = True           # its own query changed
                if t_any and cross == "target too":
                    target[:] = True
                elif t_any and cross == "target later":
                    target[first:] = True
        return (target, source) if swap else (source, target)

    return reach


# ------------------------------------------------------------------------------------ 04-03
def gqa_one_line(dm, h, kv, layers):
    return 2 * kv * dm / h * layers  # a float that is a whole number


def favourite_numpy(q, k):
    return np.where(q.numpy() > 0, int(k.argmax()), int(k.argmin()))


def favourite_loop(q, k):
    return [int(k.argmax()) if float(x) > 0 else int(k.argmin()) for x in q]




def budget_numpy_loop(drops, threshold):  # 07.3 in NumPy, one head at a time, cheapest first
    total, count = 0.0, 0
    for cost in np.sort(np.asarray(drops, dtype=np.float64).ravel()):
        if total + cost > threshold:
            break
        total, count = total + cost, count + 1
    return np.int64(count)


def budget_sorted_list(costs, budget):  # other names, plain Python, the count as a float
    removed, spent = 0, 0.0
    for c in sorted(float(x) for x in costs.flatten()):
        spent += c
        if spent <= budget:
            removed += 1
    return float(removed)


def budget_mistaken(*, alone=False, strict=False, one_more=False, order="ascending", clip=False, per_layer=False,
                    mean=False):
    """07.3 as a learner who misreads one thing; each argument names the mistake."""
    def removable_if_independent(drops, threshold):
        rows = list(drops) if per_layer else [drops.flatten()]
        total = 0
        for costs in rows:
            costs = costs.flatten().double().clamp(min=0) if clip else costs.flatten().double()
            if alone:
                return int((costs <= threshold).sum())
            costs = {"ascending": costs.sort().values, "descending": costs.sort(descending=True).values,
                     "given": costs, "size": costs[costs.abs().argsort(stable=True)]}[order]
            summed = costs.cumsum(0) / (torch.arange(1, len(costs) + 1) if mean else 1)
            within = summed < threshold if strict else summed <= threshold
            count = int(within.long().cumprod(0).sum())      # while the sum stays within
            total += min(count + 1, len(costs)) if one_more else count
        return total

    return removable_if_independent


def causal_allowed_tril(L, S):
    return torch.ones(L, S, dtype=torch.bool).tril(S - L)


def critical_path_by_steps(h, e, d):  # 03.3 step by step, as the blocks become ready (an np.int64 out)
    encoder_done, decoder_done = e, 0
    for layer in range(d):
        decoder_done += 1                                 # self-attention: the decoder stream only
        if e:
            decoder_done = max(decoder_done, encoder_done) + 1   # cross-attention: also the encoder's output
    return np.int64(max(encoder_done, decoder_done))


def critical_path_longest_chain(n_heads, encoder_layers, decoder_layers):  # 03.3 as a longest path, a float out
    waits = {}                                            # block -> the blocks it reads
    for i in range(encoder_layers):
        waits[("enc", i)] = [("enc", i - 1)] if i else []
    for i in range(decoder_layers):
        below = [("cross" if encoder_layers else "self", i - 1)] if i else []
        waits[("self", i)] = below
        if encoder_layers:
            waits[("cross", i)] = [("self", i), ("enc", encoder_layers - 1)]
    depth = {}
    for block in waits:                                   # in an order where what a block reads comes first
        depth[block] = 1 + max((depth[b] for b in waits[block]), default=0)
    return float(max(depth.values(), default=0))


def critical_path_tensor(n_heads, encoder_layers, decoder_layers):  # 03.3 as a 0-d tensor
    e, d = torch.tensor(encoder_layers), torch.tensor(decoder_layers)
    both = (e > 0) & (d > 0)
    return torch.where(both, e + 2 * d - 1, e + d)


def _blocks(e, d):
    return e + d + (d if e else 0)


# ------------------------------------------------------------------------------------ 05
def rank_numpy(d_model, d_head, query_tokens, key_tokens):  # NumPy: an np.int64 comes back
    return np.min([d_model, d_head, np.unique(query_tokens.numpy()).size, np.unique(key_tokens.numpy()).size])


def rank_tensor(width, head_width, queries, keys):  # other names, a 0-d tensor
    return torch.tensor([width, head_width, queries.unique().numel(), keys.unique().numel()]).min()


def rank_simulated(d_model, d_head, query_tokens, key_tokens):  # measure it: random embeddings and weights
    g = torch.Generator().manual_seed(0)
    E = torch.randn(int(max(query_tokens.max(), key_tokens.max())) + 1, d_model, generator=g, dtype=torch.float64)
    W_Q, W_K = (torch.randn(d_model, d_head, generator=g, dtype=torch.float64) for _ in range(2))
    return int(torch.linalg.matrix_rank((E[query_tokens] @ W_Q) @ (E[key_tokens] @ W_K).T))


def rank_loop(d_model, d_head, query_tokens, key_tokens):  # a float, counted in a loop
    seen_q, seen_k = [], []
    for t in query_tokens.tolist():
        if t not in seen_q:
            seen_q.append(t)
    for t in key_tokens.tolist():
        if t not in seen_k:
            seen_k.append(t)
    return float(min(d_model, d_head, len(seen_q), len(seen_k)))


def _weight_on_key(R, n, arc=2 * math.pi, scale=1.0, own=True):
    below = [1 - math.cos(arc * m / n) for m in range(0 if own else 1, n)]
    return 1 / sum(math.exp(-R * scale * b) for b in below)


def _bisect(weight, w):
    if weight(0.0) >= w:
        return 0.0
    lo, hi = 0.0, 1.0
    while weight(hi) < w:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if weight(mid) < w else (lo, mid)
    return hi


def radius_math(n_keys, min_weight):  # plain Python floats, a bisection
    return _bisect(lambda R: _weight_on_key(R, n_keys), min_weight)


def radius_newton_numpy(n, w):  # other names, Newton's method on log(weight), an np.float64
    below = 1 - np.cos(2 * np.pi * np.arange(n) / n)
    if 1 / n >= w:
        return np.float64(0.0)
    R = 1.0
    for _ in range(200):
        e = np.exp(-R * below)
        f = -np.log(e.sum()) - np.log(w)                  # log weight - log w, increasing in R
        df = (below * e).sum() / e.sum()
        R = max(R - f / df, R / 2)
    return R


def radius_softmax_float32(n_keys, min_weight):  # the notebook's score matrix, row 0, in float32; a 0-d tensor
    theta = 2 * math.pi * torch.arange(n_keys) / n_keys
    K = torch.stack([theta.cos(), theta.sin()], -1)        # [n, 2], float32

    def weight(R):
        return float((R * K[0] @ K.T).softmax(-1)[0])
    lo, hi = 0.0, 1.0
    if weight(0.0) >= min_weight:
        return torch.tensor(0.0)
    while weight(hi) < min_weight:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if weight(mid) < min_weight else (lo, mid)
    return torch.tensor(hi)


def radius_overflowing(n, w):  # e^R over the sum of e^(R cos): inf / inf past R ~ 709
    def weight(R):
        try:
            return math.exp(R) / sum(math.exp(R * math.cos(2 * math.pi * m / n)) for m in range(n))
        except OverflowError:
            return float("nan")
    return _bisect(weight, w)


def _circle(T, offset, omega, radius):
    a = omega * torch.arange(T, dtype=torch.float32)
    K = torch.stack([a.cos(), a.sin()], -1)
    Q = radius * torch.stack([(a - offset * omega).cos(), (a - offset * omega).sin()], -1)
    return Q, K


def look_back_full_circle_float32(seq_len, offset):  # the notebook's full circle, a radius grown with the length
    omega = 2 * math.pi / seq_len
    return _circle(seq_len, offset, omega, 3 * math.log(10 * seq_len) / (1 - math.cos(omega)))


def look_back_numpy(T, k):  # other names, NumPy, a list as the pair
    w = np.pi / T
    ang = w * np.arange(T)
    R = 40.0 * T * T
    return [R * np.stack([np.cos(ang - k * w), np.sin(ang - k * w)], 1), np.stack([np.cos(ang), np.sin(ang)], 1)]


def look_back_loop(seq_len, offset):
    Q, K = torch.zeros(seq_len, 2, dtype=torch.float64), torch.zeros(seq_len, 2, dtype=torch.float64)
    step = math.pi / (2 * seq_len)   # a quarter circle is enough too
    for j in range(seq_len):
        K[j] = torch.tensor([math.cos(step * j), math.sin(step * j)])
        Q[j] = 1e7 * torch.tensor([math.cos(step * (j - offset)), math.sin(step * (j - offset))])
    return Q, K


# ------------------------------------------------------------------------------------ 04
def batch_by_loop(cfg, tokens, memory, nbytes):  # other names: add sequences until the next one does not fit
    per_seq = 2 * cfg["n_key_value_heads"] * cfg["d_head"] * cfg["n_layers"] * tokens * nbytes
    batch = 0
    while (batch + 1) * per_seq <= memory:
        batch += 1
    return batch


def batch_numpy(config, seq_len, memory_bytes, bytes_per_value):
    per_seq = np.prod([2, config["n_layers"], config["n_key_value_heads"], config["d_head"], seq_len, bytes_per_value],
                      dtype=np.int64)
    return np.floor_divide(np.int64(memory_bytes), per_seq)


def _gqa(x, W_Q, W_K, W_V, W_O, h, g, causal=True, interleave=True, scale=True, merge=True, out=True):
    """A one-pass GQA forward written here (the learner's code, not mhalab's), with one mistake switched on."""
    B, T, _ = x.shape
    d = W_Q.size(1) // h
    q = (x @ W_Q).view(B, T, h, d).transpose(1, 2)
    k, v = ((x @ W).view(B, T, g, d).transpose(1, 2) for W in (W_K, W_V))
    k, v = ((z.repeat_interleave(h // g, 1) if interleave else z.repeat(1, h // g, 1, 1)) for z in (k, v))
    s = q @ k.mT / (math.sqrt(d) if scale else 1)
    if causal:
        s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    z = s.softmax(-1) @ v
    z = z.transpose(1, 2).reshape(B, T, -1) if merge else z.reshape(B, T, -1)
    return z @ W_O if out else z


def gqa_mistaken(*, swapped=False, over=-1, allowed_diagonal=0, fill=float("-inf"), values="repeat_interleave"):
    """A one-pass GQA forward with one more natural mistake: Q and K swapped, the softmax over another axis,
    the mask's diagonal moved (-1: a query does not see itself), the values shared by ``.repeat``."""
    def gqa(x, W_Q, W_K, W_V, W_O, n_heads, n_key_value_heads):
        B, T, _ = x.shape
        d, group = W_Q.size(1) // n_heads, n_heads // n_key_value_heads
        q = (x @ W_Q).view(B, T, n_heads, d).transpose(1, 2)
        k, v = ((x @ W).view(B, T, n_key_value_heads, d).transpose(1, 2) for W in (W_K, W_V))
        k = k.repeat_interleave(group, 1)
        v = v.repeat_interleave(group, 1) if values == "repeat_interleave" else v.repeat(1, group, 1, 1)
        if swapped:
            q, k = k, q
        s = (q @ k.mT / math.sqrt(d)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(allowed_diagonal), fill)
        return (s.softmax(over) @ v).transpose(1, 2).reshape(B, T, -1) @ W_O
    return gqa


def gqa_decoded(x, W_Q, W_K, W_V, W_O, n_heads, n_key_value_heads):  # token by token through a cache, as the notebook
    B, T, _ = x.shape
    d = W_Q.size(1) // n_heads
    ks, vs, outs = [], [], []
    for t in range(T):
        xt = x[:, t:t + 1]
        q = (xt @ W_Q).view(B, 1, n_heads, d).transpose(1, 2)
        ks.append((xt @ W_K).view(B, 1, n_key_value_heads, d).transpose(1, 2))
        vs.append((xt @ W_V).view(B, 1, n_key_value_heads, d).transpose(1, 2))
        k = torch.cat(ks, 2).repeat_interleave(n_heads // n_key_value_heads, 1)
        v = torch.cat(vs, 2).repeat_interleave(n_heads // n_key_value_heads, 1)
        z = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        outs.append(z.transpose(1, 2).reshape(B, 1, -1) @ W_O)
    return torch.cat(outs, 1)


def gqa_expand_einsum(x, wq, wk, wv, wo, heads, kv_heads):  # groups as an axis, einsum, a boolean mask
    B, T, _ = x.shape
    d = wq.size(1) // heads
    q = torch.einsum("btd,de->bte", x, wq).view(B, T, kv_heads, heads // kv_heads, d)   # [B, T, G, per group, d]
    k = (x @ wk).view(B, T, kv_heads, d)
    v = (x @ wv).view(B, T, kv_heads, d)
    s = torch.einsum("btgpd,bsgd->bgpts", q, k) / math.sqrt(d)
    s = torch.where(torch.ones(T, T).tril().bool(), s, torch.tensor(float("-inf")))
    z = torch.einsum("bgpts,bsgd->btgpd", s.softmax(-1), v)
    return z.reshape(B, T, heads * d) @ wo


def gqa_float64(x, W_Q, W_K, W_V, W_O, n_heads, n_key_value_heads):
    args = [t.double() for t in (x, W_Q, W_K, W_V, W_O)]
    B, T, _ = x.shape
    out = gqa_decoded(*args, n_heads, n_key_value_heads)
    return out.numpy()


def gqa_with_mhalab_attention_pooled(x, W_Q, W_K, W_V, W_O, n_heads, n_key_value_heads):
    # mhalab's module: fair, the prompt forbids nothing
    from mhalab import MultiHeadAttention

    B, T, D = x.shape
    m = MultiHeadAttention(D, n_heads, n_key_value_heads=n_key_value_heads, bias=False)
    with torch.no_grad():
        m.qkv_proj.weight.copy_(torch.cat([W_Q.t(), W_K.t(), W_V.t()]))
        m.out_proj.weight.copy_(W_O.t())
        return m(x, is_causal=True)[0]


# ------------------------------------------------------------------------------------ 07
def _run_zeroing(model, tokens, layer, zero):
    handle = model.blocks[layer].attn.hook_z.register_forward_hook(lambda mod, inp, out: (zero(out), out)[1])
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()


def ablate_by_pattern(model, tokens, layer, head):  # zero the head's attention weights instead: z = pattern @ v = 0
    def off(pattern, hook):  # [B, H, T, S]
        pattern = pattern.clone()
        pattern[:, head] = 0
        return pattern
    return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", off)]).detach().double()


def ablate_register_hook(net, ids, which_layer, which_head):  # plain torch forward hook, other names, NumPy out
    return _run_zeroing(net, ids, which_layer,
                        lambda z: z.__setitem__((slice(None), slice(None), which_head), 0.0)).numpy()


def ablate_in_place_with_block(model, tokens, layer, head):  # model.hooks, a keyword-only hook that edits z in place
    def off(z, *, hook):
        z[..., head, :] = 0
    with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", off)]), torch.no_grad():
        return model(tokens)


def ablate_leaky(model, tokens, layer, head):
    model.blocks[layer].attn.hook_z.register_forward_hook(
        lambda mod, inp, out: out.index_fill(2, torch.tensor([head]), 0.0))
    return model(tokens)


def ablate_with_mhalab(model, tokens, layer, head):
    from mhalab.head_interventions import ablate_heads

    return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate_heads([head]))])


def ablate_with_ablation_module(model, tokens, layer, head):
    from mhalab.ablation import ablate

    with ablate(model, [(layer, head)]):
        return model(tokens)


def carrier_loop_numpy(cache, offsets):  # NumPy in float64, one head at a time, the cache read by short name
    out = {}
    for name, offset in offsets.items():
        best, where = -1.0, None
        for layer in range(len(cache)):
            p = cache["pattern", layer].numpy().astype(np.float64)       # [B, H, T, T]
            T = p.shape[-1]
            queries = [q for q in range(T) if 0 <= q + offset < T]
            for head in range(p.shape[1]):
                score = np.mean([p[:, head, q, q + offset] for q in queries])
                if score > best:                                       # strictly: the first of equal ones stays
                    best, where = score, (np.int64(layer), np.int64(head))
        out[name] = where
    return out


def carrier_by_sources(patterns, relation_offsets):  # as the library scores a relation: a key per query, masked
    A = torch.stack(list(patterns.values()))                          # [N, B, H, T, T]
    N, B, H, T, _ = A.shape
    result = {}
    for name, offset in relation_offsets.items():
        keys = torch.arange(T) + offset                                # [T]
        valid = (keys >= 0) & (keys < T)
        on_key = A.gather(-1, keys.clamp(0, T - 1).view(1, 1, 1, T, 1).expand(N, B, H, T, 1)).squeeze(-1)
        score = (on_key * valid).sum(dim=(1, 3)) / (B * valid.sum())    # [N, H]
        flat = int(torch.argmax(score))
        result[name] = [torch.tensor(flat // H), torch.tensor(flat % H)]   # 0-d tensors in a list
    return result


def carrier_tensor_pairs(cache, offsets):  # each pair as a tensor of two, the mean over the diagonal per layer
    out = {}
    for name, o in offsets.items():
        score = torch.stack([cache[f"blocks.{i}.attn.hook_pattern"].double().diagonal(o, -2, -1).mean((0, 2))
                             for i in range(len(cache))])              # [N, H]
        out[name] = torch.tensor(np.unravel_index(int(score.argmax()), tuple(score.shape)))
    return out


def best_heads_by_library(patterns, name, offset):  # what the prompt forbids: the course's own scores
    from mhalab.head_roles import relation_score

    B, H, T, _ = next(iter(patterns.values())).shape
    keys = torch.arange(T) + offset
    sources = torch.where((keys >= 0) & (keys < T), keys, -1).expand(B, T)
    return divmod(int(relation_score(patterns, sources).argmax()), H)


def carrier_mistaken(*, shift=0, mirror=False, edge="out", stat="mean", first=False, both=False, layers="all",
                     tie="first", index="heads", form="pair"):
    """07.2 as a learner who misreads one thing; each argument names the mistake."""
    def predicted_carrier(patterns, relation_offsets):
        A = torch.stack([patterns[f"blocks.{i}.attn.hook_pattern"] for i in range(len(patterns))])
        A = A[:, :1] if first else A
        N, B, H, T, _ = A.shape
        q = torch.arange(T)
        out = {}
        for name, o in relation_offsets.items():
            if both:
                near = ((q[None, :] - q[:, None]).abs() == abs(o)).float()
                score = (A * near).sum(-1).mean((1, 3))
            else:
                k = q - o if mirror else q + o + shift
                valid = (k >= 0) & (k < T) if edge == "out" else torch.ones(T, dtype=torch.bool)
                k = torch.remainder(k, T) if edge == "wrap" else k.clamp(0, T - 1)
                on = (A.argmax(-1) == k).float() if stat == "top" else A[..., q, k]
                on = on[..., valid]
                score = on.amax((1, 3)) if stat == "max" else on.mean((1, 3))
            if layers != "all":
                score = score[:1] if layers == "first" else score[-1:]
            flat = score.flatten()
            i = int(flat.argmax()) if tie == "first" else len(flat) - 1 - int(flat.flip(0).argmax())
            layer, head = divmod(i, H if index == "heads" else N)
            layer += (N - 1) if layers == "last" else 0
            key = o if form == "by offset" else name
            out[key] = i if form == "flat" else head if form == "head" else (layer, head)
        return out

    return predicted_carrier


# ------------------------------------------------------------------------------------ 08
def p_by_full_gap(similarity):  # the whole gap of every re-pairing (masks), not the matched mean: the same order
    import itertools

    n = similarity.shape[0]
    S = similarity.double()
    eye = torch.eye(n, dtype=torch.bool)

    def gap(M):
        return M[eye].mean() - (M[~eye].mean() if n > 1 else 0.0)

    true = gap(S)
    perms = list(itertools.permutations(range(n)))
    return sum(bool(gap(S[:, list(p)]) >= true) for p in perms) / len(perms)


def p_numpy(S):  # NumPy, every matched sum at once; an np.float64 back
    import itertools

    S = np.asarray(S, dtype=np.float64)
    n = len(S)
    perms = np.array(list(itertools.permutations(range(n))))  # [n!, n]
    sums = S[np.arange(n), perms].sum(axis=1)
    return np.mean(sums >= np.trace(S))


def p_by_mismatched(similarity):  # a re-pairing is as good when its mismatched pairs are as *dissimilar*
    import itertools

    n = similarity.shape[0]
    total = float(similarity.sum())
    true_off = total - float(similarity.trace())
    count = 0
    for sigma in itertools.permutations(range(n)):
        matched = sum(float(similarity[i, sigma[i]]) for i in range(n))
        if total - matched <= true_off:
            count += 1
    return torch.tensor(count / math.factorial(n), dtype=torch.float64)


def p_recursive(similarity):  # permutations written by hand, a 0-d tensor back
    n = similarity.shape[0]

    def perms(rest):
        if not rest:
            yield []
        for i, j in enumerate(rest):
            for tail in perms(rest[:i] + rest[i + 1:]):
                yield [j] + tail

    true = similarity.diagonal().sum()
    hits = [similarity[torch.arange(n), torch.tensor(p)].sum() >= true for p in perms(list(range(n)))]
    return torch.stack(hits).float().mean()


def _p_reading(S, keep, compare=lambda s, t: s >= t, divide=True):
    """Plausible misreadings of the permutation test: ``keep(sigma)`` picks the re-pairings counted."""
    import itertools

    n = S.shape[0]
    S = S.double()
    true = S.diagonal().sum()
    kept = [p for p in itertools.permutations(range(n)) if keep(p)]
    count = sum(bool(compare(S[torch.arange(n), list(p)].sum(), true)) for p in kept)
    return count / len(kept) if divide else count


def _p_sampled(S):  # random re-pairings instead of all of them
    g = torch.Generator().manual_seed(0)
    n = S.shape[0]
    true = S.diagonal().sum()
    hits = [S[torch.arange(n), torch.randperm(n, generator=g)].sum() >= true for _ in range(1000)]
    return sum(map(bool, hits)) / 1000


def _p_gap_against_mean(S):  # each re-pairing's matched mean against the true *gap*
    import itertools

    n = S.shape[0]
    S = S.double()
    gap = S.diagonal().mean() - (S.sum() - S.trace()) / (n * n - n)
    perms = list(itertools.permutations(range(n)))
    return sum(bool(S[torch.arange(n), list(p)].mean() >= gap) for p in perms) / len(perms)


def _p_rows_and_columns(S):  # rows and columns permuted together: the diagonal only moves
    import itertools

    n = S.shape[0]
    perms = list(itertools.permutations(range(n)))
    true = S.diagonal().sum()
    return sum(bool(S[list(p)][:, list(p)].diagonal().sum() >= true) for p in perms) / len(perms)


def offsets_loops(pattern, max_offset):  # one offset at a time, nearest first; lists back
    inner = pattern[:, :, 1:-1, 1:-1]
    L = inner.shape[-1]
    order = []
    for d in range(1, max_offset + 1):
        order += [-d, d]
    offsets, means = [], []
    for h in range(pattern.shape[1]):
        best, best_mean = None, -1.0
        for k in order:
            if abs(k) >= L:
                continue
            m = torch.diagonal(inner[:, h], offset=k, dim1=-2, dim2=-1).mean().item()
            if m > best_mean:
                best, best_mean = k, m
        offsets.append(best)
        means.append(best_mean)
    return offsets, means


def offsets_numpy_queries(pattern, max_offset):  # every query by hand, NumPy arrays back
    P = pattern.numpy().astype(np.float64)
    B, H, T, _ = P.shape
    offsets, means = np.zeros(H, dtype=np.int64), np.full(H, -np.inf)
    for d in range(1, max_offset + 1):
        for k in (-d, d):
            weights = [P[:, :, q, q + k] for q in range(1, T - 1) if 1 <= q + k <= T - 2]  # each [B, H]
            if not weights:
                continue
            m = np.stack(weights).mean(axis=(0, 1))  # [H]
            better = m > means
            offsets[better], means[better] = k, m[better]
    return offsets, means


def offsets_by_relation_score(pattern, max_offset):  # mhalab's relation_score, one offset at a time: fair
    from mhalab.head_roles import relation_score

    B, H, T, _ = pattern.shape
    q = torch.arange(T)
    order = [k for d in range(1, max_offset + 1) for k in (-d, d) if d < T - 2]
    scores = []
    for k in order:
        ok = (q >= 1) & (q <= T - 2) & (q + k >= 1) & (q + k <= T - 2)
        sources = torch.where(ok, q + k, -1).expand(B, T)
        scores.append(relation_score([pattern], sources)[0])  # [H]
    scores = torch.stack(scores)  # [offsets, H]
    best = scores.argmax(0)  # the first of tied maxima: the nearest
    return torch.tensor(order)[best], scores.max(0).values


def offsets_stacked(pattern, max_offset):  # one [2, H] tensor: offsets on top of their means
    offsets, means = offsets_loops(pattern, max_offset)
    return torch.tensor([offsets, means], dtype=torch.float64)


def _offsets_misread(pattern, max_offset, *, inner=True, queries_inner=True, edges_zero=False, flip=False,
                     zero=False, inclusive=True, total=False, first=False, over_heads=False, tie_last=False,
                     index=False):
    """A learner's loop, with one of the misreadings switched on."""
    P = pattern.double()
    B, H, T, _ = P.shape
    lo, hi = (1, T - 2) if inner else (0, T - 1)
    q_lo, q_hi = (lo, hi) if queries_inner else (0, T - 1)
    K = max_offset if inclusive else max_offset - 1
    order = ([0] if zero else []) + [k for d in range(1, K + 1) for k in (-d, d)]
    best, best_mean = [0] * H, [-math.inf] * H
    for i, k in enumerate(order):
        pairs = [(q, q - k if flip else q + k) for q in range(q_lo, q_hi + 1) if lo <= (q - k if flip else q + k) <= hi]
        if not pairs:
            continue
        w = torch.stack([P[:, :, q, key] for q, key in pairs], -1)  # [B, H, queries]
        w = w[:1] if first else w
        m = w.sum(-1).mean(0) / (q_hi - q_lo + 1) if edges_zero else w.sum(-1).mean(0) if total else w.mean((0, 2))
        m = m.mean().expand(H) if over_heads else m
        for h in range(H):
            if m[h] > best_mean[h] or (tie_last and m[h] == best_mean[h]):
                best[h], best_mean[h] = (i if index else k), float(m[h])
    return best, best_mean


def _offsets_reading(**how):
    return lambda pattern, max_offset: _offsets_misread(pattern, max_offset, **how)


def _offsets_argmax_nan(pattern, max_offset):  # every offset's mean, empty ones NaN, then argmax
    inner = pattern[..., 1:-1, 1:-1]
    order = [k for d in range(1, max_offset + 1) for k in (-d, d)]
    means = torch.stack([inner.diagonal(k, -2, -1).mean(dim=(0, 2)) for k in order])  # [offsets, H]
    return torch.tensor(order)[means.argmax(0)], means.max(0).values


def _offsets_range_argmax(pattern, max_offset):  # offsets in the order of range(): ties go to the most negative
    inner = pattern[..., 1:-1, 1:-1]
    L = inner.shape[-1]
    order = [k for k in range(-max_offset, max_offset + 1) if k and abs(k) < L]
    means = torch.stack([inner.diagonal(k, -2, -1).mean(dim=(0, 2)) for k in order])
    return torch.tensor(order)[means.argmax(0)], means.max(0).values


def share_einsum(pattern, values_out, keys):  # the terms by einsum, a boolean mask of the keys
    terms = torch.einsum("bhqk,bkh->bhqk", pattern, values_out.norm(dim=-1))
    on = torch.zeros(pattern.shape[-1], dtype=torch.bool)
    on[keys] = True
    share = terms[..., on].sum(-1) / terms.sum(-1)
    return share[..., ~on].mean(dim=(0, 2))


def share_numpy(pattern, values_out, keys):
    p, f = pattern.numpy().astype(np.float64), values_out.numpy().astype(np.float64)
    terms = p * np.linalg.norm(f, axis=-1).transpose(0, 2, 1)[:, :, None, :]
    others = [q for q in range(p.shape[-1]) if q not in keys]
    return (terms[..., keys].sum(-1) / terms.sum(-1))[..., others].mean(axis=(0, 2))


def share_loops(pattern, values_out, keys):  # one query at a time, as plain floats
    B, H, T, _ = pattern.shape
    out = []
    for h in range(H):
        shares = []
        for b in range(B):
            for q in range(T):
                if q in keys:
                    continue
                terms = [float(pattern[b, h, q, k]) * float(values_out[b, k, h].norm()) for k in range(T)]
                shares.append(sum(terms[k] for k in keys) / sum(terms))
        out.append(sum(shares) / len(shares))
    return out


def _share_pooled(pattern, values_out, keys):  # the sums over the queries divided, not each query's share
    terms = torch.einsum("bhqk,bkh->bhqk", pattern, values_out.norm(dim=-1))
    others = [q for q in range(pattern.shape[-1]) if q not in keys]
    return terms[..., keys].sum(-1)[..., others].sum(dim=(0, 2)) / terms.sum(-1)[..., others].sum(dim=(0, 2))


def _share_all_queries(pattern, values_out, keys):  # the given keys kept as queries too
    terms = torch.einsum("bhqk,bkh->bhqk", pattern, values_out.norm(dim=-1))
    return (terms[..., keys].sum(-1) / terms.sum(-1)).mean(dim=(0, 2))


# ------------------------------------------------------------------------------------ 09
def prev_scores_by_mhalab(cache):  # the course's own score: fair, the prompt forbids nothing (dicts keep layer order)
    from mhalab.head_roles import previous_token_score

    return previous_token_score(cache)


def fit_by_mhalab(config, seq_len, batch, memory_bytes, bytes_per_value):  # mhalab's counter, divisors upward
    from mhalab.counting import kv_cache_per_token

    c = config
    per_token = kv_cache_per_token(c.d_model, c.n_heads, n_key_value_heads=1, d_head=c.d_head,
                                   n_layers=c.n_layers).elements * bytes_per_value
    best = 0
    for g in range(1, c.n_heads + 1):
        if c.n_heads % g == 0 and g * per_token * seq_len * batch <= memory_bytes:
            best = g
    return best


def fit_numpy(config, seq_len, batch, memory_bytes, bytes_per_value):  # an np.int64 back
    g = np.arange(1, config.n_heads + 1)
    g = g[config.n_heads % g == 0]
    ok = g[g * (2 * config.n_layers * config.d_head * seq_len * batch * bytes_per_value) <= memory_bytes]
    return ok.max() if ok.size else np.int64(0)


def fit_float_room(config, seq_len, batch, memory_bytes, bytes_per_value):  # the room in K/V heads, a float
    room = memory_bytes / (2.0 * config.n_layers * config.d_head * seq_len * batch * bytes_per_value)
    return float(max([g for g in range(1, config.n_heads + 1) if config.n_heads % g == 0 and g <= room], default=0))


def _fit_with(config, seq_len, batch, memory, b, *, strict=False, divides=True, cap=True, d_head=None, two=2,
              layers=True, with_batch=True, with_bytes=True, largest=True):
    per = (two * (config.n_layers if layers else 1) * (d_head or config.d_head) * seq_len
           * (batch if with_batch else 1) * (b if with_bytes else 1))
    top = config.n_heads if cap else memory // per
    fits = [g for g in range(1, top + 1) if (g * per < memory if strict else g * per <= memory)
            and (not divides or config.n_heads % g == 0)]
    return (max(fits) if largest else min(fits)) if fits else 0


def targets_two_dicts(tokens):  # the two latest occurrences of each token, kept as the sequence is read
    last, before_last, out = {}, {}, []
    for i, t in enumerate(tokens.tolist()):
        p = last.get(t)
        if p is not None and p + 1 == i:  # the follower is the query itself: the occurrence before
            p = before_last.get(t)
        out.append(-1 if p is None else p + 1)
        if t in last:
            before_last[t] = last[t]
        last[t] = i
    return out


def targets_by_keys(tokens):  # the latest key j < i whose previous token is the query's: a [T] tensor
    T = len(tokens)
    follows = torch.zeros(T, T, dtype=torch.bool)  # [query, key]
    follows[:, 1:] = tokens[:, None] == tokens[None, :-1]
    follows &= torch.ones(T, T, dtype=torch.bool).tril(-1)
    keys = torch.arange(T).expand(T, T)
    return torch.where(follows.any(-1), torch.where(follows, keys, -1).max(-1).values, -1)


def targets_numpy(tokens):  # a NumPy array back
    t = np.asarray(tokens)
    out = np.full(len(t), -1)
    for i in range(len(t)):
        earlier = np.flatnonzero(t[: max(i - 1, 0)] == t[i])
        if earlier.size:
            out[i] = earlier[-1] + 1
    return out


def _targets_with(tokens, *, first=False, follower=1, self_ok=False, adjacent_none=False, none=-1):
    tokens, out = tokens.tolist(), []
    for i, t in enumerate(tokens):
        earlier = [p for p in range(i) if tokens[p] == t and (self_ok or adjacent_none or p + 1 < i)]
        p = (earlier[0] if first else earlier[-1]) if earlier else None
        if p is not None and adjacent_none and p + 1 == i:
            p = None
        out.append(none if p is None else p + follower)
    return out


def _second_copy(model, tokens, heads, L, *, positions=None, axis=2, keep_hooks=False, layers=None):
    def off(z, hook):
        layer = int(hook.name.split(".")[1])
        chosen = [h for l, h in heads if l == layer and (layers is None or l in layers)]
        if chosen:
            z = z.clone()
            index = [slice(None)] * z.dim()
            index[axis] = chosen
            z[tuple(index)] = 0.0
        return z
    if keep_hooks:
        for block in model.blocks:
            block.attn.hook_z.register_forward_hook(lambda mod, inp, out: out * 0.5)
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), off)])
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(),
                                            reduction="none").view(tokens.shape[0], -1)
    return nll[:, L:].mean().item() if positions is None else nll[:, positions].mean().item()


def second_copy_one_predicate_hook(model, tokens, heads, L):  # one hook on every layer reading hook.name
    return _second_copy(model, tokens, heads, L)


def second_copy_forward_hooks(net, ids, which, n):  # plain torch forward hooks, removed in finally; log_softmax by hand
    handles = []
    for layer in {l for l, _ in which}:
        hs = [h for l, h in which if l == layer]
        handles.append(net.blocks[layer].attn.hook_z.register_forward_hook(
            lambda mod, inp, out, hs=hs: out.index_fill(2, torch.tensor(hs), 0.0)))
    try:
        with torch.no_grad():
            logp = net(ids).log_softmax(-1)
    finally:
        for handle in handles:
            handle.remove()
    picked = logp[:, n:-1].gather(-1, ids[:, n + 1:, None])[..., 0]
    return torch.tensor(-picked.mean().item(), dtype=torch.float64)


def second_copy_caching_everything(model, tokens, heads, L):  # run_with_cache of every point: the explicit softmax
    def off(z, hook):
        z = z.clone()
        z[:, :, [h for l, h in heads if hook.name == f"blocks.{l}.attn.hook_z"]] = 0.0
        return z

    with torch.no_grad(), model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_z"), off)]):
        logits, cache = model.run_with_cache(tokens)
    return torch.nn.functional.cross_entropy(logits[0, L:-1], tokens[0, L + 1:]).item() if len(tokens) == 1 else \
        torch.nn.functional.cross_entropy(logits[:, L:-1].flatten(0, 1), tokens[:, L + 1:].flatten()).item()


def second_copy_watching_patterns(model, tokens, heads, L):  # a hook on every hook_pattern too (it keeps them)
    patterns = {}
    layers = model.config.n_layers
    keep = [(f"blocks.{i}.attn.hook_pattern", lambda p, hook: patterns.setdefault(hook.name, p)) for i in range(layers)]
    gates = torch.ones(layers, model.config.n_heads)
    for layer, head in heads:
        gates[layer, head] = 0.0
    scale = [(f"blocks.{i}.attn.hook_z", lambda z, hook, i=i: z * gates[i][None, None, :, None]) for i in range(layers)]
    with torch.no_grad():
        logp = model.run_with_hooks(tokens, fwd_hooks=keep + scale).log_softmax(-1)
    return -logp[:, L:-1].gather(2, tokens[:, L + 1:].unsqueeze(2)).mean().item()


def second_copy_zero_pattern(model, tokens, heads, L):  # "switched off" read as attending nowhere: z is 0 all the same
    def nowhere(pattern, hook):  # [batch, head, query, key]
        pattern = pattern.clone()
        pattern[:, [h for l, h in heads if hook.name == f"blocks.{l}.attn.hook_pattern"]] = 0.0
        return pattern

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("hook_pattern"), nowhere)])
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
    return nll[:, L:].mean()


def second_copy_with_ablate(model, tokens, heads, L):
    from mhalab.ablation import ablate

    with torch.no_grad(), ablate(model, heads):
        logits = model(tokens)
    return torch.nn.functional.cross_entropy(logits[:, L:-1].flatten(0, 1), tokens[:, L + 1:].flatten()).item()


def second_copy_with_gate_heads(model, tokens, heads, L):  # the course's gating hook with zero gates: refused too
    from mhalab.head_interventions import gate_heads

    H = model.config.n_heads
    hooks = []
    for layer in sorted({l for l, _ in heads}):
        gates = torch.ones(H)
        gates[[h for l, h in heads if l == layer]] = 0.0
        hooks.append((f"blocks.{layer}.attn.hook_z", gate_heads(gates)))
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return torch.nn.functional.cross_entropy(logits[:, L:-1].flatten(0, 1), tokens[:, L + 1:].flatten()).item()


# ------------------------------------------------------------------------------------ 11
def floor_closed_form(vocab_size, period, seq_len, window):  # counted in closed form: the guesses in each window
    n = seq_len - 1                                           # targets 0 .. n - 1
    early = min(window, period)
    late = max(0, min(period, n) - (n - window))
    return math.log(vocab_size) * (late - early) / window


def floor_numpy(V, P, T, w):  # NumPy, other parameter names: an np.float64 back
    t = np.arange(T - 1)
    loss = np.where(t >= P, 0.0, np.log(V))
    return loss[-w:].mean() - loss[:w].mean()


def floor_tensor(vocab_size, period, seq_len, window):  # a 0-d tensor, the loss of each token written by position
    token = torch.arange(1, seq_len)                          # the token each target is: 1 .. seq_len - 1
    known = token >= period + 1                               # its position's token (token - 1) occurred before
    loss = torch.where(known, 0.0, math.log(vocab_size)).double()
    return loss[-window:].mean() - loss[:window].mean()


def floor_float32(vocab_size, period, seq_len, window):  # NumPy in float32: an np.float32 back
    loss = np.array([0.0 if t >= period else np.log(vocab_size) for t in range(seq_len - 1)], dtype=np.float32)
    return loss[-window:].mean() - loss[:window].mean()


def _floor_with(V, P, T, w, *, first=None, n=None, log=math.log):
    first, n = (P if first is None else first), (T - 1 if n is None else n)
    loss = [log(V) if t < first else 0.0 for t in range(n)]
    return sum(loss[-w:]) / w - sum(loss[:w]) / w


def _floor_halves(V, P, T, w):  # the second half against the first: not the score's windows
    loss = [math.log(V) if t < P else 0.0 for t in range(T - 1)]
    h = len(loss) // 2
    return sum(loss[-h:]) / h - sum(loss[:h]) / h


def _follows(tokens, shift=1):
    B, T = tokens.shape
    f = torch.zeros(B, T, T, dtype=torch.bool)
    f[:, :, shift:] = tokens[:, :, None] == tokens[:, None, :T - shift]
    return f & torch.ones(T, T, dtype=torch.bool).tril(-1)


def _circuit_with(tokens, patterns, *, shift=1, scores=None, layers=None, below=None, prev_offset=1):
    N, H = len(patterns), patterns[0].shape[1]
    if scores is None:
        f = _follows(tokens, shift)
        counted = f.any(-1).float()
        scores = torch.stack([(p * f[:, None]).sum(-1).mul(counted[:, None]).sum((0, 2)) / counted.sum()
                              for p in patterns])
    prev = torch.stack([p.diagonal(-prev_offset, -2, -1).mean((0, 2)) for p in patterns])
    cand = [(float(scores[l, h]), l, h) for l in (range(1, N) if layers is None else layers) for h in range(H)]
    _, il, ih = max(cand)
    below_layers = range(il) if below is None else below(il)
    _, pl, ph = max((float(prev[l, h]), l, h) for l in below_layers for h in range(H))
    return (il, ih), (pl, ph)


def circuit_loop(tokens, patterns):  # a loop over heads, the followers found query by query
    seqs = tokens.tolist()
    keys = [[[j for j in range(1, i) if seq[j - 1] == seq[i]] for i in range(len(seq))] for seq in seqs]
    best, where = -1.0, None
    for layer in range(1, len(patterns)):
        for head in range(patterns[layer].shape[1]):
            total, count = 0.0, 0
            for b, rows in enumerate(keys):
                for i, js in enumerate(rows):
                    if js:
                        total += float(patterns[layer][b, head, i, js].sum())
                        count += 1
            if total / count > best:
                best, where = total / count, (layer, head)
    layer = where[0]
    prev = [(float(patterns[l][:, h].diagonal(-1, -2, -1).mean()), l, h)
            for l in range(layer) for h in range(patterns[l].shape[1])]
    _, pl, ph = max(prev)
    return where, (pl, ph)


def circuit_numpy(tokens, patterns):  # NumPy throughout: the heads come back as np.int64 in lists
    t = np.asarray(tokens)
    P = np.stack([np.asarray(p, dtype=np.float64) for p in patterns])          # [N, B, H, T, T]
    T = t.shape[1]
    f = np.zeros((t.shape[0], T, T), dtype=bool)
    f[:, :, 1:] = t[:, :, None] == t[:, None, :-1]
    f &= np.tril(np.ones((T, T), dtype=bool), -1)
    counted = f.any(-1)
    induction = (P * f[None, :, None]).sum(-1).transpose(0, 2, 1, 3)[..., counted].mean(-1)  # [N, H]
    previous = np.diagonal(P, offset=-1, axis1=-2, axis2=-1).mean((1, 3))     # [N, H]
    il, ih = np.unravel_index(np.argmax(induction[1:]), induction[1:].shape)
    il += 1
    pl, ph = np.unravel_index(np.argmax(previous[:il]), previous[:il].shape)
    return [[il, ih], [pl, ph]]


def circuit_per_sequence(tokens, patterns):  # each sequence's mean first, then the batch's: the same heads here
    f = _follows(tokens)
    counted = f.any(-1).float()                                               # [B, T]
    scores = torch.stack([((p * f[:, None]).sum(-1) * counted[:, None]).sum(-1).div(counted.sum(-1)[:, None]).mean(0)
                          for p in patterns])
    (il, ih), (pl, ph) = _circuit_with(tokens, patterns, scores=scores)
    return (torch.tensor(il), torch.tensor(ih)), (torch.tensor(pl), torch.tensor(ph))


def circuit_argmax(tokens, patterns):  # how often a head's strongest key is a follower: another fair test
    f = _follows(tokens)
    counted = f.any(-1)
    hits = []
    for p in patterns:                                                        # [B, H, T, T]
        top = p.argmax(-1)                                                    # [B, H, T]
        hit = f[:, None].expand(-1, p.shape[1], -1, -1).gather(-1, top[..., None])[..., 0]   # [B, H, T]
        hits.append((hit & counted[:, None]).float().sum((0, 2)) / counted.sum())
    return _circuit_with(tokens, patterns, scores=torch.stack(hits))


def circuit_period_found(tokens, patterns):  # each sequence's period found from its tokens, the offset read there
    B, T = tokens.shape
    hits = torch.zeros(len(patterns), patterns[0].shape[1], dtype=torch.float64)
    count = 0
    for b in range(B):
        P = next(p for p in range(1, T) if torch.equal(tokens[b, p:], tokens[b, :T - p]))
        for i in range(P, T):
            hits += torch.stack([p[b, :, i, i - P + 1].double() for p in patterns])
            count += 1
    return _circuit_with(tokens, patterns, scores=hits / count)


def _circuit_fixed_offset(tokens, patterns):  # the period of the first sequence, read as a distance in every one
    T = tokens.shape[1]
    P = next(j for j in range(1, T) if torch.equal(tokens[0, j:], tokens[0, :T - j]))
    scores = torch.stack([p.diagonal(-(P - 1), -2, -1).mean((0, 2)) for p in patterns])
    return _circuit_with(tokens, patterns, scores=scores)


def _circuit_first_sequence(tokens, patterns):  # the content test on the first sequence only
    return _circuit_with(tokens[:1], [p[:1] for p in patterns])


def _circuit_half_offset(tokens, patterns):  # as if every sequence were one block and its copy: offset T / 2 - 1
    d = tokens.shape[1] // 2 - 1
    scores = torch.stack([p.diagonal(-d, -2, -1).mean((0, 2)) for p in patterns])
    return _circuit_with(tokens, patterns, scores=scores)


def _circuit_head_roles(tokens, patterns):  # the course's own score, which the prompt asks not to use
    from mhalab.head_roles import induction_score
    return _circuit_with(tokens, patterns, scores=induction_score(torch.stack(patterns), tokens))

# ------------------------------------------------------------------------------------ 12
def qk_circuit_by_slicing(model, layer, head):  # qkv_proj sliced by hand, the K/V head found from the group size
    attn = model.blocks[layer].attn
    H, G, d = attn.n_heads, attn.n_key_value_heads, attn.d_head
    g = head // (H // G)
    W_Q = attn.qkv_proj.weight[head * d:(head + 1) * d].T
    W_K = attn.qkv_proj.weight[(H + g) * d:(H + g + 1) * d].T
    W_QK = W_Q @ W_K.T
    return [W_QK.detach().numpy(), torch.linalg.matrix_rank(W_QK)]


def qk_circuit_svd(m, l, i):  # the rank from the singular values above their rounding, other parameter names
    p = m.blocks[l].attn.head_projections(i)
    M = p.W_Q @ p.W_K.T
    S = torch.linalg.svdvals(M)
    return M, int((S > S[0] * max(M.shape) * torch.finfo(M.dtype).eps).sum())


def qk_circuit_numpy(model, layer, head):  # NumPy: the rank is np.linalg.matrix_rank's np.int64
    p = model.blocks[layer].attn.head_projections(head)
    W = p.W_Q.detach().numpy() @ p.W_K.detach().numpy().T
    return W, np.linalg.matrix_rank(W)


def qk_circuit_tensor_rank(model, layer, head):  # the rank as torch gives it, a 0-d tensor; the product in float64
    p = model.blocks[layer].attn.head_projections(head)
    W = p.W_Q.double() @ p.W_K.double().T  # exact products of the float32 weights: the rank is the same
    return W, torch.linalg.matrix_rank(W)


def _qk_svd_loose(m, l, i, rtol=1e-5):  # the rank from the singular values, with a tolerance of its own
    p = m.blocks[l].attn.head_projections(i)
    M = p.W_Q @ p.W_K.T
    S = torch.linalg.svdvals(M)
    return M, int((S > S[0] * rtol).sum())


def _qk_alive_count(model, layer, head):  # the rank predicted by counting the directions alive on both sides
    p = model.blocks[layer].attn.head_projections(head)
    alive = (p.W_Q != 0).any(0) & (p.W_K != 0).any(0)  # [d_head]: q_i and k_i both nonzero
    return p.W_Q @ p.W_K.T, int(alive.sum())


def _qk_made_up_group(model, layer, head):  # query head j paired with K/V head j % G (a map made up)
    attn = model.blocks[layer].attn
    H, G, d = attn.n_heads, attn.n_key_value_heads, attn.d_head
    w = attn.qkv_proj.weight.detach()
    W_Q, W_K = w[head * d:(head + 1) * d].T, w[(H + head % G) * d:(H + head % G + 1) * d].T
    return W_Q @ W_K.T, int(torch.linalg.matrix_rank(W_Q @ W_K.T))


def copying_small_side(W_E, W_V, W_O, W_U):  # the same nonzero eigenvalues from the [d_head, d_head] product
    lam = torch.linalg.eigvals((W_O @ W_U) @ (W_E @ W_V))
    return (lam.real.sum() / lam.abs().sum()).item()


def copying_trace(E, V, O, U):  # the sum of the eigenvalues is the trace, and numpy
    M = (E @ V @ O @ U).numpy()
    return np.trace(M) / np.abs(np.linalg.eigvals(M)).sum()


def copying_numpy(W_E, W_V, W_O, W_U):  # NumPy's eigenvalues: the score comes back as an np.float64
    lam = np.linalg.eigvals((W_E @ W_V @ W_O @ W_U).numpy())
    return lam.real.sum() / np.abs(lam).sum()


def copying_tensor(W_E, W_V, W_O, W_U):  # a 0-d tensor, the moduli written out
    lam = torch.linalg.eigvals(W_E @ W_V @ W_O @ W_U)
    return lam.real.sum() / torch.sqrt(lam.real ** 2 + lam.imag ** 2).sum()


def copying_numpy_float32(W_E, W_V, W_O, W_U):  # NumPy in float32 throughout: an np.float32 back
    lam = np.linalg.eigvals((W_E @ W_V @ W_O @ W_U).numpy().astype(np.float32))  # complex64
    return np.float32(lam.real.sum() / np.abs(lam).sum())


def _copying_moduli_over_moduli(W_E, W_V, W_O, W_U):  # |λ| in the numerator too: a sum over itself
    lam = torch.linalg.eigvals(W_E @ W_V @ W_O @ W_U)
    return (lam.abs().sum() / lam.abs().sum()).item()


def _qk_smaller_rank(model, layer, head):  # the rank predicted as the smaller of W_Q's and W_K's (a bound only)
    p = model.blocks[layer].attn.head_projections(head)
    return p.W_Q @ p.W_K.T, min(int(torch.linalg.matrix_rank(p.W_Q)), int(torch.linalg.matrix_rank(p.W_K)))


def copying_loop(W_E, W_V, W_O, W_U):  # a loop over the eigenvalues, complex abs() by hand
    real = modulus = 0.0
    for lam in torch.linalg.eigvals(W_E @ W_V @ W_O @ W_U).tolist():
        real, modulus = real + lam.real, modulus + (lam.real ** 2 + lam.imag ** 2) ** 0.5
    return real / modulus


def _copying_diagonal_top(W_E, W_V, W_O, W_U):  # "copying" read as: the share of tokens that raise their own logit most
    M = W_E @ W_V @ W_O @ W_U
    return float((M.argmax(-1) == torch.arange(M.shape[0])).double().mean())


def dla_numpy(result, scale, W_U, right, wrong):  # NumPy, row by row
    r, s, U = result.numpy(), scale.numpy(), W_U.numpy()
    return np.einsum("btd,dbt->bt", r / s, U[:, right.numpy()] - U[:, wrong.numpy()])


def dla_einsum(result, scale, W_U, right, wrong):
    return torch.einsum("btd,btd->bt", result / scale, W_U.T[right] - W_U.T[wrong])


def dla_logits(result, scale, W_U, right, wrong):  # all the logits, then two of them
    logits = (result / scale) @ W_U
    return logits.gather(-1, right[..., None])[..., 0] - logits.gather(-1, wrong[..., None])[..., 0]



# ------------------------------------------------------------------------------------ 06
def enough_numpy_ints(d_model, n_tables, n_keys):  # numpy: a list of np.int64 back
    heads = np.arange(1, d_model + 1)
    heads = heads[d_model % heads == 0]
    wide = (d_model // heads >= 2) & (heads >= n_tables)
    thin = (d_model // heads == 1) & (2 * heads >= n_tables * n_keys)
    return list(heads[wide | thin])


def enough_tensor_items(dm, tables, keys):  # a loop over torch.arange: a list of 0-d tensors, widest heads last
    out = []
    for h in torch.arange(dm, 0, -1):
        if dm % h == 0 and ((dm // h >= 2 and h >= tables) or (dm // h == 1 and 2 * h >= tables * keys)):
            out.append(h)
    return out


def enough_by_width(d_model, n_tables, n_keys):  # over the widths d_k, a tuple of floats
    out = []
    for d_k in range(d_model, 0, -1):
        if d_model % d_k == 0:
            h = d_model / d_k
            favourites = 2 * h if d_k == 1 else n_keys * h  # one per asked key
            if h >= n_tables and favourites >= n_tables * n_keys:
                out.append(h)
    return tuple(out)


def enough_array(d_model, n_tables, n_keys):  # a numpy array back
    return np.array([h for h in range(1, d_model + 1) if d_model % h == 0
                     and (h >= n_tables if d_model // h > 1 else 2 * h >= n_tables * n_keys)], dtype=np.int64)


def _enough_reading(d_model, n_tables, n_keys, *, divides=True, wide=lambda h, d_k: True,
                    thin=lambda h: True, min_width=2):
    out = []
    for h in range(1, d_model + 1):
        if divides and d_model % h:
            continue
        d_k = d_model // h
        if (wide(h, d_k) if d_k >= min_width else thin(h)):
            out.append(h)
    return out


def _enough_no_divisor(d, t, k):  # every h from 1 to d_model
    return _enough_reading(d, t, k, divides=False, wide=lambda h, d_k: h >= t, thin=lambda h: 2 * h >= t * k)


def _enough_min_d_k(d, t, k):  # notebook 05's rule: at least one head per table, heads at least two wide
    return [h for h in range(t, d + 1) if d % h == 0 and d // h >= 2]


def _enough_every_head_two(d, t, k):  # every head counted with two favourites
    return [h for h in range(1, d + 1) if d % h == 0 and 2 * h >= t * k]


def _enough_strict_thin(d, t, k):
    return _enough_reading(d, t, k, wide=lambda h, d_k: h >= t, thin=lambda h: 2 * h > t * k)


def _enough_keys_only(d, t, k):  # the thin heads' favourites against the keys alone
    return _enough_reading(d, t, k, wide=lambda h, d_k: h >= t, thin=lambda h: 2 * h >= k)


def _enough_thin_always(d, t, k):  # the thin end never ruled out
    return _enough_reading(d, t, k, wide=lambda h, d_k: h >= t, thin=lambda h: h >= t)


def _enough_smallest(d, t, k):  # only the smallest
    return enough_numpy_ints(d, t, k)[:1]


def trade_numpy(accuracy):  # arrays, and a np.str_ back
    showing = []
    for row in accuracy.values():
        heads = np.array(sorted(row))
        acc = np.array([row[h] for h in heads])
        showing.append(acc[0] < acc.max() and acc[-1] < acc.max())
    return np.array(["no seed", "some seeds", "every seed"])[2 if all(showing) else 1 if any(showing) else 0]


def trade_sorted(acc):  # sorts each seed's head counts; capitals and a space
    verdicts = []
    for seed in acc:
        values = [acc[seed][h] for h in sorted(acc[seed])]
        verdicts.append(values[0] < max(values) and values[-1] < max(values))
    return "Every seed " if all(verdicts) else "Some seeds" if any(verdicts) else "No seed"


def trade_tensor(accuracy):  # torch
    shows = torch.tensor([bool((torch.tensor([a[min(a)], a[max(a)]]) < max(a.values())).all())
                          for a in accuracy.values()])
    return "every seed" if shows.all() else "some seeds" if shows.any() else "no seed"


def _verdict_of(showing):
    return "every seed" if all(showing) else "some seeds" if any(showing) else "no seed"


def _trade_mean(acc):  # the mean over seeds
    heads = sorted(next(iter(acc.values())))
    mean = [sum(a[h] for a in acc.values()) / len(acc) for h in heads]
    return "every seed" if mean[0] < max(mean) and mean[-1] < max(mean) else "no seed"


def _trade_dict_order(acc):  # the first and last keys as the ends
    return _verdict_of([list(a.values())[0] < max(a.values()) and list(a.values())[-1] < max(a.values())
                        for a in acc.values()])


def _trade_best_anywhere(acc):  # the ends against the best over all seeds
    best = max(max(a.values()) for a in acc.values())
    return _verdict_of([a[min(a)] < best and a[max(a)] < best for a in acc.values()])


def _trade_neighbours(acc):  # each end below its neighbour
    def ok(a):
        h = sorted(a)
        return a[h[0]] < a[h[1]] and a[h[-1]] < a[h[-2]]
    return _verdict_of([ok(a) for a in acc.values()])


def _trade_argmax_inside(acc):  # the best head count is not an end (ties broken by dict order)
    return _verdict_of([max(a, key=a.get) not in (min(a), max(a)) for a in acc.values()])


def _trade_all_or_none(acc):  # never "some seeds"
    return "every seed" if trade_tensor(acc) == "every seed" else "no seed"


def _trade_any(acc):  # one seed is enough
    return "no seed" if trade_tensor(acc) == "no seed" else "every seed"


# ------------------------------------------------------------------------------------ 13
def never_loop(k):  # a loop over the heads, a Python set, sorted rows
    favoured = set()
    for row in k:
        order = row.argsort()
        if len(row) == 1:
            favoured.add(0)
            continue
        if row[order[-1]] > row[order[-2]]:
            favoured.add(int(order[-1]))
        if row[order[0]] < row[order[1]]:
            favoured.add(int(order[0]))
    return torch.tensor([j not in favoured for j in range(k.shape[1])])


def never_numpy(k):  # numpy, 0/1 integers
    k = np.asarray(k)
    out = np.ones(k.shape[1], dtype=int)
    for row in k:
        for extreme in (row.max(), row.min()):
            where = np.flatnonzero(row == extreme)
            if len(where) == 1:
                out[where[0]] = 0
    return out


def never_counts(keys):  # other parameter name; counts of each row's extremes
    top = keys == keys.max(dim=1, keepdim=True).values
    bottom = keys == keys.min(dim=1, keepdim=True).values
    sole_top = top & (top.sum(1, keepdim=True) == 1)
    sole_bottom = bottom & (bottom.sum(1, keepdim=True) == 1)
    return ~(sole_top | sole_bottom).any(dim=0)


def never_list(k):  # a Python list of bools, row by row with max/min and counts
    rows = k.tolist()
    favoured = set()
    for row in rows:
        for extreme in (max(row), min(row)):
            if row.count(extreme) == 1:
                favoured.add(row.index(extreme))
    return [j not in favoured for j in range(len(rows[0]))]


def never_numpy_bool(k):  # a NumPy array of bools
    k = np.asarray(k)
    top, bottom = k == k.max(1, keepdims=True), k == k.min(1, keepdims=True)
    sole = (top & (top.sum(1, keepdims=True) == 1)) | (bottom & (bottom.sum(1, keepdims=True) == 1))
    return ~sole.any(0)


def _never_argmax(k):  # argmax/argmin: one of tied keys counted as favoured
    out = torch.ones(k.shape[1], dtype=torch.bool)
    out[k.argmax(1)] = False
    out[k.argmin(1)] = False
    return out


def _never_ties_equal(k):  # every key at an extreme counted as favoured, ties too
    return ~((k == k.amax(1, keepdim=True)) | (k == k.amin(1, keepdim=True))).any(0)


def _never_only_max(k):
    top = k == k.amax(1, keepdim=True)
    return ~(top & (top.sum(1, keepdim=True) == 1)).any(0)


def _never_reachable(k):  # the keys some head can favour (the opposite)
    return ~never_counts(k)


def _never_every_head(k):  # favoured only if every head favours it
    top, bottom = k == k.amax(1, keepdim=True), k == k.amin(1, keepdim=True)
    sole = top & (top.sum(1, keepdim=True) == 1) | bottom & (bottom.sum(1, keepdim=True) == 1)
    return ~sole.all(0)


def _never_whole_table(k):  # the extremes of the whole table
    out = torch.ones(k.shape[1], dtype=torch.bool)
    out[int(k.argmax()) % k.shape[1]] = False
    out[int(k.argmin()) % k.shape[1]] = False
    return out


def _never_no_key(k):  # no key out of reach
    return torch.zeros(k.shape[1], dtype=torch.bool)


def _never_no_key_numpy(k):
    return np.zeros(k.shape[1], dtype=bool)


def _never_wrong_dim(k):  # over the heads (dim 0): raises where there are more heads than keys
    out = torch.ones(k.shape[1], dtype=torch.bool)
    out[k.argmax(0)] = False
    out[k.argmin(0)] = False
    return out


CORPUS = {
    "01.1": {
        "right": [attention_einsum, attention_float64, attention_numpy, attention_quarter_roots, attention_logsumexp,
                  attention_loop, attention_torch_fused],
        "wrong": [
            (lambda Q, K, V: (lambda w: (w @ V, w))((Q @ K.mT / math.sqrt(Q.size(-1))).softmax(-1)),
             "return only the output, not (output, weights)"),
            (lambda Q, K, V: (Q @ K.transpose(-2, -1)).softmax(-1) @ V, "the scores are not scaled"),
            (lambda Q, K, V: (Q @ K.transpose(-2, -1) / Q.size(-1)).softmax(-1) @ V, "divided by d_k, their variance"),
            (lambda Q, K, V: (Q @ K.mT * math.sqrt(Q.size(-1))).softmax(-1) @ V, "multiplied by sqrt(d_k)"),
            (lambda Q, K, V: (Q @ K.mT / Q.size(-1) ** 1 / 2).softmax(-1) @ V, "divided by 2·d_k: in Python"),
            (lambda Q, K, V: (Q @ K.mT / (Q.size(-1) ** 1 / 2)).softmax(-1) @ V, "divided by d_k / 2: in Python"),
            (lambda Q, K, V: (Q @ K.mT / int(math.sqrt(Q.size(-1)))).softmax(-1) @ V, "rounded to a whole number"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(K.size(-2))).softmax(-1) @ V, "the scale uses the number of keys"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(Q.size(-2))).softmax(-1) @ V, "the number of queries"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(V.size(-1))).softmax(-1) @ V, "the width of the values"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(len(Q))).softmax(-1) @ V, "uses Q.shape[0] (len(Q))"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(Q.shape[1])).softmax(-1) @ V, "reads d_k from Q.shape[1]"),
            (lambda Q, K, V: (lambda s: (s / s.std()).softmax(-1) @ V)(Q @ K.mT), "their own measured spread (their"),
            (lambda Q, K, V: (lambda s: (s / s.std(-1, keepdim=True)).softmax(-1) @ V)(Q @ K.mT), "row by row"),
            (lambda Q, K, V: (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).softmax(-2) @ V,
             "runs over the queries (dim=-2)"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(Q.size(-1))).softmax(0) @ V, "runs over axis 0"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(Q.size(-1))).softmax(1) @ V, "runs over axis 1 (dim=1)"),
            (attention_no_dim, "the softmax is given no axis"),
            (lambda Q, K, V: (K @ Q.mT / math.sqrt(Q.size(-1))).softmax(-1) @ V, "the scores are transposed (K Qᵀ)"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(Q.size(-1))).softmax(-1).mT @ V, "the weights are transposed"),
            (lambda Q, K, V: (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).softmax(-1), "matrix of weights"),
            (lambda Q, K, V: (Q @ K.mT).softmax(-1) @ V / math.sqrt(Q.size(-1)), "after the softmax"),
            (lambda Q, K, V: torch.sigmoid(Q @ K.mT / math.sqrt(Q.size(-1))) @ V, "a sigmoid of the scores"),
            (lambda Q, K, V: (Q @ K.mT / math.sqrt(Q.size(-1))).log_softmax(-1) @ V, "log-probabilities"),
            (lambda Q, K, V: (lambda s: s / s.sum(-1, keepdim=True))(Q @ K.mT / math.sqrt(Q.size(-1))) @ V,
             "exponentiates them first"),
            (attention_exp_by_hand, "e^x overflows there"),
            (attention_exp_float64, "e^x overflows there"),
            (attention_global_max, "not the largest of the whole matrix"),
            (attention_mm, "1 batch axis in front of [L, d_k]"),  # raises on the first case with a batch axis
            (attention_dot_T, "1 batch axis in front of [L, d_k]"),
            (lambda Q, K, V: (Q @ K.transpose(1, 2) / math.sqrt(Q.size(-1))).softmax(-1) @ V, "raised IndexError"),
            (attention_two_params, "keep the given parameters"),
            (3, "expected a function, got an int (3)"),
            (lambda Q, K, V: Q @ K, "raised RuntimeError"),
            (lambda Q, K, V: "softmax", "should be a number or a tensor, got a string"),
        ],
    },
    "01.2": {
        "right": [query_numpy, query_float64_loop],
        "wrong": [
            (lambda K, j, weight: K[j] * math.log(weight * (K.size(0) - 1) / (1 - weight)),
             "without the 1/sqrt(d_k) scaling"),
            (lambda K, j, weight: K[j] * math.log(weight / (1 - weight)) * math.sqrt(K.size(1)),
             "the other 4 keys share"),
            (lambda K, j, weight: K[j] * weight, "not 0.9"),
            (lambda K, j, w: K[j] * abs(math.log(w * (K.size(0) - 1) / (1 - w))) * math.sqrt(K.size(1)),
             "score *lower*"),
            (lambda K, j, w: K[j, :2], "has shape [2]; expected [8]"),
        ],
    },
    "02.1": {
        "right": [holds_numpy, holds_by_viewing, holds_loop,
                  lambda h, T, dk, head, pos: [divmod((head * T + pos) * dk + f, h * dk) for f in range(dk)],
                  # a list of tensor pairs, as list() of a [d_k, 2] tensor gives
                  lambda h, T, dk, head, pos: [torch.tensor(divmod((head * T + pos) * dk + f, h * dk))
                                               for f in range(dk)]],
        "wrong": [
            (lambda h, T, dk, head, pos: [(pos, head * dk + f) for f in range(dk)], "where the right split"),
            (lambda h, T, dk, head, pos: [(head, pos * dk + f) for f in range(dk)], "tokens and heads swapped"),
            (lambda h, T, dk, head, pos: [divmod(head * T + pos * dk + f, h * dk) for f in range(dk)],
             "T·d_k numbers, not T"),
            (lambda h, T, dk, head, pos: [divmod(head * h * dk + pos * dk + f, h * dk) for f in range(dk)],
             "T·d_k numbers, not d_model"),
            (lambda h, T, dk, head, pos: [divmod(head * T * dk + pos * h * dk + f, h * dk) for f in range(dk)],
             "skips d_k numbers, not d_model"),
            (lambda h, T, dk, head, pos: [divmod((head * T + pos) * dk + f, dk) for f in range(dk)],
             "a row of d_model"),
            (holds_as_first_feature, "list of (token, feature) pairs"),
            (lambda h, T, dk, head, pos: [divmod((head * T + pos) * dk + f + 1, h * dk) for f in range(dk)],
             "Count how many numbers come before"),
        ],
    },
    "02.2": {
        "right": [relabel_loop, relabel_numpy, relabel_by_view, relabel_permutation_matrix],
        "wrong": [
            (relabel_inverse, "moved the heads the other way"),
            (relabel_o_rows, "not rows"),
            (relabel_o_kept, "W_O must move with the heads"),
            (relabel_mistaken(qkv="columns"), "not columns"),
            (relabel_mistaken(move_v=False), "the values must move"),
            (relabel_mistaken(move_qk=False), "queries and keys must move"),
            (relabel_mistaken(qkv="none"), "own projections must move too"),
            (lambda W_Q, W_K, W_V, W_O, n_heads, order: (W_Q, W_K, W_V, W_O), "new head p is not old head"),
            (lambda W_Q, W_K, W_V, W_O, n_heads, order: (W_Q[list(order)], W_K, W_V, W_O), "has shape"),
            (lambda W_Q, W_K, W_V, W_O, n_heads, order: (W_Q, W_K, W_V), "return the four new weights"),
        ],
    },
    "02.3": {
        "right": [window_tril_triu, window_numpy, window_loop, window_from_causal],
        "wrong": [
            (lambda T, w: ~window_tril_triu(T, w), "inverted"),
            (lambda T, w: window_tril_triu(T, w).T, "transposed"),
            (lambda T, w: torch.ones(T, T).tril().bool(), "that is the causal mask"),
            (lambda T, w: (_offsets(T) >= 0) & (_offsets(T) <= w), "window + 1 keys"),
            (lambda T, w: (_offsets(T) >= 0) & (_offsets(T) < w - 1), "window - 1 keys"),
            (lambda T, w: (_offsets(T) > 0) & (_offsets(T) <= w), "must see itself"),
            (lambda T, w: _offsets(T).abs() < w, "causal too"),
            (lambda T, w: window_tril_triu(T, w).float(), "return a boolean"),
            (lambda T, w: torch.ones(T, T).tril().triu(-w % T).bool(), "whatever T"),
        ],
    },
    "02.4": {
        "right": [mha_einsum, mha_numpy, mha_with_mhalab_sdpa, mha_torch_sdpa],
        "wrong": [
            (mha_with_torch_module, "your answer calls `torch.nn.MultiheadAttention`, which this exercise asks you"),
            (mha_with_torch_functional, "calls `torch.nn.functional.multi_head_attention_forward`"),
            (mha_with_mhalab_module, "calls the course's own `mhalab.attention.MultiHeadAttention`"),
            (mha_with_weights, "return only the output, not (output, weights)"),
            (lambda x, W_Q, W_K, W_V, W_O, n_heads: x @ W_V.T, "stage 2 of 6 (one head, one token): W_O is missing"),
            (lambda x, W_Q, W_K, W_V, W_O, n_heads: x, "stage 2 of 6"),
            (lambda x, W_Q, W_K, W_V, W_O: x, "keep the given parameters"),
            (lambda x, W_Q, W_K, W_V, W_O, n_heads: (x @ W_Q.T @ W_K @ x.mT).softmax(-1) @ x @ W_V.T @ W_O.T,
             "stage 3 of 6"),
            (mha_mistaken(swapped=True), "stage 3 of 6 (the scores): Q and K are swapped"),
            (mha_mistaken(over=-2), "stage 3 of 6 (the scores): the softmax runs over the queries"),
            (mha_mistaken(allowed_diagonal=-1, fill=-1e9),
             "the last token does not see itself"),  # -1e9: no NaN at stage 2
            (mha_masking(lambda T: torch.ones(T, T, dtype=torch.bool).tril()),
             "Is your mask inverted?"),  # masked what is allowed
            (mha_masking(lambda T: torch.ones(T, T).triu() == 0),
             "your mask is flipped"),  # masked the past
        ],
    },
    "04.1": {
        "right": [lambda d_model, n_heads, n_kv_heads=None, d_head=None: math.floor(
                      2 * (n_kv_heads or n_heads) * (d_head or d_model // n_heads) / n_heads) + 1,
                  crossover_by_loop, crossover_numpy, crossover_with_mhalab_count],
        "wrong": [
            (crossover_mistaken("ceil"), "compare strictly"),
            (crossover_mistaken("floor"), "round up past the length"),
            (crossover_mistaken("round"), "rounding to the nearest length"),
            (crossover_mistaken("equal"), "a sequence is a whole number of tokens"),
            (crossover_mistaken("K only"), "that is half the crossover"),
            (crossover_mistaken("one head"), "every query head has its own [T, T] pattern"),
            (crossover_mistaken("no GQA"), "only the n_kv_heads K/V heads are stored"),
            (crossover_mistaken("d_model/h"), "it need not be d_model / n_heads"),
            (crossover_mistaken("d_model wide"), "each K/V head is d_head wide, not d_model"),
            (crossover_mistaken("2 d_model"), "2 * d_model per token is the cache only"),
            (crossover_mistaken("inverse"), "not its inverse"),
            (crossover_mistaken("None is one"), "n_kv_heads=None means one K/V head per query head"),
            (crossover_mistaken("causal half"), "the pattern still holds all T x T numbers"),
            (crossover_mistaken("one token"), "not with one token's"),
            (lambda d_model, n_heads, n_kv_heads=None, d_head=None: (n_heads, 2 * d_model),
             "should be a whole number"),
        ],
    },
    "04.2": {
        "right": [lambda config, seq_len, memory_bytes, bytes_per_value: int(
                      memory_bytes / (2 * config["n_layers"] * config["n_key_value_heads"] * config["d_head"] * seq_len
                                      * bytes_per_value)),
                  batch_by_loop, batch_numpy, batch_with_kv_cache_per_token],
        "wrong": [
            (lambda c, t, m, b: m // (2 * c["n_layers"] * c["n_heads"] * c["d_head"] * t * b),
             "full multi-head attention"),
            (lambda c, t, m, b: m // (c["n_layers"] * c["n_key_value_heads"] * c["d_head"] * t * b),
             "both the keys and the values"),
            (lambda c, t, m, b: m // (2 * c["n_key_value_heads"] * c["d_head"] * t * b),
             "every layer keeps its own cache"),
            (lambda c, t, m, b: m // (2 * c["n_layers"] * c["n_key_value_heads"] * (c["d_model"] // c["n_heads"])
                                      * t * b),
             "it need not be d_model / n_heads"),
            (lambda c, t, m, b: -(-m // (2 * c["n_layers"] * c["n_key_value_heads"] * c["d_head"] * t * b)),
             "round down"),
            (lambda c, t, m, b: m / (2 * c["n_layers"] * c["n_key_value_heads"] * c["d_head"] * t * b),
             "should be a whole number"),
            (lambda c, t, m, b: m // (2 * c["n_layers"] * c["n_key_value_heads"] * c["d_head"] * t), "bytes_per_value"),
            (lambda c, t, m: 1, "keep the given parameters"),
        ],
    },
    "04.3": {
        "right": [gqa_decoded, gqa_expand_einsum, gqa_float64, gqa_with_mhalab_attention_pooled],
        "wrong": [
            (lambda x, W_Q, W_K, W_V, W_O, h, g: _gqa(x, W_Q, W_K, W_V, W_O, h, g, causal=False), "mask the future"),
            (lambda x, W_Q, W_K, W_V, W_O, h, g: _gqa(x, W_Q, W_K, W_V, W_O, h, g, interleave=False), "repeat cycles"),
            (lambda x, W_Q, W_K, W_V, W_O, h, g: _gqa(x, W_Q, W_K, W_V, W_O, h, g, scale=False), "not scaled"),
            (lambda x, W_Q, W_K, W_V, W_O, h, g: _gqa(x, W_Q, W_K, W_V, W_O, h, g, merge=False),
             "merged in the wrong order"),
            (lambda x, W_Q, W_K, W_V, W_O, h, g: _gqa(x, W_Q, W_K, W_V, W_O, h, g, out=False), "W_O is missing"),
            (gqa_mistaken(swapped=True), "Q and K are swapped"),
            (gqa_mistaken(over=-2), "the softmax runs over the queries"),
            (gqa_mistaken(allowed_diagonal=-1, fill=-1e9), "does not see its own key"),
            (gqa_mistaken(values="repeat"), "the values with .repeat"),
        ],
    },
    "05.1": {
        "right": [rank_numpy, rank_tensor, rank_simulated, rank_loop],
        "wrong": [
            (lambda dm, dh, q, k: min(dh, len(q), len(k)), "section 2's min(d_k, T)"),
            (lambda dm, dh, q, k: min(dm, dh, len(q), len(k)), "count distinct tokens, not positions"),
            (lambda dm, dh, q, k: min(dh, len(set(q.tolist())), len(set(k.tolist()))),
             "d_head may be larger than d_model"),
            (lambda dm, dh, q, k: min(dm, len(set(q.tolist())), len(set(k.tolist()))), "own width d_head"),
            (lambda dm, dh, q, k: min(dm, dh, len(set(q.tolist()) | set(k.tolist()))), "of both together"),
            (lambda dm, dh, q, k: min(dm, dh, len(set(q.tolist()))), "the keys bound the rank too"),
            (lambda dm, dh, q, k: min(dm, dh, len(set(k.tolist()))), "the queries bound the rank too"),
            (lambda dm, dh, q, k: min(dm, dh, len(set(q.tolist()) & set(k.tolist()))), "need not be the same token"),
            (lambda dm, dh, q, k: min(dm, dh), "the tokens bound the rank too"),
            (lambda dm, dh, q, k: (dm, dh), "should be a whole number"),
        ],
    },
    "05.2": {
        "right": [look_back_full_circle_float32, look_back_numpy, look_back_loop],
        "wrong": [
            (lambda T, o: _circle(T, o, 2 * math.pi / T, 60.0), "puts only"),   # section 2's radius, for any length
            (lambda T, o: _circle(T, -o, math.pi / T, 1e5), "look forward"),
            (lambda T, o: _circle(T, 0, math.pi / T, 1e5), "peaks at its own key"),
            (lambda T, o: _circle(T, o, 6 * math.pi / T, 1e5), "different directions"),
            (lambda T, o: tuple(t.T for t in _circle(T, o, math.pi / T, 1e5)), "expected [16, 2]"),
            (lambda T, o: _circle(T, o, math.pi / T, 1e5)[0], "return a pair (Q, K)"),
            (lambda T, o: tuple(reversed(look_back_numpy(T, o))), "Q and K are swapped"),
        ],
    },
    "05.3": {
        "right": [favourite_numpy, favourite_loop,
                  lambda queries, keys: torch.where(queries > 0, keys.argmax(), keys.argmin()).double()],
        "wrong": [
            (lambda q, k: k.argmax().expand(len(q)), "which end of the keys"),
            (lambda q, k: torch.where(q > 0, k.argmin(), k.argmax()), "which end of the keys"),
            (lambda q, k: torch.arange(len(q)) % len(k), "wrong key"),
            (lambda q, k: (q[:, None] * k[None, :]).softmax(-1).argmax(-1), "never builds it"),
            (lambda q, k: np.argmax(np.outer(q.numpy(), k.numpy()), axis=1),
             "never builds it"),  # the L x S matrix in NumPy
        ],
    },
    "05.4": {
        "right": [radius_math, radius_newton_numpy, radius_softmax_float32],
        "wrong": [
            (lambda n, w: _bisect(lambda R: 1 / (1 + math.exp(-R * (1 - math.cos(2 * math.pi / n)))), w)
             if n > 1 else 0.0, "one nearest rival"),
            (lambda n, w: max(0.0, math.log(2 * w / (1 - w)) / (1 - math.cos(2 * math.pi / n))) if n > 1 else 0.0,
             "only the two nearest rivals"),
            (lambda n, w: math.log(2 * w / (1 - w)) / (1 - math.cos(2 * math.pi / n)) if n > 1 else 0.0,
             "negative"),
            (lambda n, w: max(0.0, math.log(2 * w / (1 - w)) * n * n / (2 * math.pi**2)), "small-angle margin"),
            (lambda n, w: max(0.0, math.log((n - 1) * w / (1 - w)) / (1 - math.cos(2 * math.pi / n)))
             if n > 1 else 0.0, "every rival at the nearest one's margin"),
            (lambda n, w: _bisect(lambda R: _weight_on_key(R, n, own=False), w) if n > 1 else 0.0,
             "own term belongs in the softmax's denominator"),
            (lambda n, w: _bisect(lambda R: _weight_on_key(R, n, scale=2 ** -0.5), w), "not scaled"),
            (lambda n, w: _bisect(lambda R: _weight_on_key(R, n, arc=math.pi), w), "whole circle"),
            (radius_overflowing, "overflows float64"),
            (lambda n, w: (radius_math(n, w), w), "return one number"),
        ],
    },
    "07.1": {
        "right": [ablate_by_pattern, ablate_register_hook, ablate_in_place_with_block],
        "wrong": [
            (lambda model, tokens, layer, head: model(tokens), "nothing changed"),
            (lambda m, t, l, h: _run_zeroing(m, t, l, lambda z: z.__setitem__((slice(None), h), 0.0)),
             "a query position, not a head"),
            (lambda m, t, l, h: _run_zeroing(m, t, l, lambda z: z.__setitem__((slice(None), slice(None)), 0.0)),
             "every head of the layer, not one"),
            (lambda m, t, l, h: _run_zeroing(m, t, (l + 1) % m.config.n_layers,
                                             lambda z: z.__setitem__((slice(None), slice(None), h), 0.0)),
             "not of layer"),
            (ablate_leaky, "still runs with a head off"),
            (ablate_with_mhalab, "mhalab.head_interventions.ablate_heads"),
            (ablate_with_ablation_module, "mhalab.ablation"),
            (lambda m, t, l: m(t), "keep the given parameters"),
        ],
    },
    "07.2": {
        "right": [carrier_loop_numpy, carrier_by_sources, carrier_tensor_pairs],
        "wrong": [
            (carrier_mistaken(mirror=True), "you read the key at q - offset"),
            (carrier_mistaken(shift=1), "one position to the right"),
            (carrier_mistaken(shift=-1), "one position to the left"),
            (carrier_mistaken(edge="clamp"), "do not read the first or last position instead"),
            (carrier_mistaken(edge="wrap"), "wraps round"),
            (carrier_mistaken(both=True), "not every key at that distance"),
            (carrier_mistaken(stat="top"), "how often the relation's key is a query's top key"),
            (carrier_mistaken(stat="max"), "single largest weight"),
            (carrier_mistaken(first=True), "the first sequence of the batch only"),
            (carrier_mistaken(layers="first"), "searched the first layer only"),
            (carrier_mistaken(layers="last"), "searched the last layer only"),
            (carrier_mistaken(index="layers"), "divmod it by n_heads, not n_layers"),
            (carrier_mistaken(tie="last"), "name the first in (layer, head) order"),
            (carrier_mistaken(form="flat"), "not one number"),
            (carrier_mistaken(form="by offset"), "keyed by its name"),
            (carrier_mistaken(form="head"), "(layer, head) pair"),
            (lambda patterns, offsets: {n: best_heads_by_library(patterns, n, o) for n, o in offsets.items()},
             "mhalab.head_roles"),
        ],
    },
    "07.3": {
        "right": [budget_numpy_loop, budget_sorted_list,
                  lambda d, t: (torch.as_tensor(d).flatten().sort().values.cumsum(0) <= t).sum()],   # a 0-d tensor
        "wrong": [
            (budget_mistaken(alone=True), "each cost at most the threshold on their own"),
            (budget_mistaken(strict=True), "(<=, not <)"),
            (budget_mistaken(one_more=True), "cannot go too"),
            (budget_mistaken(order="descending"), "remove the cheapest heads first"),
            (budget_mistaken(order="given"), "sort the heads by their cost first"),
            (budget_mistaken(clip=True), "no clipping at 0"),
            (budget_mistaken(order="size"), "not by its size"),
            (budget_mistaken(per_layer=True), "not layer by layer"),
            (budget_mistaken(mean=True), "not their mean"),
            (lambda d, t: budget_numpy_loop(d, t) / d.numel(), "should be a whole number"),
            (lambda d, t: torch.as_tensor(d).flatten().sort().values.cumsum(0) <= t, "got a boolean tensor"),
        ],
    },
    "03.1": {
        "right": [causal_allowed_tril,
                  lambda n_queries, n_keys: np.tril(np.ones((n_queries, n_keys), dtype=bool), n_keys - n_queries)],
        "wrong": [
            (lambda n_queries, n_keys: torch.ones(n_queries, n_keys).tril().bool(), "they are the *last* 3 positions"),
            (lambda n_queries, n_keys: torch.ones(n_queries, n_keys).triu(n_keys - n_queries).bool(), "transposed"),
            (lambda L, S: torch.ones(L, S).tril(S - L - 1).bool(), "each query misses its own key"),
            (lambda L, S: torch.ones(L, S).tril(S - L + 1).bool(), "also sees the key just after it"),
            (lambda L, S: torch.ones(L, S).tril(L - S).bool(), "the offset has the wrong sign"),
            (lambda L, S: torch.ones(L, S).tril(S - L), "boolean tensor"),
        ],
    },
    "03.2": {
        "right": [reach_sets, reach_numpy_any, reach_measured,
                  lambda b, s, p, S, T: tuple(torch.as_tensor(x).int() for x in reach_sets(b, s, p, S, T))],  # 0/1
        "wrong": [
            (reach_mistaken(encoder="causal"), "the encoder has no mask"),
            (reach_mistaken(decoder="earlier"), "the causal mask is inverted"),
            (reach_mistaken(decoder="all"), "cannot reach the positions before t"),
            (reach_mistaken(decoder="from t - 1"), "off by one on the diagonal"),
            (reach_mistaken(cross="same index"), "not only the one with the same index"),
            (reach_mistaken(cross="causal"), "cross-attention is not causal"),
            (reach_mistaken(cross="target too"), "no other target position reads it"),
            (reach_mistaken(cross="target later"), "does not spread a target change to the later positions"),
            (reach_mistaken(decoder="reads source"), "decoder self-attention reads only the target stream"),
            (reach_mistaken(cross="swapped"), "never into the source"),
            (reach_mistaken(encoder="reads target"), "a target change never reaches the source stream"),
            (reach_mistaken(itself=False), "mark its own position"),
            (reach_mistaken(last_only=True), "what an earlier block changed stays changed"),
            (reach_mistaken(swap=True), "in that order"),
            (lambda b, s, p, S, T: torch.cat([torch.tensor(x) for x in reach_sets(b, s, p, S, T)]), "return a pair"),
            (lambda b, s, p, S, T: tuple(torch.tensor(x).nonzero().flatten() for x in reach_sets(b, s, p, S, T)),
             "one entry per source position"),
        ],
    },
    "03.3": {
        "right": [lambda n_heads, encoder_layers, decoder_layers: (
                      encoder_layers + 2 * decoder_layers - 1 if encoder_layers and decoder_layers
                      else encoder_layers + decoder_layers),
                  critical_path_by_steps, critical_path_longest_chain, critical_path_tensor],
        "wrong": [
            (lambda h, e, d: _blocks(e, d), "every block one after another"),
            (lambda h, e, d: (e + 2 * d - 1 if e and d else e + d) * h, "count blocks, not heads"),
            (lambda h, e, d: _blocks(e, d) * h, "that counts every head of every block"),
            (lambda h, e, d: max(e, 2 * d) if e else d, "it waits for the encoder's last layer"),
            (lambda h, e, d: e + d, "a decoder layer is two steps"),
            (lambda h, e, d: max(e, d) + 1 if e and d else e + d, "which the cross-attention of the layer below"),
            (lambda h, e, d: 1, "the blocks cannot all run at once"),
            (lambda h, e, d: e + 2 * d - 1, "holds only when there are both an encoder and a decoder"),
            (lambda h, e, d: e + 2 * d - 1 if e else d, "an encoder-only model has nothing to run beside"),
            (lambda h, e, d: e + 2 * d - 1 if d else e, "each decoder layer is one block"),
            (lambda h, e, d: _blocks(e, d) - 1, "only an encoder-decoder has a block that need not wait"),
            (lambda h, e, d: max(e, 1) + 2 * d - 1 if d else e, "nothing runs beside its first block"),
            (lambda h, e, d: (e + 2 * d - 1 if e and d else e + d, _blocks(e, d) * h), "return one whole number"),
        ],
    },
    "08.3": {
        "right": [offsets_loops, offsets_numpy_queries, offsets_by_relation_score, offsets_stacked],
        "wrong": [
            (lambda p, K: offsets_loops(torch.nn.functional.pad(p, (1, 1, 1, 1)), K), "[CLS] and [SEP] count neither"),
            (_offsets_reading(queries_inner=False), "do not count as queries either"),
            (_offsets_reading(edges_zero=True), "a query without a key at offset k"),
            (_offsets_reading(total=True), "that is the sum over the queries"),
            (_offsets_reading(flip=True), "the key at query + k"),
            (_offsets_range_argmax, "you took the most negative offset first"),
            (_offsets_reading(tie_last=True), "you kept the last of the tied ones"),
            (_offsets_reading(inclusive=False), "both ends included"),
            (_offsets_reading(zero=True), "offset 0 (the token itself)"),
            (_offsets_reading(first=True), "the first sequence of the batch only"),
            (_offsets_reading(over_heads=True), "the mean also runs over the heads"),
            (_offsets_reading(index=True), "not its position in your list"),
            (_offsets_argmax_nan, "a mean is NaN"),
            (lambda p, K: offsets_loops(p, K)[0], "return a pair (offsets, means)"),
        ],
    },
    "08.2": {
        "right": [share_einsum, share_numpy, share_loops,
                  lambda p, v, k: share_einsum(p.double(), v.double(), k).float().numpy()],
        "wrong": [
            (lambda p, v, k: share_einsum(p, torch.ones_like(v), k), "that is the weight share"),
            (lambda p, v, k: share_einsum(torch.ones_like(p), v, k), "the weights count too"),
            (_share_pooled, "you divided the sums over the queries"),
            (lambda p, v, k: share_einsum(p.transpose(-1, -2), v, k), "the keys are the last axis"),
            (_share_all_queries, "leave the given keys out as queries"),
            (lambda p, v, k: share_einsum(p[:1], v[:1], k), "the first sentence of the batch only"),
            (lambda p, v, k: (lambda m: m.norm(dim=-1))(torch.einsum("bhqk,bkhd->bhqd", p[..., k], v[:, k]))
             .div(torch.einsum("bhqk,bkhd->bhqd", p, v).norm(dim=-1))[..., [q for q in range(p.shape[-1])
                                                                           if q not in k]].mean(dim=(0, 2)),
             "not the norm of the summed output"),
            (lambda p, v, k: share_einsum(p, v, k).mean().expand(p.shape[1]), "every head gets the same share"),
            (lambda p, v, k: share_einsum(p, v, k).mean(), "one share per head"),
        ],
    },
    "08.1": {
        "right": [p_by_full_gap, p_numpy, p_by_mismatched, p_recursive],
        "wrong": [
            (lambda S: _p_reading(S, lambda p: True, lambda s, t: s > t), "(>=, not >): ties count, and the true"),
            (lambda S: _p_reading(S, lambda p: list(p) != sorted(p)) * (1 - 1 / math.factorial(len(S))),
             "count it, so p is at least 1/n!"),
            (lambda S: _p_reading(S, lambda p: list(p) != sorted(p)) if len(S) > 1 else 1.0,
             "in the count and in the n! you divide by"),
            (lambda S: _p_reading(S, lambda p: True, lambda s, t: s <= t), "at least the true one's"),
            (lambda S: _p_reading(S, lambda p: True, divide=False), "not their count"),
            (_p_rows_and_columns, "the columns) only"),
            (_p_gap_against_mean, "compare like with like"),
            (lambda S: _p_reading(S, lambda p: all(i != j for i, j in enumerate(p))) if len(S) > 1 else 1.0,
             "not only those that break every pair"),
            (lambda S: _p_reading(S, lambda p: sum(i != j for i, j in enumerate(p)) <= 2), "not only the swaps of two"),
            (_p_sampled, "it does not sample them"),
            (lambda S: (lambda n, t: sum(bool(S[torch.arange(n), torch.tensor(p)].sum() > t or p == tuple(range(n)))
                                         for p in __import__("itertools").permutations(range(n)))
                        / math.factorial(n))(len(S), S.diagonal().sum()), "re-pairings that tie with the true"),
            (lambda S: p_by_full_gap(S) if len(S) > 1 else  # the gap of one pair: 0 / 0
             (S.diagonal().mean() - (S.sum() - S.trace()) / (len(S) ** 2 - len(S))).item(), "one pairing, the true"),
        ],
    },
    "09.1": {
        "right": [fit_by_mhalab, fit_numpy, fit_float_room,
                  lambda config, seq_len, batch, memory_bytes, bytes_per_value: torch.tensor(
                      _fit_with(config, seq_len, batch, memory_bytes, bytes_per_value))],
        "wrong": [
            (lambda *case: _fit_with(*case, divides=False), "must divide n_heads"),
            (lambda *case: _fit_with(*case, divides=False, cap=False), "at most n_heads"),
            (lambda *case: _fit_with(*case, strict=True), "compare with <=, not <"),
            (lambda c, *rest: _fit_with(c, *rest, d_head=c.d_model // c.n_heads), "need not be d_model / n_heads"),
            (lambda *case: _fit_with(*case, two=1), "a key and a value per token"),
            (lambda *case: _fit_with(*case, layers=False), "multiply by n_layers"),
            (lambda *case: _fit_with(*case, with_batch=False), "multiply by batch"),
            (lambda *case: _fit_with(*case, with_bytes=False), "multiply the numbers by bytes_per_value"),
            (lambda *case: _fit_with(*case, largest=False), "not the smallest"),
            (lambda c, *rest: c.n_heads // max(_fit_with(c, *rest), 1) if _fit_with(c, *rest) else 0,
             "query heads per K/V head"),
            (lambda *case: max(_fit_with(*case), 1), "when not even one K/V head fits, return 0"),
            (lambda config, seq_len, batch, memory_bytes, bytes_per_value: (lambda per: max(
                [g for g in range(1, min(memory_bytes // per, config.n_heads) + 1) if config.n_heads % g == 0],
                default=0))(2 * config.n_key_value_heads * config.d_head * config.n_layers * seq_len * batch
                            * bytes_per_value), "the count the model has now"),
            (lambda *case: _fit_with(*case) or None, "you returned None"),
            (lambda *case: _fit_with(*case) + 0.5, "whole number"),
            (lambda *case: _fit_with(*case, divides=False, strict=True), "the answer is"),
        ],
    },
    "09.2": {
        "right": [targets_two_dicts, targets_by_keys, targets_numpy],
        "wrong": [
            (lambda tokens: _targets_with(tokens, first=True), "first occurrence"),
            (lambda tokens: _targets_with(tokens, follower=0, self_ok=True), "the earlier occurrence itself"),
            (lambda tokens: _targets_with(tokens, self_ok=True), "the target must come before the query"),
            (lambda tokens: _targets_with(tokens, adjacent_none=True), "look further back"),
            (lambda tokens: [i + 1 for i in range(len(tokens))], "own position"),
            (lambda tokens: _targets_with(tokens, none=0), "return -1 (0 is a position"),
            (lambda tokens: [None if t < 0 else t for t in _targets_with(tokens)], "not None"),
            (lambda tokens: torch.tensor(_targets_with(tokens))[None], "a 1-D sequence"),
            (lambda tokens: _targets_with(tokens)[:-1], "one target per position"),
            (lambda tokens: _targets_with(tokens, follower=2), "the position right after the most recent"),
        ],
    },
    "09.3": {
        "right": [second_copy_one_predicate_hook, second_copy_forward_hooks, second_copy_caching_everything,
                  second_copy_watching_patterns, second_copy_zero_pattern],
        "wrong": [
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, positions=slice(None)), "stage 1 of 3 (no head off)"),
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, positions=slice(None)), "over the whole sequence"),
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, positions=slice(L + 1, None)), "leaves out"),
            (lambda m, t, heads, L: _second_copy(m, t, [], L), "stage 2 of 3 (one head off)"),
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, axis=1), "query positions, not heads"),
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, layers=[heads[-1][0]] if heads else None),
             "stage 3 of 3"),
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, layers=[heads[-1][0]] if heads else None),
             "only the heads of one layer"),
            (lambda m, t, heads, L: _second_copy(m, t, heads, L, keep_hooks=True), "still runs with heads off"),
            (second_copy_with_ablate, "mhalab.ablation"),
            (second_copy_with_gate_heads, "mhalab.head_interventions.gate_heads"),
            (lambda m, t, heads: 0.0, "keep the given parameters"),
        ],
    },
    "11.1": {
        "right": [floor_closed_form, floor_numpy, floor_tensor, floor_float32,
            lambda vocab_size, period, seq_len, window: sum(
                math.log(vocab_size) * ((t < period) - (u < period)) for t, u in
                zip(range(seq_len - 1 - window, seq_len - 1), range(window))) / window],
        "wrong": [
            (lambda V, P, T, w: _floor_with(V, P, T, w, log=math.log2), "not log2 V"),
            (lambda V, P, T, w: -_floor_with(V, P, T, w), "the sign is flipped"),
            (lambda V, P, T, w: _floor_with(V, P, T, w, first=P - 1), "the first repeated token"),
            (lambda V, P, T, w: _floor_with(V, P, T, w, first=P + 1), "the target at position `period` is already"),
            (lambda V, P, T, w: _floor_with(V, P, T, w, n=T), "there are seq_len - 1 targets"),
            (lambda V, P, T, w: math.log(V) * (max(0, min(P, T - 1) - (T - 1 - w)) - w) / w,
             "the early window is not all guesses"),
            (lambda V, P, T, w: -math.log(V) * min(w, P) / w, "the late window is not all known"),
            (lambda V, P, T, w: -math.log(V), "count those targets in each window"),
            (_floor_halves, "count those targets in each window"),
            (lambda V, P, T, w: [_floor_with(V, P, T, w)], "one number"),
        ],
    },
    "11.2": {
        "right": [circuit_loop, circuit_numpy, circuit_per_sequence, circuit_argmax, circuit_period_found],
        "wrong": [
            (lambda t, p: tuple(x[::-1] for x in _circuit_with(t, p)), "(layer, head), in that order"),
            (lambda t, p: _circuit_with(t, p)[::-1], "the induction head comes first"),
            (lambda t, p: _circuit_with(t, p, shift=0), "the earlier copy of the query's token itself"),
            (_circuit_fixed_offset, "a fixed distance back (a positional head)"),
            (_circuit_first_sequence, "a fixed distance back (a positional head)"),
            (lambda t, p: _circuit_with(t, p, layers=[len(p) - 1]), "need not be in the last layer"),
            (lambda t, p: _circuit_with(t, p, below=lambda layer: range(len(p))), "in a layer *below* the induction"),
            (lambda t, p: _circuit_with(t, p, below=lambda layer: range(layer + 1)), "not in its own layer"),
            (lambda t, p: _circuit_with(t, p, below=lambda layer: [layer - 1]), "not only the one just below"),
            (lambda t, p: _circuit_with(t, p, prev_offset=0), "attends to the query's own position"),
            (_circuit_half_offset, "the induction head is the head that attends most"),
            (_circuit_head_roles, "mhalab.head_roles"),
            (lambda t, p: _circuit_with(t, p)[0], "return ((layer, head), (layer, head))"),
        ],
    },
    "12.1": {
        "right": [qk_circuit_by_slicing, qk_circuit_svd, qk_circuit_numpy, qk_circuit_tensor_rank],
        "wrong": [
            (lambda m, l, h: (lambda p: (p.W_K @ p.W_Q.T, 4))(m.blocks[l].attn.head_projections(h)), "the transpose"),
            (lambda m, l, h: (m.QK[l, h].AB, int(torch.linalg.matrix_rank(m.QK[l, h].AB))),  # section 1's tool
             "`model.QK` folds the LayerNorm in"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T / p.W_Q.shape[1] ** 0.5, 4))(
                m.blocks[l].attn.head_projections(h)),
             "without the 1/sqrt(d_head)"),
            (lambda m, l, h: (lambda p: (p.W_Q.T @ p.W_K, 4))(m.blocks[l].attn.head_projections(h)),
             "[d_head, d_head]"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T, p.W_Q.shape[1]))(m.blocks[l].attn.head_projections(h)),
             "not always equal to it"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T, torch.linalg.matrix_rank((p.W_Q @ p.W_K.T).double())))(
                m.blocks[l].attn.head_projections(h)), "take the rank in the dtype of the product"),
            (_qk_made_up_group, "query head j reads K/V head j // (H // G)"),
            (_qk_made_up_group, "stage 2 of 5 (grouped-query: 4 query heads share 2 K/V heads)"),
            (lambda m, l, h: (lambda a, d: (lambda W: (W, int(torch.linalg.matrix_rank(W))))(
                a.qkv_proj.weight[h * d:(h + 1) * d].T
                @ a.qkv_proj.weight[(a.n_heads + h // a.n_key_value_heads) * d:
                                    (a.n_heads + h // a.n_key_value_heads + 1) * d]))(
                m.blocks[l].attn, m.blocks[l].attn.d_head), "query head j reads K/V head j // (H // G)"),
            (_qk_made_up_group, "query head j reads K/V head j // (H // G), here 0"),
            (_qk_svd_loose, "your tolerance is looser than the rounding"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T, torch.linalg.matrix_rank(p.W_Q @ p.W_K.T, rtol=1e-3)))(
                m.blocks[l].attn.head_projections(h)), "your tolerance is looser than the rounding"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T, torch.linalg.matrix_rank(p.W_Q)))(
                m.blocks[l].attn.head_projections(h)), "that is the rank of W_Q alone"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T, torch.linalg.matrix_rank(p.W_K)))(
                m.blocks[l].attn.head_projections(h)), "that is the rank of W_K alone"),
            (_qk_smaller_rank, "the smaller of the two ranks, a bound"),
            (_qk_alive_count, "counts the directions alive on both sides"),
            (lambda m, l, h: (lambda p: (p.W_Q @ p.W_K.T, [3]))(m.blocks[l].attn.head_projections(h)),
             "the rank should be one whole number"),
            (lambda m, l, h: m.blocks[l].attn.head_projections(h).W_Q, "return two things"),
        ],
    },
    "12.2": {
        "right": [copying_small_side, copying_trace, copying_numpy, copying_tensor, copying_numpy_float32,
                  copying_loop],
        "wrong": [
            (lambda E, V, O, U: (lambda l: (l.real.sum() / l.abs().sum()).item())(torch.linalg.eigvals(V @ O)),
             "W_V W_O alone"),
            (lambda E, V, O, U: (lambda s: (s.sum() / s.abs().sum()).item())(torch.linalg.svdvals(E @ V @ O @ U)),
             "a score of exactly 1 whatever the circuit"),
            (_copying_moduli_over_moduli, "the numerator is the sum of the *real parts* Re λ"),
            (lambda E, V, O, U: (lambda l: (l.real.sum() / l.real.abs().sum()).item())(
                torch.linalg.eigvals(E @ V @ O @ U)),
             "not by |Re λ|"),
            (lambda E, V, O, U: (lambda l: (l.abs().sum() / l.real.abs().sum()).item())(
                torch.linalg.eigvals(E @ V @ O @ U)),
             "not of their moduli"),
            (lambda E, V, O, U: torch.linalg.eigvals(E @ V @ O @ U).real.sum().item(),
             "the sum of the real parts alone"),
            (lambda E, V, O, U: (torch.trace(E @ V @ O @ U) / torch.linalg.svdvals(E @ V @ O @ U).sum()).item(),
             "not of the singular values (the nuclear norm)"),
            (lambda E, V, O, U: torch.trace(E @ V @ O @ U).item() / (E @ V @ O @ U).norm().item(), "copying_score("),
            (_copying_diagonal_top, "copying_score("),
        ],
    },
    "12.3": {
        "right": [dla_einsum, dla_logits, dla_numpy],
        "wrong": [
            (lambda r, s, U, a, b: (r * (U.T[a] - U.T[b])).sum(-1),
             "divide the head's output by the final norm's scale"),
            (lambda r, s, U, a, b: (r * s * (U.T[a] - U.T[b])).sum(-1), "do not multiply"),
            (lambda r, s, U, a, b: (r / s * U.T[a]).sum(-1), "subtract the wrong token's"),
            (lambda r, s, U, a, b: (r / s * (U.T[b] - U.T[a])).sum(-1), "the sign is flipped"),
            (lambda r, s, U, a, b: (r / r.pow(2).mean(-1, keepdim=True).sqrt() * (U.T[a] - U.T[b])).sum(-1),
             "not the RMS of this head's own output"),
            (lambda r, s, U, a, b: (r / s * (U.T[a] - U.T[b])).sum(), "shape"),
        ],
    },
    "06.1": {
        "right": [enough_numpy_ints, enough_tensor_items, enough_by_width, enough_array,
                  lambda d_model, tables, keys: [h for h in range(1, d_model + 1) if d_model % h == 0 and
                                                 h >= tables and (d_model // h > 1 or 2 * h >= tables * keys)]],
        "wrong": [
            (_enough_no_divisor, "a head count must divide d_model"),
            (_enough_min_d_k, "width one is not ruled out by its width alone"),
            (_enough_every_head_two, "not limited to two favourites: its query can point at any entry"),
            (_enough_strict_thin, "compare with >=, not >"),
            (_enough_keys_only, "not n_keys"),
            (_enough_thin_always, "a head of width one has at most two favourites"),
            (lambda d, t, k: _enough_reading(d, t, k, thin=lambda h: 2 * h >= t * k), "fewer heads than tables blend"),
            (lambda d, t, k: _enough_reading(d, t, k, wide=lambda h, d_k: h > t, thin=lambda h: 2 * h >= t * k),
             "h >= n_tables, not h > n_tables"),
            (lambda d, t, k: _enough_reading(d, t, k, wide=lambda h, d_k: h >= t, thin=lambda h: 2 * h >= t * k,
                                             min_width=3), "d_k >= 2, not d_k > 2"),
            (lambda d, t, k: sorted(d // h for h in enough_numpy_ints(d, t, k)), "return the head counts h"),
            (_enough_smallest, "not only the smallest"),
            (lambda d, t, k: set(enough_numpy_ints(d, t, k)), "as a list of whole numbers"),
            (lambda d, t, k: len(enough_numpy_ints(d, t, k)), "as a list of whole numbers"),
            (lambda d, t, k: enough_numpy_ints(d, t, k) * 2, "more than once"),
        ],
    },
    "06.2": {
        "right": [trade_numpy, trade_sorted, trade_tensor,
                  lambda acc: ["no seed", "some seeds", "every seed"][
                      (lambda n: 2 if n == len(acc) else 1 if n else 0)(
                          sum(max(a[min(a)], a[max(a)]) < max(a.values()) for a in acc.values()))]],
        "wrong": [
            (_trade_mean, "the mean over seeds can show the trade where a seed does not"),
            (_trade_dict_order, "not the first and last keys"),
            (lambda acc: _verdict_of([max(a[min(a)], a[max(a)]) <= max(a.values()) for a in acc.values()]),
             "compare strictly"),
            (_trade_argmax_inside, "whichever head count max() names first"),
            (lambda acc: _verdict_of([a[min(a)] < max(a.values()) for a in acc.values()]),
             "the most heads as well as the fewest"),
            (lambda acc: _verdict_of([a[max(a)] < max(a.values()) for a in acc.values()]),
             "the fewest heads as well as the most"),
            (lambda acc: _trade_all_or_none(dict(list(acc.items())[:1])), "that reads the first seed only"),
            (_trade_any, "one seed showing the trade is not every seed"),
            (_trade_all_or_none, "the verdict is 'some seeds', not 'no seed'"),
            (_trade_best_anywhere, "not with the best over all seeds"),
            (_trade_neighbours, "an end below its neighbour is not enough"),
            (lambda acc: trade_tensor(acc) == "every seed", "return one of 'every seed', 'some seeds', 'no seed'"),
            (lambda acc: "all seeds", "return one of"),
        ],
    },
    "13.1": {
        "right": [never_loop, never_numpy, never_counts, never_list, never_numpy_bool],
        "wrong": [
            (_never_argmax, "argmax and argmin pick one of tied keys"),
            (_never_ties_equal, "keys that tie for a row's largest"),
            (_never_only_max, "a row's smallest key is within reach too"),
            (_never_reachable, "you marked the keys some head *can* favour"),
            (_never_every_head, "one head is enough"),
            (_never_whole_table, "not of the whole table"),
            (_never_wrong_dim, "not over the heads"),
            (lambda k: never_counts(k.T), "values, one per head: return one per stored key"),
            (_never_no_key, "no stored key is out of reach of every head"),
            (_never_no_key_numpy, "no stored key is out of reach of every head"),
            (lambda k: torch.ones(k.shape[1], dtype=torch.bool), "keys in the middle of every row are out of reach"),
            (lambda k: (lambda m: torch.ones(k.shape[1], dtype=torch.bool).index_fill(0, torch.stack(
                [m.argmax(), m.argmin()]), False))(k.mean(0)), "the heads are not averaged"),
            (lambda k: int(never_counts(k).sum()), "return a tensor of"),
            (lambda k: k.softmax(1).mean(0), "return True/False per stored key"),
        ],
    },
}

# Answers to 07 and 08 written from the prompts alone, in several styles (issue 30): tests/labs_learners.py.
from labs_learners import RIGHT as _LEARNERS_RIGHT  # noqa: E402
from labs_learners import WRONG as _LEARNERS_WRONG  # noqa: E402

for _key, _answers in _LEARNERS_RIGHT.items():
    CORPUS[_key]["right"] += _answers
for _key, _answers in _LEARNERS_WRONG.items():
    CORPUS[_key]["wrong"] += _answers

from labs_learners import second_copy_zeroing_v, second_copy_zeroing_v_group  # noqa: E402

# Wrong answers whose message once blamed a mistake they did not make (issue 47): each must fail with the message
# the corpus names above, and that message must not say this.
MISBLAMED = {
    "09.3": [(second_copy_zeroing_v, "nothing was switched off"),
             (second_copy_zeroing_v_group, "nothing was switched off")],
    "11.2": [(_circuit_first_sequence, "the earlier copy"), (_circuit_half_offset, "positional head")],
    "12.2": [(_copying_moduli_over_moduli, "not of the singular values")],
    "06.2": [(answer, "read each seed on its own") for answer, _ in CORPUS["06.2"]["wrong"]
             if answer is not _trade_mean],
    "13.1": [(_never_no_key, "one per head"), (_never_no_key_numpy, "one per head")],
}


def as_the_corpus_asks(kind: str, expected: str, status: str, message: str) -> bool:
    """Whether a verdict ``(status, message)`` is what the corpus asks of an entry: a ``"right"`` answer passes with
    "correct."; a ``"wrong"`` one fails (or errors) with ``expected`` in its message. The one criterion the tests
    of q.check, of the grade and tools/corpus_table.py judge by."""
    from mhalab.labs.verdicts import ERROR, FAILED, PASSED

    if kind == "right":
        return (status, message) == (PASSED, "correct.")
    return status in (FAILED, ERROR) and expected in message


def names_a_fixed_case(expected: str) -> bool:
    """Whether a wrong answer's expected message names one of q.check's fixed cases (a stage, a shape), which a
    grading run's fresh cases need not hold: then only its failing is compared there."""
    return expected.startswith("stage") or "[3, 3]" in expected


