"""Whole answer cells of notebooks 08 and 09 as learners wrote them, from the prompt, the hints and the notebook's
own code above the exercise, before seeing the solution (issue 30): the honest side of the copy flag's
measurement (tests/test_labs_copying.py). tests/labs_learners.py adds each one's function to the right answers."""

from __future__ import annotations

# Natural answers to short exercises are close to the published solution: there is one obvious way.
CELLS = {
    "08.1": [
        "import itertools\n\n"
        "def gap_p_value(similarity):\n"
        "    n = similarity.shape[0]\n"
        "    # the total never changes, so a wider gap means a larger mean over the matched entries\n"
        "    true_mean = similarity.diagonal().mean()\n"
        "    perms = list(itertools.permutations(range(n)))\n"
        "    at_least = 0\n"
        "    for perm in perms:\n"
        "        matched = similarity[torch.arange(n), torch.tensor(perm)].mean()\n"
        "        if matched >= true_mean:\n"
        "            at_least += 1\n"
        "    return at_least / len(perms)\n\nq1.check(gap_p_value)",
        "from itertools import permutations\n\n"
        "def gap_p_value(similarity):\n"
        "    S = similarity.double()\n"
        "    n = len(S)\n"
        "    true = S.trace()\n"
        "    sums = torch.tensor([S[range(n), list(p)].sum() for p in permutations(range(n))])\n"
        "    return (sums >= true).float().mean().item()\n\nq1.check(gap_p_value)",
        # following the hints
        "import itertools\n\n"
        "def gap_p_value(similarity):\n"
        "    n = similarity.shape[0]\n"
        "    true_matched = sum(similarity[i, i] for i in range(n))\n"
        "    count = 0\n"
        "    for sigma in itertools.permutations(range(n)):\n"
        "        if sum(similarity[i, sigma[i]] for i in range(n)) >= true_matched:\n"
        "            count += 1\n"
        "    return count / math.factorial(n)\n\nq1.check(gap_p_value)",
    ],
    "08.2": [
        "def norm_share(pattern, values_out, keys):\n"
        "    B, H, T, _ = pattern.shape\n"
        "    lengths = torch.linalg.norm(values_out, dim=3).transpose(1, 2)   # B, H, T\n"
        "    weighted = pattern * lengths.unsqueeze(2)\n"
        "    on_keys = weighted[:, :, :, keys].sum(dim=3)\n"
        "    total = weighted.sum(dim=3)\n"
        "    keep = torch.ones(T, dtype=torch.bool)\n"
        "    keep[keys] = False\n"
        "    return (on_keys / total)[:, :, keep].mean(dim=2).mean(dim=0)\n\nq2.check(norm_share)",
        "def norm_share(pattern, values_out, keys):\n"
        "    B, H, T, _ = pattern.shape\n"
        "    result = []\n"
        "    for h in range(H):\n"
        "        n = values_out[:, :, h].norm(dim=-1)   # [B, T]\n"
        "        c = pattern[:, h] * n[:, None, :]      # [B, T, T]\n"
        "        s = c[:, :, keys].sum(-1) / c.sum(-1)  # [B, T]\n"
        "        rows = [q for q in range(T) if q not in keys]\n"
        "        result.append(s[:, rows].mean())\n"
        "    return torch.stack(result)\n\nq2.check(norm_share)",
    ],
    "08.3": [
        "def best_offset(pattern, max_offset):\n"
        "    inner = pattern[:, :, 1:-1, 1:-1]          # real tokens only\n"
        "    L = inner.shape[-1]\n"
        "    offsets = []\n"
        "    for d in range(1, max_offset + 1):\n"
        "        offsets += [-d, d]                     # ties: nearer first, previous first\n"
        "    offsets = [k for k in offsets if abs(k) < L]\n"
        "    scores = torch.stack([inner.diagonal(k, dim1=-2, dim2=-1).mean(dim=(0, 2)) for k in offsets])  # [K, H]\n"
        "    best = scores.argmax(dim=0)                # first max wins\n"
        "    return torch.tensor(offsets)[best], scores.max(dim=0).values\n\nq3.check(best_offset)",
        "def best_offset(pattern, max_offset):\n"
        "    B, H, T, _ = pattern.shape\n"
        "    best_k = [0] * H\n"
        "    best_w = [-1.0] * H\n"
        "    for d in range(1, max_offset + 1):\n"
        "        for k in [-d, d]:\n"
        "            queries = [q for q in range(1, T - 1) if 1 <= q + k <= T - 2]\n"
        "            if not queries:\n"
        "                continue\n"
        "            w = pattern[:, :, queries, [q + k for q in queries]].mean(dim=(0, 2))   # [H]\n"
        "            for h in range(H):\n"
        "                if w[h] > best_w[h]:\n"
        "                    best_k[h], best_w[h] = k, w[h].item()\n"
        "    return best_k, best_w\n\nq3.check(best_offset)",
        # following the two hints
        "def best_offset(pattern, max_offset):\n"
        "    inner = pattern[..., 1:-1, 1:-1]\n"
        "    L = inner.shape[-1]\n"
        "    n_heads = pattern.shape[1]\n"
        "    offsets = [0] * n_heads\n"
        "    means = [float('-inf')] * n_heads\n"
        "    for d in range(1, max_offset + 1):\n"
        "        for k in (-d, d):\n"
        "            if abs(k) >= L:\n"
        "                continue\n"
        "            m = torch.diagonal(inner, offset=k, dim1=-2, dim2=-1).mean(dim=(0, 2))\n"
        "            for h in range(n_heads):\n"
        "                if m[h] > means[h]:\n"
        "                    offsets[h], means[h] = k, m[h].item()\n"
        "    return offsets, means\n\nq3.check(best_offset)",
    ],
    "09.1": [
        "def kv_heads_that_fit(config, seq_len, batch, memory_bytes, bytes_per_value):\n"
        "    per_head = 2 * config.n_layers * config.d_head * seq_len * batch * bytes_per_value\n"
        "    best = 0\n"
        "    for g in range(1, config.n_heads + 1):\n"
        "        if config.n_heads % g == 0 and g * per_head <= memory_bytes:\n"
        "            best = g\n"
        "    return best\n\nq1.check(kv_heads_that_fit)",
        # following the two hints: one K/V head's bytes over the batch, then the possible g from the largest down
        "def kv_heads_that_fit(config, seq_len, batch, memory_bytes, bytes_per_value):\n"
        "    one_kv_head = 2 * config.d_head * bytes_per_value * config.n_layers * seq_len * batch\n"
        "    possible = [g for g in range(1, config.n_heads + 1) if config.n_heads % g == 0]\n"
        "    for g in sorted(possible, reverse=True):\n"
        "        if g * one_kv_head <= memory_bytes:\n"
        "            return g\n"
        "    return 0\n\nq1.check(kv_heads_that_fit)",
    ],
    "09.2": [
        "def induction_targets(tokens):\n"
        "    tokens = tokens.tolist()\n"
        "    out = [-1] * len(tokens)\n"
        "    for i in range(len(tokens)):\n"
        "        for p in reversed(range(i - 1)):\n"
        "            if tokens[p] == tokens[i]:\n"
        "                out[i] = p + 1\n"
        "                break\n"
        "    return out\n\nq2.check(induction_targets)",
        "def induction_targets(tokens):\n"
        "    last = {}          # token -> its positions so far\n"
        "    targets = []\n"
        "    for i, t in enumerate(tokens.tolist()):\n"
        "        candidates = [p + 1 for p in last.get(t, []) if p + 1 < i]\n"
        "        targets.append(max(candidates) if candidates else -1)\n"
        "        last.setdefault(t, []).append(i)\n"
        "    return targets\n\nq2.check(induction_targets)",
        # following the two hints word for word: walk back, latest first, skip p = i - 1
        "def induction_targets(tokens):\n"
        "    tokens = tokens.tolist()\n"
        "    targets = []\n"
        "    for i, token in enumerate(tokens):\n"
        "        target = -1\n"
        "        for p in range(i - 1, -1, -1):\n"
        "            if tokens[p] == token and p + 1 < i:\n"
        "                target = p + 1\n"
        "                break\n"
        "        targets.append(target)\n"
        "    return targets\n\nq2.check(induction_targets)",
    ],
    "09.3": [
        "def second_copy_loss(model, tokens, heads, L):\n"
        "    hooks = []\n"
        "    for layer in set(l for l, h in heads):\n"
        "        to_zero = [h for l, h in heads if l == layer]\n"
        "        def zero_heads(z, hook, to_zero=to_zero):\n"
        "            z = z.clone()\n"
        "            z[:, :, to_zero] = 0\n"
        "            return z\n"
        "        hooks.append((f'blocks.{layer}.attn.hook_z', zero_heads))\n"
        "    with torch.no_grad():\n"
        "        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)\n"
        "    loss = F.cross_entropy(logits[:, L:-1].reshape(-1, logits.shape[-1]), tokens[:, L + 1:].reshape(-1))\n"
        "    return loss.item()\n\nq3.check(second_copy_loss)",
        "def second_copy_loss(model, tokens, heads, L):\n"
        "    def hook_fn(z, hook):\n"
        "        layer = int(hook.name.split('.')[1])\n"
        "        off = [h for l, h in heads if l == layer]\n"
        "        if off:\n"
        "            z = z.clone()\n"
        "            z[:, :, off, :] = 0.0\n"
        "        return z\n"
        "    names = [f'blocks.{l}.attn.hook_z' for l in range(model.config.n_layers)]\n"
        "    with torch.no_grad():\n"
        "        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, hook_fn) for name in names])\n"
        "    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction='none')  # [B, 2L]\n"
        "    return nll[:, L:].mean().item()\n\nq3.check(second_copy_loss)",
        # following the two hints: one (name, hook) pair per layer, the mean cross-entropy at positions L .. 2L-1
        "def second_copy_loss(model, tokens, heads, L):\n"
        "    def make_hook(layer):\n"
        "        def hook(z, hook):\n"
        "            z = z.clone()\n"
        "            for l, h in heads:\n"
        "                if l == layer:\n"
        "                    z[:, :, h] = 0.0\n"
        "            return z\n"
        "        return hook\n"
        "    fwd_hooks = [(f'blocks.{layer}.attn.hook_z', make_hook(layer)) for layer in {l for l, _ in heads}]\n"
        "    with torch.no_grad():\n"
        "        logits = model.run_with_hooks(tokens, fwd_hooks=fwd_hooks)\n"
        "    logits, targets = logits[:, :-1], tokens[:, 1:]\n"
        "    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction='none').view(targets.shape)\n"
        "    return nll[:, L:].mean().item()\n\nq3.check(second_copy_loss)",
    ],
}

