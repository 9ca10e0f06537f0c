"""One analysis, written against TransformerLens's documented API only, runs unchanged on every mhalab model.

``analysis`` below uses nothing mhalab-specific: ``model.run_with_cache`` with a predicate and a list as
``names_filter``, ``cache[name]``, ``cache["pattern", layer]``, ``cache.stack_activation``,
``cache.accumulated_resid``, ``model.run_with_hooks(fwd_hooks=...)`` with hooks ``fn(act, *, hook)``,
``model.hooks(...)``, ``model.reset_hooks()``, a gradient attribution through the output's graph, and
``torch.no_grad()`` to turn gradients off. It would run as it is on a TransformerLens ``HookedTransformer``.
"""

from __future__ import annotations

import pytest
import torch

from mhalab.models import EncoderDecoder, ModelConfig, Transformer


def analysis(model, *inputs):
    """Attention patterns, one head ablated, a gradient attribution per head; returns what it measured."""
    is_pattern = lambda name: name.endswith("attn.hook_pattern")  # noqa: E731
    out, cache = model.run_with_cache(*inputs, names_filter=is_pattern)
    patterns = list(cache.keys())
    assert patterns and all(is_pattern(name) for name in patterns)
    for name in patterns:  # every row of every head's pattern is a distribution over the keys
        rows = cache[name].sum(-1)
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4), name
    if "blocks.0.attn.hook_pattern" in cache:  # TransformerLens's short keys, where the model has blocks.{i}
        assert torch.equal(cache["pattern", 0], cache["blocks.0.attn.hook_pattern"])
        assert torch.equal(cache["pattern", -1], cache[patterns[-1]])
        assert cache.stack_activation("pattern").shape[0] == len(patterns)
        _, resid = model.run_with_cache(*inputs, names_filter=lambda name: "hook_resid_p" in name)
        stream, labels = resid.accumulated_resid(return_labels=True)  # [layers + 1, batch, pos, d_model]
        assert labels[-1] == "final_post" and stream.shape[0] == len(patterns) + 1

    z_name = patterns[0].replace("hook_pattern", "hook_z")
    _, two = model.run_with_cache(*inputs, names_filter=[patterns[0], z_name])
    assert sorted(two.keys()) == sorted([patterns[0], z_name])

    def ablate_head_0(z, *, hook):  # z: [batch, pos, head, d_head]
        z = z.clone()
        z[:, :, 0] = 0.0
        return z

    ablated = model.run_with_hooks(*inputs, fwd_hooks=[(z_name, ablate_head_0)])
    change = (ablated - out).abs().max().item()
    assert change > 0

    kept = {}

    def keep(z, hook):
        z.retain_grad()
        kept[hook.name] = z

    with model.hooks(fwd_hooks=[(z_name, keep)]):
        metric = model(*inputs)[..., 0].sum()
    metric.backward()
    z = kept[z_name]
    attribution = (z * z.grad).sum(dim=(0, 1, 3))  # [head]: first-order effect of each head's output
    assert attribution.abs().sum() > 0
    model.reset_hooks()

    with torch.no_grad():
        out, cache = model.run_with_cache(*inputs, names_filter=[z_name])
    assert not out.requires_grad and not cache[z_name].requires_grad
    return {"patterns": len(patterns), "ablation_change": change, "attribution": attribution}


def _toy_inputs():
    return (torch.randint(0, 11, (2, 6)),)


@pytest.mark.parametrize("kind", ["toy", "encoder_decoder"])
def test_the_analysis_runs_on_the_toy_models(kind):
    torch.manual_seed(0)
    config = ModelConfig(d_vocab=11, d_model=16, n_heads=4, n_layers=2, causal=kind == "toy")
    if kind == "toy":
        model, inputs = Transformer(config).eval(), _toy_inputs()
    else:
        model, inputs = EncoderDecoder(config).eval(), (torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 4)))
    found = analysis(model, *inputs)
    assert found["patterns"] == (2 if kind == "toy" else 6)  # the encoder-decoder: self, causal self, cross
    assert found["attribution"].shape == (4,)


def test_the_analysis_runs_on_minilm(minilm):
    batch = minilm.tokenizer(["The cat sat on the mat.", "Heads attend."])
    found = analysis(minilm, batch.tokens, batch.padding)
    assert found["patterns"] == minilm.config.n_layers and found["attribution"].shape == (minilm.config.n_heads,)


def test_the_analysis_runs_on_smollm2(smollm2):
    found = analysis(smollm2, smollm2.tokenizer("The cat sat on the"))
    assert found["patterns"] == smollm2.config.n_layers and found["attribution"].shape == (smollm2.config.n_heads,)
