"""What a learner types in TransformerLens 4 works on every mhalab model, or is refused saying what to do.

``analysis`` below uses nothing mhalab-specific: ``model.run_with_cache`` with a predicate and a list as
``names_filter``, ``cache[name]``, ``cache["pattern", layer]``, ``cache.stack_activation``,
``cache.accumulated_resid``, ``model.run_with_hooks(fwd_hooks=...)`` with hooks ``fn(act, *, hook)``,
``model.hooks(...)``, ``model.reset_hooks()``, a gradient attribution through the output's graph, and
``torch.no_grad()`` to turn gradients off. It runs as it is on a TransformerLens bridge.

``CALLS`` lists the 29 calls issue 48 found failing or working on a TransformerLens 4.3 bridge in compatibility
mode; ``REFUSED`` says, per model, which cannot apply there and the message that says why (the numbers of what
works are compared with TransformerLens itself in tests/test_transformerlens.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from mhalab.encoder_decoder import EncoderDecoder
from mhalab.factored_matrix import FactoredMatrix
from mhalab.models import ModelConfig, Transformer


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


# ---------------------------------------------------------------------------------------------- the 29 calls
@dataclass
class Subject:
    """A model, what its forward takes, and where its first attention layer is (``blocks.0`` or ``encoder.0``)."""

    model: torch.nn.Module
    inputs: tuple
    first: str = "blocks.0"

    def cache(self):
        with torch.no_grad():
            return self.model.run_with_cache(*self.inputs)[1]

    def factored(self) -> FactoredMatrix:
        if isinstance(self.model, EncoderDecoder):  # no model.QK across two stacks: one layer's own weights
            attn = self.model.encoder[0].attn
            return FactoredMatrix(attn.W_Q[0], attn.W_K[0].T)
        return self.model.QK[0, 0]


def _result_hook(s: Subject):
    """``attn.hook_result`` ``[batch, pos, head, d_model]``, after TransformerLens's switch."""
    name = f"{s.first}.attn.hook_result"
    with pytest.raises(ValueError, match="set_use_attn_result"):
        s.model.run_with_cache(*s.inputs, names_filter=name)  # off by default, as in TransformerLens
    s.model.set_use_attn_result(True)
    try:
        with torch.no_grad():
            out, cache = s.model.run_with_cache(*s.inputs, names_filter=name)
    finally:
        s.model.set_use_attn_result(False)
    attn = s.model.get_submodule(f"{s.first}.attn")
    assert cache[name].shape[-2:] == (attn.n_heads, attn.d_model)
    return cache[name]


def _names(s: Subject, *points: str):
    with torch.no_grad():
        _, cache = s.model.run_with_cache(*s.inputs, names_filter=[f"{s.first}.{p}" for p in points])
    return [cache[f"{s.first}.{p}"] for p in points]


def _no_norms(s: Subject):
    """The same kind of model built without norms (random weights), run on the same inputs."""
    with torch.no_grad():
        return type(s.model)(replace(s.model.cfg, normalization_type=None)).eval()(*s.inputs)


CALLS = {
    "model.cfg": lambda s: s.model.cfg.d_head,
    "model.W_Q": lambda s: s.model.W_Q,
    "model.W_K": lambda s: s.model.W_K,
    "model.W_V": lambda s: s.model.W_V,
    "model.W_O": lambda s: s.model.W_O,
    "model.W_E": lambda s: s.model.W_E,
    "model.W_U": lambda s: s.model.W_U,
    "model.W_pos": lambda s: s.model.W_pos,
    "model.blocks[l].attn.W_Q": lambda s: s.model.blocks[0].attn.W_Q,
    "model.QK[layer, head]": lambda s: s.model.QK[0, 1].AB,
    "model.OV[layer, head]": lambda s: s.model.OV[0, 1].AB,
    'model.all_composition_scores("K")': lambda s: s.model.all_composition_scores("K"),
    'model(tokens, return_type="logits")': lambda s: s.model(*s.inputs, return_type="logits"),
    "cache.stack_head_results(layer=-1, pos_slice=-1)": lambda s: s.cache().stack_head_results(layer=-1, pos_slice=-1),
    "cache.apply_ln_to_stack": lambda s: (c := s.cache()).apply_ln_to_stack(c.decompose_resid(), layer=-1),
    "cache.decompose_resid()": lambda s: s.cache().decompose_resid(),
    "cache.accumulated_resid(apply_ln=True)": lambda s: s.cache().accumulated_resid(apply_ln=True),
    "cache.logit_attrs": lambda s: (c := s.cache()).logit_attrs(c.decompose_resid(), s.inputs[0]),
    "cache.compute_head_results()": lambda s: (c := s.cache()).compute_head_results() or c["result", 0],
    "FactoredMatrix.U": lambda s: s.factored().U,
    "FactoredMatrix.Vh": lambda s: pytest.deprecated_call(lambda: s.factored().Vh),
    "FactoredMatrix.collapse_l()": lambda s: s.factored().collapse_l(),
    "FactoredMatrix.make_even()": lambda s: s.factored().make_even().AB,
    "FactoredMatrix * scalar": lambda s: (2 * s.factored()).AB,
    "attn.hook_result": _result_hook,
    "ln*.hook_scale / hook_normalized": lambda s: _names(s, "ln1.hook_scale", "ln1.hook_normalized"),
    "mlp.hook_pre / hook_post": lambda s: _names(s, "mlp.hook_pre", "mlp.hook_post"),
    "ModelConfig(normalization_type=None)": _no_norms,
    "positional_embedding_type": lambda s: s.model.cfg.positional_embedding_type,
}
assert len(CALLS) == 29

TWO_STACKS = "an EncoderDecoder has two stacks"
BY_FULL_NAME = "EncoderDecoder's points are read by full name"
#: What each model refuses, and the message that says why (every other call works there).
REFUSED = {
    "toy": {},
    "encoder_decoder": {
        **{call: TWO_STACKS for call in ("model.W_Q", "model.W_K", "model.W_V", "model.W_O", "model.blocks[l].attn.W_Q",
                                         "model.QK[layer, head]", "model.OV[layer, head]",
                                         'model.all_composition_scores("K")')},
        **{call: BY_FULL_NAME for call in CALLS if call.startswith("cache.")},
    },
    "minilm": {
        "model.W_U": "no unembedding", "cache.logit_attrs": "no unembedding",
        'model(tokens, return_type="logits")': "MiniLM outputs token vectors",
        "cache.apply_ln_to_stack": "post-norm", "cache.accumulated_resid(apply_ln=True)": "post-norm",
    },
    "smollm2": {"model.W_pos": r"this model has none \(positional_embedding_type='rotary'"},
}


@pytest.fixture(scope="module")
def subjects():
    torch.manual_seed(0)
    config = ModelConfig(d_vocab=11, d_model=16, n_heads=4, n_layers=2, causal=True, n_key_value_heads=2)
    found = {"toy": Subject(Transformer(config).eval(), (torch.randint(0, 11, (2, 6)),)),
             "encoder_decoder": Subject(EncoderDecoder(config).eval(),
                                        (torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 4))), "encoder.0")}
    return found


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("kind", ["toy", "encoder_decoder", "minilm", "smollm2"])
def test_every_call_works_or_says_why_not(kind, call, subjects, request):
    if kind in subjects:
        subject = subjects[kind]
    else:
        model = request.getfixturevalue(kind)
        if kind == "minilm":
            batch = model.tokenizer(["The cat sat on the mat.", "Heads attend."])
            subject = Subject(model, (batch.tokens, batch.padding))
        else:
            subject = Subject(model, (model.tokenizer("The cat sat on the"),))
    refused = REFUSED[kind].get(call)
    if refused is None:
        result = CALLS[call](subject)
        assert result is not None, call
    else:
        with pytest.raises((AttributeError, TypeError, ValueError, KeyError), match=refused):
            CALLS[call](subject)


def test_the_calls_give_transformerlenss_shapes(subjects):
    """Shapes as TransformerLens gives them, grouped-query included: W_K and W_V hold the K/V heads as stored
    (TransformerLens 4's convention), QK and OV every query head."""
    model, (tokens,) = subjects["toy"].model, subjects["toy"].inputs
    N, H, G, D, d, V = 2, 4, 2, 16, 4, 11
    assert model.W_Q.shape == (N, H, D, d) and model.W_K.shape == model.W_V.shape == (N, G, D, d)
    assert model.W_O.shape == (N, H, d, D) and model.W_E.shape == (V, D) and model.W_U.shape == (D, V)
    assert model.W_pos.shape == (model.cfg.n_ctx, D) and model.blocks[1].attn.W_Q.shape == (H, D, d)
    assert model.QK.shape == model.OV.shape == (N, H, D, D) and model.all_composition_scores("K").shape == (N, H, N, H)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    assert cache.stack_head_results(layer=-1, pos_slice=-1).shape == (N * H, 2, D)
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    assert torch.allclose(stack.sum(0), cache["resid_post", -1], atol=1e-5)  # the pieces add up to the stream
    assert cache.accumulated_resid(apply_ln=True).shape == (N + 1, 2, 6, D)
    assert cache.logit_attrs(stack, tokens).shape == (len(labels), 2, 6)
    assert cache["blocks.0.ln1.hook_scale"].shape == (2, 6, 1) and cache["pre", 0].shape == (2, 6, model.cfg.d_mlp)
    assert model(tokens, return_type="loss").shape == () and model(tokens, return_type=None) is None
