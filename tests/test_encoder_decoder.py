"""mhalab.encoder_decoder: shapes, causality, ablation and generation, cross-attention's cached keys and values,
and every ModelConfig option, on small EncoderDecoders."""

from types import SimpleNamespace

import pytest
import torch
from small_models import VARIANTS, B, V, small, tokens

from mhalab.encoder_decoder import EncoderDecoder
from mhalab.head_interventions import ablate_heads


# --------------------------------------------------------- encoder-decoder
def test_encoder_decoder_shapes_and_attention():
    model = EncoderDecoder(small()).eval()
    src, tgt = tokens(length=7), tokens(length=5, seed=1)
    logits, cache = model.run_with_cache(src, tgt, names_filter=lambda name: name.endswith("hook_pattern"))
    assert logits.shape == (B, 5, V)
    shapes = {name: tuple(w.shape) for name, w in cache.items()}
    assert shapes == {
        "encoder.0.attn.hook_pattern": (B, 4, 7, 7), "encoder.1.attn.hook_pattern": (B, 4, 7, 7),
        "decoder.0.attn.hook_pattern": (B, 4, 5, 5), "decoder.0.cross_attn.hook_pattern": (B, 4, 5, 7),
        "decoder.1.attn.hook_pattern": (B, 4, 5, 5), "decoder.1.cross_attn.hook_pattern": (B, 4, 5, 7),
    }
    for w in cache.values():
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)


def test_encoder_decoder_causality():
    model = EncoderDecoder(small()).eval()
    src, tgt = tokens(length=7), tokens(length=6, seed=1)
    later = tgt.clone()
    later[:, 4] = (later[:, 4] + 1) % V
    assert torch.allclose(model(src, tgt)[:, :4], model(src, later)[:, :4], atol=1e-6)
    other_src = src.clone()
    other_src[:, -1] = (other_src[:, -1] + 1) % V  # the last source token is visible to every target position
    diff = (model(src, tgt) - model(other_src, tgt)).abs().amax(dim=(0, 2))
    assert (diff > 1e-5).all()


def test_encoder_decoder_ablation_and_generation():
    model = EncoderDecoder(small()).eval()
    src, tgt = tokens(length=7), tokens(length=5, seed=1)
    base = model(src, tgt)
    for point in ("encoder.1.attn.hook_z", "decoder.1.attn.hook_z", "decoder.1.cross_attn.hook_z"):
        ablated = model.run_with_hooks(src, tgt, fwd_hooks=[(point, ablate_heads([0]))])
        assert not torch.allclose(ablated, base, atol=1e-5), point

    fast = model.generate(src, 5, bos_id=0)
    slow = torch.zeros(B, 1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(5):
            slow = torch.cat([slow, model(src, slow)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(fast, slow)


def test_cross_attention_projects_the_memory_once_and_gives_the_same_logits():
    """Decoding token by token with cached cross-attention K/V gives exactly the logits of the uncached path,
    where every step re-projects the encoder's output (the same matmul on the same memory: bit for bit);
    the cached path projects it once per layer."""
    from mhalab.kv_cache import KVCache

    model = EncoderDecoder(small(n_key_value_heads=2)).eval()
    src, tgt = tokens(length=7), tokens(length=6, seed=1)
    with torch.no_grad():
        memory = model.encode(src)
        projections = []
        count = [(lambda name: name.endswith("cross_attn.hook_k"), lambda k, hook: projections.append(hook.name))]
        logits = {}
        for cross in (True, False):
            self_caches, cross_caches = [KVCache() for _ in model.decoder], [KVCache() for _ in model.decoder]
            logits[cross] = torch.cat([model.decode(tgt[:, t : t + 1], memory, kv_caches=self_caches,
                                                    cross_kv_caches=cross_caches if cross else None)
                                       for t in range(tgt.size(1))], dim=1)  # [B, T, V]
        assert torch.equal(logits[True], logits[False])
        self_caches, cross_caches = [KVCache() for _ in model.decoder], [KVCache() for _ in model.decoder]
        with model.hooks(fwd_hooks=count):
            for t in range(tgt.size(1)):
                model.decode(tgt[:, t : t + 1], memory, kv_caches=self_caches, cross_kv_caches=cross_caches)
    # once per layer, not per token
    assert projections == ["decoder.0.cross_attn.hook_k", "decoder.1.cross_attn.hook_k"]
    assert [len(c) for c in cross_caches] == [7, 7] and cross_caches[0].k.shape == (B, 2, 7, 4)
    with pytest.raises(ValueError, match="holds the keys of a memory .batch 3, length 7.*fresh KVCache"):
        model.decode(tgt[:, :1], model.encode(tokens(length=5)), kv_caches=[KVCache() for _ in model.decoder],
                     cross_kv_caches=cross_caches)


def test_encoder_decoder_forward_batch_needs_decoder_inputs():
    model = EncoderDecoder(small())
    with pytest.raises(ValueError, match="decoder_inputs"):
        model.forward_batch(SimpleNamespace(inputs=tokens()))
    batch = SimpleNamespace(inputs=tokens(length=7), decoder_inputs=tokens(length=5))
    assert model.forward_batch(batch).shape == (B, 5, V)


@pytest.mark.parametrize("name", VARIANTS)
def test_encoder_decoder_takes_each_config_option(name):
    cfg = small(**VARIANTS[name])
    model = EncoderDecoder(cfg)
    src, tgt = tokens(length=7), tokens(length=5, seed=1)
    assert model(src, tgt).shape == (B, 5, V)
    assert all(block.cross_attn.rotary_base is None for block in model.decoder)  # no rotation across two sequences
    assert model.generate(src, 3, bos_id=0).shape == (B, 4)


def test_encoder_decoder_reads_the_same_fields():
    model = EncoderDecoder(small(**VARIANTS["llama_like"]))
    assert model.head is None and all(isinstance(b.mlp, type(model.encoder[0].mlp)) for b in model.decoder)
    assert type(model.ln_encoder).__name__ == "RMSNorm"
    assert EncoderDecoder(small(post_norm=True)).ln_final is None
