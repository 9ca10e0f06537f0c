"""mhalab.hook_names: short names (get_act_name), TransformerLens 3's aliases, glob_filter."""

from __future__ import annotations

import pytest
import torch

from mhalab.encoder_decoder import EncoderDecoder
from mhalab.hook_names import SHORT_NAMES, get_act_name, glob_filter, hook_aliases
from mhalab.models import ModelConfig, Transformer


def test_get_act_name_follows_transformerlens_for_the_names_mhalab_has():
    assert get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert get_act_name("pattern3") == "blocks.3.attn.hook_pattern"
    assert get_act_name("resid_pre", 2) == "blocks.2.hook_resid_pre" and get_act_name("embed") == "hook_embed"
    assert get_act_name("attn", 1) == "blocks.1.attn.hook_pattern" and get_act_name("k6a") == "blocks.6.attn.hook_k"
    assert get_act_name("q", 0, "attn") == "blocks.0.attn.hook_q"
    assert get_act_name("blocks.0.hook_in") == "blocks.0.hook_in"  # a full name comes back as it is
    # TransformerLens's own examples (its get_act_name docstring)
    assert get_act_name("k", 6, "a") == "blocks.6.attn.hook_k" and get_act_name("pre", 2) == "blocks.2.mlp.hook_pre"
    assert get_act_name("normalized", 27, "ln2") == "blocks.27.ln2.hook_normalized"
    assert get_act_name("scale4ln1") == "blocks.4.ln1.hook_scale" and get_act_name("pre5") == "blocks.5.mlp.hook_pre"
    assert get_act_name("scale") == "ln_final.hook_scale" and get_act_name("result", 1) == "blocks.1.attn.hook_result"
    toy = Transformer(ModelConfig(d_vocab=5, d_model=8, n_heads=2, n_layers=1, positional_embedding_type="rotary"))
    names = set(toy.hook_dict)
    for short in SHORT_NAMES:  # every short name the toy model has resolves to one of its points
        if short.endswith("embed"):
            full = get_act_name(short)
        else:
            full = get_act_name(short, 0, "ln1" if short in ("scale", "normalized") else None)
        assert full in names or short in ("pos_embed", "decoder_embed", "decoder_pos_embed", "cross_attn_out",
                                          "resid_mid_cross", "pre_linear"), short
    with pytest.raises(ValueError, match=r"give the norm as layer_type, e.g. get_act_name\('scale', 0, 'ln1'\)"):
        get_act_name("scale", 0)


@pytest.mark.parametrize("name, said", [("mid", "SoLU"), ("q_input", "use_split_qkv_input"),
                                        ("mlp_in", "hook_resid_mid")])
def test_get_act_name_refuses_points_mhalab_lacks_and_says_what_exists(name, said):
    with pytest.raises(ValueError, match=rf"no hook point '{name}'.*{said}.*Short names are: embed, pos_embed"):
        get_act_name(name, 0)


def test_get_act_name_refuses_a_layer_where_none_fits_and_a_missing_one():
    with pytest.raises(ValueError, match="belongs to the model"):
        get_act_name("embed", 0)
    with pytest.raises(ValueError, match=r"give the layer, e.g. get_act_name\('z', 0\)"):
        get_act_name("z")


def test_transformerlens_3_names_are_aliases_where_one_to_one():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_vocab=11, d_model=16, n_heads=4, n_layers=2, causal=True)).eval()
    aliases = hook_aliases(model)
    assert aliases["blocks.1.hook_in"] == "blocks.1.hook_resid_pre"
    assert aliases["blocks.1.hook_out"] == "blocks.1.hook_resid_post"
    assert aliases["blocks.0.attn.o.hook_in"] == "blocks.0.attn.hook_z" and aliases["embed.hook_out"] == "hook_embed"
    assert aliases["blocks.0.ln2.hook_in"] == "blocks.0.hook_resid_mid"
    assert set(aliases.values()) <= set(model.hook_dict)
    tokens = torch.randint(0, 11, (2, 5))
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.1.hook_in", "blocks.0.attn.q.hook_out"])
    assert list(cache) == ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_q"]  # stored under mhalab's names
    assert cache["blocks.1.hook_in"] is cache["resid_pre", 1] and "blocks.0.attn.q.hook_out" in cache
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.o.hook_in", lambda z, hook: torch.zeros_like(z))])
    with torch.no_grad():
        model.blocks[0].attn.out_proj.weight.zero_()  # z = 0: W_O adds only its bias
        torch.testing.assert_close(logits, model(tokens))


def test_a_post_norm_block_has_no_hook_out_alias(minilm):
    aliases = hook_aliases(minilm)
    assert aliases["blocks.0.hook_in"] == "blocks.0.hook_resid_pre" and "blocks.0.hook_out" not in aliases
    with pytest.raises(KeyError, match="MiniLM has no hook point 'blocks.0.hook_out'"):
        minilm.run_with_cache(minilm.tokenizer("a cat").tokens, names_filter="blocks.0.hook_out")


def test_an_encoder_decoders_stacks_have_aliases_too():
    model = EncoderDecoder(ModelConfig(d_vocab=10, d_model=8, n_heads=2, n_layers=1))
    aliases = hook_aliases(model)
    assert aliases["decoder.0.cross_attn.hook_out"] == "decoder.0.hook_cross_attn_out"
    assert aliases["encoder.0.hook_out"] == "encoder.0.hook_resid_post" and "decoder.0.ln2.hook_in" not in aliases


def test_glob_filter_is_a_plain_predicate():
    pick = glob_filter("blocks.*.attn.hook_pattern", "hook_embed")
    assert pick("blocks.3.attn.hook_pattern") and pick("hook_embed") and not pick("blocks.3.attn.hook_z")
    with pytest.raises(TypeError, match="one or more str globs"):
        glob_filter()
