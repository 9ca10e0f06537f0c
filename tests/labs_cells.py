"""Whole answer cells of notebooks 08 and 09 as learners wrote them, from the prompt, the hints and the notebook's
own code above the exercise, before seeing the solution (issue 30): the honest side of the copy flag's
measurement (tests/test_labs_copying.py). tests/labs_learners.py adds each one's function to the right answers."""

from __future__ import annotations

# Natural answers to short exercises are close to the published solution: there is one obvious way.
CELLS = {
    "08.1": [
        "def paraphrase_gap(similarity):\n"
        "    n = similarity.shape[0]\n"
        "    true_pairs = similarity.diagonal().mean()\n"
        "    off_diagonal = similarity[~torch.eye(n, dtype=torch.bool)].mean()\n"
        "    return (true_pairs - off_diagonal).item()\n\nq1.check(paraphrase_gap)",
        "def paraphrase_gap(similarity):\n"
        "    n = len(similarity)\n"
        "    diag = torch.diagonal(similarity)\n"
        "    matched = diag.sum() / n\n"
        "    mismatched = (similarity.sum() - diag.sum()) / (n * n - n)\n"
        "    return float(matched - mismatched)\n\nq1.check(paraphrase_gap)",
        # following the hint
        "def paraphrase_gap(similarity):\n"
        "    n = similarity.shape[0]\n"
        "    matched = similarity.diagonal().mean()\n"
        "    mismatched = (similarity.sum() - similarity.trace()) / (n * n - n)\n"
        "    return (matched - mismatched).item()\n\nq1.check(paraphrase_gap)",
    ],
    "08.2": [
        "def hide_cls_and_sep(pattern):\n"
        "    p = pattern.clone()\n"
        "    p[:, :, :, 0] = 0\n"
        "    p[:, :, :, -1] = 0\n"
        "    s = p.sum(dim=-1, keepdim=True)\n"
        "    return torch.where(s > 0, p / s, torch.zeros_like(p))\n\nq2.check(hide_cls_and_sep)",
        "def hide_cls_and_sep(pattern):\n"
        "    mask = torch.ones(pattern.shape[-1])\n"
        "    mask[0] = 0\n"
        "    mask[-1] = 0\n"
        "    kept = pattern * mask\n"
        "    row_sums = kept.sum(-1, keepdim=True)\n"
        "    return torch.nan_to_num(kept / row_sums, nan=0.0)\n\nq2.check(hide_cls_and_sep)",
    ],
    "08.3": [
        "def previous_token_scores(cache):\n"
        "    scores = []\n"
        "    for layer in range(len(cache)):\n"
        "        pattern = cache['pattern', layer]                # [batch, head, query, key]\n"
        "        prev = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)  # [batch, head, T-1]\n"
        "        scores.append(prev.mean(dim=(0, 2)))\n"
        "    return torch.stack(scores)\n\nq3.check(previous_token_scores)",
        "def previous_token_scores(cache):\n"
        "    n_layers = len(cache)\n"
        "    out = []\n"
        "    for i in range(n_layers):\n"
        "        A = cache[f\"blocks.{i}.attn.hook_pattern\"]\n"
        "        out.append(torch.diagonal(A, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)))\n"
        "    return torch.stack(out)\n\nq3.check(previous_token_scores)",
        # following the two hints word for word
        "def previous_token_scores(cache):\n"
        "    rows = []\n"
        "    for i in range(len(cache)):\n"
        "        pattern = cache[f'blocks.{i}.attn.hook_pattern']\n"
        "        d = torch.diagonal(pattern, offset=-1, dim1=-2, dim2=-1)\n"
        "        rows.append(d.mean(dim=(0, 2)))\n"
        "    return torch.stack(rows)\n\nq3.check(previous_token_scores)",
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

