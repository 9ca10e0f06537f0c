"""Exercises of notebook 08 (a real LLM): the KV cache's bytes per token from a model's config, an induction
score read from a cache, and the in-context loss with chosen heads switched off by a hook.

Exercise 1 runs on hidden configs (SmolLM2's, one whose d_head is not d_model / n_heads, one without grouped
K/V heads); exercise 2 on caches of random patterns over ``[start, copy, copy]`` sequences; exercise 3 on small
hidden causal models (mhalab's toy ``Transformer``), staged: no head off, one head, heads in two layers. The
answer to exercise 3 may run a model and attach hooks, but one that calls the course's own ablation
(``ablate``, ``ablate_heads``, ``gate_heads``) scores 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..hooks import run_with_hooks
from ..models import ModelConfig, Transformer
from .checks import call_answer, expect_shape, expect_whole, judge, name_miss, observe
from .core import Exercise, Wrong, register


# ------------------------------------------------------------------------------------ exercise 1
@dataclass(frozen=True)
class _Config:
    """The fields of a model config that the KV cache depends on (and some it does not)."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    vocab_size: int = 49152

    def __repr__(self) -> str:
        return (f"Config(d_model={self.d_model}, n_layers={self.n_layers}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, d_head={self.d_head})")


_CONFIGS = [
    (_Config(576, 30, 9, 3, 64), 4, "SmolLM2-135M in float32, as loaded here"),
    (_Config(2048, 16, 32, 8, 64), 2, "a grouped-query model in 16-bit floats"),
    (_Config(3072, 28, 24, 8, 96), 2, "d_head 96, not d_model / n_heads = 128"),
    (_Config(512, 6, 8, 8, 80), 1, "full multi-head attention (n_kv_heads = n_heads), d_head 80 != 512 / 8, 1-byte values"),
]


def _kv_reference(config, bytes_per_value: int) -> int:
    return 2 * config.n_layers * config.n_kv_heads * config.d_head * bytes_per_value


def _check_kv(kv_cache_bytes_per_token) -> None:
    for config, b, what in _CONFIGS:
        label = f"{config!r}, bytes_per_value={b} ({what})"
        got = expect_whole(call_answer(kv_cache_bytes_per_token, config, b, label=label), "the result")
        want = _kv_reference(config, b)
        if got != want:
            c = config
            raise Wrong(f"kv_cache_bytes_per_token({label}): got {got:,}; " + (name_miss(got, [
                (2 * c.n_layers * c.n_heads * c.d_head * b, "that is full multi-head attention (a key and a value per query head): only the n_kv_heads K/V heads are cached"),
                (c.n_layers * c.n_kv_heads * c.d_head * b, "the cache holds both the keys and the values"),
                (2 * c.n_kv_heads * c.d_head * b, "every layer keeps its own cache: multiply by n_layers"),
                (2 * c.n_layers * c.n_kv_heads * (c.d_model // c.n_heads) * b, "use the config's d_head: it need not be d_model / n_heads"),
                (2 * c.n_layers * c.n_kv_heads * c.d_head, "multiply by bytes_per_value: that is a count of numbers, not bytes"),
            ]) or "count the numbers a token leaves in the cache of every layer, then their bytes"))


register(Exercise(
    "08", 1, "KV-cache bytes per token from a config",
    _check_kv,
    hint="Per token and per layer the cache holds one key and one value for each K/V head, each d_head numbers. "
         "Read n_layers, n_kv_heads and d_head from the config (config.n_kv_heads, ...).",
    solution=(
        "def kv_cache_bytes_per_token(config, bytes_per_value):\n"
        "    numbers = 2 * config.n_kv_heads * config.d_head      # a key and a value per K/V head\n"
        "    return numbers * config.n_layers * bytes_per_value   # every layer has its own cache"
    ),
    reference=_kv_reference,
))


# ------------------------------------------------------------------------------------ exercise 2
def _induction_reference(cache, L: int) -> torch.Tensor:
    queries = torch.arange(L + 1, 2 * L + 1)  # the second copy (position 0 is the start token)
    return torch.stack([p[:, :, queries, queries - L + 1].mean(dim=(0, 2)) for p in cache.values()])  # [N, H]


def _induction_cases() -> list:
    g = torch.Generator().manual_seed(11)
    cases = []
    for N, B, H, L in [(2, 2, 3, 5), (3, 1, 4, 7), (1, 2, 2, 3)]:
        T = 1 + 2 * L
        scores = torch.randn(N, B, H, T, T, generator=g) * 3
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        cache = {f"blocks.{i}.attn.hook_pattern": scores[i].softmax(-1) for i in range(N)}
        cases.append((cache, L))
    return cases


def _check_induction(induction_from_cache) -> None:
    for cache, L in _induction_cases():
        N = len(cache)
        B, H, T, _ = next(iter(cache.values())).shape
        label = f"a cache of {N} layers [{B}, {H}, {T}, {T}], L={L}"
        got = call_answer(induction_from_cache, cache, L, label=label)
        try:
            expect_shape(got, (N, H), "the result")
        except Wrong as wrong:
            raise Wrong(f"induction_from_cache({label}): {wrong} ([n_layers, n_heads])") from None
        P = list(cache.values())

        def score(offset, queries):
            q = torch.tensor(queries)
            return torch.stack([p[:, :, q, q - offset].mean(dim=(0, 2)) for p in P])

        second = list(range(L + 1, 2 * L + 1))
        judge(got, _induction_reference(cache, L), f"induction_from_cache({label})", lambda: {
            "that is the attention to the earlier copy of the *same* token (q - L), a duplicate-token score; an "
            "induction head looks at the token *after* it, q - L + 1": score(L, second),
            "that is the token two after the earlier copy (q - L + 2); the induction target is q - L + 1": score(L - 2, second),
            "the queries should be the second copy only (positions L+1 .. 2L): the first copy has nothing earlier to "
            "copy from (and q - L + 1 < 0 there wraps around to the end)": score(L - 1, list(range(1, 2 * L + 1))),
            "the second copy starts at position L + 1 (position 0 is the start token): the queries are L+1 .. 2L":
                score(L - 1, list(range(L, 2 * L))),
        })


register(Exercise(
    "08", 2, "an induction score",
    _check_induction,
    hint=["The sequence is [start, t_1..t_L, t_1..t_L]: the token at position q >= L + 1 of the second copy first "
          "appeared at position q - L. An induction head looks at the token that came *after* that one.",
          "For queries q = L+1 .. 2L, average pattern[:, :, q, q - L + 1] over the batch and the queries, per layer "
          "(cache[f'blocks.{i}.attn.hook_pattern']), and stack the layers: [n_layers, n_heads]."],
    solution=(
        "def induction_from_cache(cache, L):\n"
        "    queries = torch.arange(L + 1, 2 * L + 1)                   # the second copy\n"
        "    rows = []\n"
        "    for i in range(len(cache)):\n"
        "        pattern = cache[f'blocks.{i}.attn.hook_pattern']           # [B, H, T, T]\n"
        "        rows.append(pattern[:, :, queries, queries - L + 1].mean(dim=(0, 2)))   # the token after the earlier copy\n"
        "    return torch.stack(rows)                                   # [n_layers, n_heads]"
    ),
    reference=_induction_reference,
))


# ------------------------------------------------------------------------------------ exercise 3
_USES = ("mhalab.models", "mhalab.attention", "mhalab.hooks.run_with_hooks", "mhalab.hooks.run_with_cache",
         "mhalab.hooks.hooks_attached", "mhalab.hooks.hook_points", "mhalab.hooks.attention_modules")
_FORBID = ("mhalab.hooks.ablate_heads", "mhalab.hooks.gate_heads", "mhalab.ablation")

_MODELS = [(dict(vocab_size=17, d_model=24, n_heads=3, n_layers=2, max_len=32, causal=True), 3, 2, 6),
           (dict(vocab_size=23, d_model=32, n_heads=4, n_layers=3, max_len=32, causal=True), 4, 1, 8)]


def _models():
    out = []
    for config, seed, B, L in _MODELS:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = Transformer(ModelConfig(**config)).eval()
            for p in model.parameters():  # larger weights than at initialisation, so every head matters
                p.data.mul_(3.0)
        g = torch.Generator().manual_seed(seed + 10)
        copy = torch.randint(1, config["vocab_size"], (B, L), generator=g)
        tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long), copy, copy], dim=1)  # [B, 1 + 2L]
        out.append((model, tokens, L))
    return out


def _loss_with(model, tokens, heads, L, *, positions=None, axis=2):
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def hook_for(hs):
        def hook(z, point):  # z: [B, T, H, d_head]
            z = z.clone()
            index = [slice(None)] * z.dim()
            index[axis] = hs
            z[tuple(index)] = 0.0
            return z
        return hook

    hooks = [(f"blocks.{layer}.attn.hook_z", hook_for(hs)) for layer, hs in by_layer.items()]
    with torch.no_grad():
        logits = run_with_hooks(model, tokens, fwd_hooks=hooks)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(tokens.size(0), -1)
    return float((nll[:, L:] if positions is None else nll[:, positions]).mean())


def _second_copy_reference(model, tokens, heads, L) -> float:
    return _loss_with(model, tokens, heads, L)


def _check_second_copy(second_copy_loss) -> None:
    for model, tokens, L in _models():
        N, H = model.config.n_layers, model.config.n_heads
        with torch.no_grad():
            clean = model(tokens)
        stages = [("stage 1 of 3 (no head off)", []), ("stage 2 of 3 (one head off)", [(0, H - 1)]),
                  ("stage 3 of 3 (heads in two layers off)", [(0, 0), (N - 1, 1), (N - 1, 2)])]
        for stage, heads in stages:
            label = f"a {N}-layer model with {H} heads, tokens {list(tokens.shape)}, heads={heads}, L={L}"
            got = call_answer(second_copy_loss, model, tokens, list(heads), L, label=label, copy_args=False,
                              uses=_USES, forbid=_FORBID)
            if observe(lambda: not torch.equal(model(tokens).detach(), clean)):
                raise Wrong(f"{stage}, second_copy_loss({label}): after your function returned, the model still runs with "
                            "heads off. Remove the hooks when you are done (run_with_hooks and hooks_attached do it for you)")
            want = _second_copy_reference(model, tokens, heads, L)
            others = [(l, h) for l in range(N) for h in range(H) if (l, h) not in heads]
            judge(got, want, f"{stage}, second_copy_loss({label})", lambda: {
                "that is the loss over the whole sequence; the in-context loss is on the second copy only "
                "(predictions from positions L .. 2L-1)": _loss_with(model, tokens, heads, L, positions=slice(None)),
                "that is the loss on the first copy; the second copy's tokens are predicted from positions L .. 2L-1":
                    _loss_with(model, tokens, heads, L, positions=slice(0, L)),
                "the positions are off by one: logits at position p predict the token at p + 1":
                    _loss_with(model, tokens, heads, L, positions=slice(L + 1, None)),
                **({} if not heads else {
                    "nothing was switched off: the loss is the intact model's. Does your hook return the new z, and is it on "
                    "blocks.{layer}.attn.hook_z for every layer you switch heads off in?": _loss_with(model, tokens, [], L),
                    "you zeroed query positions, not heads: z is [batch, position, head, d_head]":
                        _loss_with(model, tokens, heads, L, axis=1),
                    "only the heads of one layer are off; heads may come from several layers (one hook per layer, or one "
                    "hook that looks at hook.name)": _loss_with(model, tokens, [lh for lh in heads if lh[0] == heads[-1][0]], L),
                    "that switches off every head except the ones asked": _loss_with(model, tokens, others, L),
                }),
            })


register(Exercise(
    "08", 3, "switch heads off and measure the in-context loss",
    _check_second_copy,
    hint=["The sequence is [start, copy, copy] with L tokens per copy. The logits at position p predict token p + 1, so "
          "the second copy (tokens L+1 .. 2L) is predicted from positions L .. 2L-1: the in-context loss is the mean "
          "cross-entropy there.",
          "To switch off (layer, head), zero z[:, :, head] at blocks.{layer}.attn.hook_z (z: [batch, position, head, "
          "d_head]). Heads may come from several layers: give run_with_hooks one (name, hook) pair per layer, "
          "or one hook that reads the layer from hook.name."],
    solution=(
        "def second_copy_loss(model, tokens, heads, L):\n"
        "    from mhalab.hooks import run_with_hooks\n"
        "    def switch_off(layer):\n"
        "        def hook(z, point):                                  # z: [batch, position, head, d_head]\n"
        "            z = z.clone()\n"
        "            z[:, :, [h for l, h in heads if l == layer]] = 0.0\n"
        "            return z\n"
        "        return hook\n"
        "    layers = sorted({l for l, h in heads})\n"
        "    hooks = [(f'blocks.{l}.attn.hook_z', switch_off(l)) for l in layers]\n"
        "    with torch.no_grad():\n"
        "        logits = run_with_hooks(model, tokens, fwd_hooks=hooks)          # [B, 1 + 2L, V]\n"
        "    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction='none')\n"
        "    return nll[:, L:].mean().item()                         # predictions of the second copy"
    ),
    reference=_second_copy_reference,
))
