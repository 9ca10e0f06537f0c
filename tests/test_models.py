"""Tests for mhalab.models: shapes, causality, hook names and ablation, generation, configs."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from small_models import VARIANTS, B, T, V, small, tokens

from mhalab.arguments import validate_head_count
from mhalab.encoder_decoder import EncoderDecoder
from mhalab.head_interventions import ablate_heads
from mhalab.hooks import attention_modules
from mhalab.models import ModelConfig, Transformer, eval_mode
from mhalab.positions import sinusoidal_positions


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("positions", ["standard", "sinusoidal"])
def test_logit_shapes(causal, positions):
    model = Transformer(small(causal=causal, positional_embedding_type=positions))
    assert model(tokens()).shape == (B, T, V)


def test_several_targets_per_position():
    model = Transformer(small(n_targets=3))
    assert model(tokens()).shape == (B, T, 3, V)


def test_parameter_count_does_not_depend_on_head_count():
    counts = {h: sum(p.numel() for p in Transformer(small(n_heads=h)).parameters()) for h in (1, 2, 4, 8, 16)}
    assert len(set(counts.values())) == 1, counts


def test_blocks_expose_the_attention_module():
    from mhalab import MultiHeadAttention

    model = Transformer(small(n_heads=8))
    assert all(isinstance(b.attn, MultiHeadAttention) and b.attn.n_heads == 8 for b in model.blocks)


def test_sinusoidal_table_matches_the_formula():
    table = sinusoidal_positions(10, 6)
    pos, i = 7, 1  # feature pair i: sin at 2i, cos at 2i + 1
    angle = torch.tensor(pos / 10000 ** (2 * i / 6))
    assert torch.allclose(table[pos, 2 * i], torch.sin(angle))
    assert torch.allclose(table[pos, 2 * i + 1], torch.cos(angle))
    assert sinusoidal_positions(4, 5).shape == (4, 5)  # odd widths work too


def test_a_fixed_embedding_is_used_as_given_and_not_trained():
    from mhalab.tasks import TableLookup
    from mhalab.train import train

    task = TableLookup(n_tables=2, n_entries=3, n_keys=5, n_values=3, n_queries=4, shift=1)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.for_task(task, d_model=12, n_heads=2, n_layers=1))
    code, rows = task.factored_code(12)  # [vocab, 12], [seq_len, 12]
    assert model.fix_embedding(code, rows) is model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = task.sample(4, generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(batch.inputs, names_filter=["hook_embed", "hook_pos_embed"])
    assert torch.equal(cache["hook_embed"], code[batch.inputs])
    assert torch.equal(cache["hook_pos_embed"], rows.expand(4, -1, -1))
    train(model, task, steps=5, lr=1e-2, batch_size=8, progress=False, device="cpu")
    after = model.state_dict()
    assert torch.equal(after["embed.tokens.weight"], code)
    assert torch.equal(after["embed.positions.weight"][: task.seq_len], rows)
    assert bool((after["embed.positions.weight"][task.seq_len:] == 0).all())  # rows past the given ones: zero
    trained = [k for k in after if not k.startswith("embed.") and not torch.equal(after[k], before[k])]
    assert len(trained) == len(after) - 2  # every other parameter trained


@pytest.mark.parametrize("call, message", [
    (lambda m: m.fix_embedding(torch.zeros(V, 8)),
     r"tokens must be a tensor of d_vocab=13 rows of width d_model=16, got Tensor of shape \(13, 8\)"),
    (lambda m: m.fix_embedding([[0.0] * 16] * V), r"tokens must be a tensor.*got list"),
    (lambda m: m.fix_embedding(torch.zeros(V, 16, dtype=torch.long)), r"finite floating-point.*torch.int64"),
    (lambda m: m.fix_embedding(torch.full((V, 16), float("nan"))), r"finite floating-point.*inf or nan"),
    (lambda m: m.fix_embedding(torch.zeros(V, 16), torch.zeros(17, 16)),
     r"positions must be a tensor of 1 to n_ctx=16 rows of width d_model=16"),
])
def test_fix_embedding_names_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call(Transformer(small()))


def test_fix_embedding_refuses_a_model_whose_embedding_has_more_that_would_train():
    with pytest.raises(ValueError, match="n_token_types=1, which would still train; build it with n_token_types=0"):
        Transformer(small(n_token_types=1)).fix_embedding(torch.zeros(V, 16))
    with pytest.raises(ValueError, match="post_embedding_ln=True, which would still train; .*post_embedding_ln=False"):
        Transformer(small(post_embedding_ln=True)).fix_embedding(torch.zeros(V, 16))


def test_fix_embedding_needs_a_table_for_positions_and_an_output_matrix_of_its_own():
    with pytest.raises(ValueError, match="positions are 'rotary'.*positional_embedding_type='standard'"):
        Transformer(small(positional_embedding_type="rotary")).fix_embedding(torch.zeros(V, 16), torch.zeros(4, 16))
    Transformer(small(positional_embedding_type="rotary")).fix_embedding(torch.zeros(V, 16))  # tokens alone: fine
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        Transformer(small(tie_word_embeddings=True)).fix_embedding(torch.zeros(V, 16))


def test_sinusoidal_positions_are_not_trained_or_saved():
    model = Transformer(small(positional_embedding_type="sinusoidal"))
    assert not any("position" in name for name, _ in model.named_parameters())
    assert not any("position" in name for name in model.state_dict())


# ---------------------------------------------------------------- causality
def test_causal_model_never_looks_ahead():
    model = Transformer(small(causal=True)).eval()
    x = tokens()
    changed = x.clone()
    changed[:, 5] = (changed[:, 5] + 1) % V
    before, after = model(x), model(changed)
    assert torch.allclose(before[:, :5], after[:, :5], atol=1e-6)
    assert not torch.allclose(before[:, 5:], after[:, 5:], atol=1e-4)


def test_encoder_model_looks_both_ways():
    model = Transformer(small(causal=False)).eval()
    x = tokens()
    changed = x.clone()
    changed[:, 5] = (changed[:, 5] + 1) % V
    assert not torch.allclose(model(x)[:, :5], model(changed)[:, :5], atol=1e-4)


# ------------------------------------------------------- hooks: names, capture, ablation
def test_hook_names_follow_the_blocks():
    model = Transformer(small())
    assert list(attention_modules(model)) == ["blocks.0.attn", "blocks.1.attn"]
    enc_dec = EncoderDecoder(small())
    assert list(attention_modules(enc_dec)) == [
        "encoder.0.attn", "encoder.1.attn",
        "decoder.0.attn", "decoder.0.cross_attn", "decoder.1.attn", "decoder.1.cross_attn",
    ]


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3)])
def test_ablating_a_head_equals_zeroing_its_slice_of_w_o(layer, head):
    model = Transformer(small()).eval()
    x = tokens()
    ablated = model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate_heads([head]))])

    surgery = copy.deepcopy(model)
    dk = surgery.blocks[layer].attn.d_head
    with torch.no_grad():
        surgery.blocks[layer].attn.out_proj.weight[:, head * dk : (head + 1) * dk] = 0.0
    assert torch.allclose(ablated, surgery(x), atol=1e-6)
    assert not torch.allclose(ablated, model(x), atol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_cached_patterns(causal):
    model = Transformer(small(causal=causal, n_heads=2))
    with eval_mode(model):
        logits, cache = model.run_with_cache(tokens(), names_filter=lambda name: name.endswith("hook_pattern"))
        assert torch.allclose(logits, model(tokens()), atol=1e-5)  # looking changes nothing
    assert model.training  # mode restored
    assert list(cache) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    future = torch.ones(T, T).triu(1).bool()
    for pattern in cache.values():
        assert pattern.shape == (B, 2, T, T)  # [batch, head, query, key]
        assert torch.allclose(pattern.sum(-1), torch.ones(B, 2, T), atol=1e-5)
        assert (pattern[..., future] == 0).all() == causal


def test_an_ablated_head_still_has_its_pattern_but_later_layers_change():
    model = Transformer(small()).eval()
    _, plain = model.run_with_cache(tokens(), names_filter=lambda name: name.endswith("hook_pattern"))
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", ablate_heads([1]))]):
        _, ablated = model.run_with_cache(tokens(), names_filter=lambda name: name.endswith("hook_pattern"))
    # Layer 0's own pattern is the same; layer 1 sees another input.
    assert torch.allclose(plain["blocks.0.attn.hook_pattern"], ablated["blocks.0.attn.hook_pattern"])
    assert not torch.allclose(plain["blocks.1.attn.hook_pattern"], ablated["blocks.1.attn.hook_pattern"])


# ------------------------------------------------------------- generation
def test_generate_with_kv_cache_equals_recomputing_everything():
    model = Transformer(small(causal=True))
    prompt = tokens(length=4)
    fast = model.generate(prompt, 6)
    slow = prompt
    with torch.no_grad():
        for _ in range(6):
            slow = torch.cat([slow, model.eval()(slow)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(fast, slow)


def test_generate_needs_a_causal_model():
    with pytest.raises(ValueError, match="causal=True"):
        Transformer(small()).generate(tokens(), 2)


def test_generate_checks_new_tokens_like_every_other_count():
    model = Transformer(small(causal=True))
    with pytest.raises(TypeError, match="new_tokens must be an int, got float"):
        model.generate(tokens(), 2.0)
    with pytest.raises(ValueError, match="new_tokens must be at least 0, got new_tokens=-1"):
        model.generate(tokens(), -1)


def test_too_long_input_says_n_ctx():
    with pytest.raises(ValueError, match="longer than n_ctx=16.*ModelConfig\\(n_ctx>=17\\)"):
        Transformer(small())(tokens(length=17))


def test_tokens_must_be_2d_integers():
    model = Transformer(small())
    with pytest.raises(ValueError, match="unsqueeze"):
        model(tokens()[0])
    with pytest.raises(TypeError, match="integer token ids"):
        model(tokens().float())


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.bool])
def test_token_ids_of_a_dtype_embedding_rejects_get_a_clear_error(dtype):
    """nn.Embedding takes int64 and int32 ids only; int8/int16/uint8 used to pass the check and fail
    inside the embedding with 'Expected tensor for argument #1 indices ... Long, Int'."""
    model = Transformer(small())
    with pytest.raises(TypeError, match=r"int64 \(torch.long\) or int32.*got dtype " + str(dtype).replace(".", r"\.")):
        model(tokens().to(dtype))
    assert model(tokens().int()).shape == model(tokens()).shape  # int32 works


# ------------------------------------------------------------------ config
def test_bad_head_count_fails_in_the_config_with_the_attentions_message():
    with pytest.raises(ValueError) as ours:
        ModelConfig(d_vocab=10, d_model=64, n_heads=5)
    with pytest.raises(ValueError) as attention:
        validate_head_count(64, 5)
    assert str(ours.value) == str(attention.value)
    assert "Valid head counts for d_model=64: 1, 2, 4, 8, 16, 32, 64" in str(ours.value)


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        (dict(d_vocab=0), ValueError, "d_vocab must be at least 1"),
        (dict(n_ctx=0), ValueError, "n_ctx must be at least 1"),
        (dict(n_layers=0), ValueError, "n_layers must be at least 1"),
        (dict(n_layers=2.0), TypeError, "n_layers must be an int"),
        (dict(d_mlp=0), ValueError, "d_mlp must be at least 1"),
        (dict(dropout=1.0), ValueError, r"dropout must be a number in \[0, 1\)"),
        (dict(positional_embedding_type="rope"), ValueError,
         r"positional_embedding_type must be one of \('standard', 'sinusoidal', 'rotary', 'none'\)"),
        (dict(positional_embedding_type="learned"), ValueError, "'standard' is a learned table"),
        (dict(n_key_value_heads=3), ValueError,
         "n_heads=4 is not a multiple of n_key_value_heads=3.*Valid n_key_value_heads for n_heads=4: 1, 2, 4"),
        (dict(n_key_value_heads=8), ValueError, "n_key_value_heads must be between 1 and 4"),
        (dict(d_head=0), ValueError, "d_head must be at least 1"),
        (dict(positional_embedding_type="rotary", d_head=5), ValueError, "head width must be even, got d_head=5"),
        (dict(positional_embedding_type="rotary", rotary_base=1), ValueError, "rotary_base must be a number above 1"),
        (dict(act_fn="swish"), ValueError,
         r"act_fn must be one of \('gelu', 'gelu_new', 'relu', 'silu'\), got 'swish'"),
        (dict(normalization_type="LNPre"), ValueError, r"normalization_type must be one of \('LN', 'RMS', None\)"),
        (dict(eps=0), ValueError, "eps must be a number above 0"),
        (dict(eps="1e-5"), ValueError, "eps must be a number above 0"),
        (dict(post_norm="yes"), TypeError, "post_norm must be True or False"),
        (dict(gated_mlp=1), TypeError, "gated_mlp must be True or False"),
        (dict(tie_word_embeddings=None), TypeError, "tie_word_embeddings must be True or False"),
        (dict(post_embedding_ln=0), TypeError, "post_embedding_ln must be True or False"),
        (dict(n_token_types=-1), ValueError, "n_token_types must be at least 0"),
        (dict(tie_word_embeddings=True, n_targets=2), ValueError, "tie_word_embeddings=True .* needs n_targets=1"),
        (dict(attn_only=True, gated_mlp=True), ValueError, "attn_only=True builds blocks without an MLP"),
        (dict(attn_only=1), TypeError, "attn_only must be True or False"),
        (dict(causal="yes"), TypeError, "causal must be True or False"),
        (dict(n_heads=0), ValueError, "n_heads must be at least 1"),
    ],
)
def test_config_validation(overrides, error, message):
    with pytest.raises(error, match=message):
        small(**overrides)


def test_config_is_checked_after_construction_too():
    cfg = small()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_heads = 3
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        dataclasses.replace(cfg, n_heads=3, d_head=None)
    # d_head is filled in (TransformerLens's meaning: always the head width), so a new head count gets its own head
    # width when d_head=None says so; n_key_value_heads stays None (one K/V head per query head)
    assert cfg.d_head == 4 and cfg.n_key_value_heads is None
    assert Transformer(dataclasses.replace(cfg, n_heads=8, d_head=None)).blocks[0].attn.d_head == 2
    assert dataclasses.replace(cfg, n_heads=8).d_head == 4  # given: kept


def test_config_defaults_and_round_trip():
    cfg = ModelConfig(d_vocab=10, d_model=32, n_heads=8)
    attn = Transformer(cfg).blocks[0].attn
    assert cfg.d_mlp == 128 and (attn.d_head, attn.n_key_value_heads, attn.rotary_base) == (4, 8, None)
    assert ModelConfig(**cfg.to_dict()) == cfg
    assert all(v is None or isinstance(v, (int, float, str, bool)) for v in cfg.to_dict().values())


def test_config_for_task():
    task = SimpleNamespace(vocab_size=21, seq_len=12, causal=True, n_targets=2)
    cfg = ModelConfig.for_task(task, d_model=32, n_heads=8)
    assert (cfg.d_vocab, cfg.n_ctx, cfg.causal, cfg.n_targets, cfg.d_model, cfg.n_heads) == (21, 12, True, 2, 32, 8)
    with pytest.raises(TypeError, match="unknown ModelConfig field"):
        ModelConfig.for_task(task, heads=8)
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        ModelConfig.for_task(task, d_model=32, n_heads=3)


def test_model_needs_a_config():
    with pytest.raises(TypeError, match="ModelConfig"):
        Transformer(dict(d_vocab=10))


# ------------------------------------------------------------- running helpers
def test_eval_mode_restores_the_mode_even_after_an_error():
    model = Transformer(small(dropout=0.1)).train()
    with pytest.raises(RuntimeError, match="boom"):
        with eval_mode(model) as same:
            assert same is model and not model.training and not model.blocks[0].training
            raise RuntimeError("boom")
    assert model.training and model.blocks[0].training


def test_batch_logits_takes_a_batch_or_token_ids():
    from mhalab.models import batch_logits

    model = Transformer(small()).eval()
    x = tokens()
    assert torch.equal(batch_logits(model, x), model(x))
    assert torch.equal(batch_logits(model, SimpleNamespace(inputs=x)), model(x))
    enc_dec = EncoderDecoder(small()).eval()
    batch = SimpleNamespace(inputs=tokens(length=7), decoder_inputs=tokens(length=5))
    assert torch.equal(batch_logits(enc_dec, batch), enc_dec(batch.inputs, batch.decoder_inputs))
    with pytest.raises(TypeError, match="task Batch or a \\[batch, seq\\] tensor"):
        batch_logits(model, [[1, 2, 3]])


# ------------------------------------------------------------------ what ModelConfig can say
@pytest.mark.parametrize("name", VARIANTS)
def test_each_config_option_reaches_the_attention_and_the_blocks(name):
    cfg = small(causal=True, **VARIANTS[name])
    model = Transformer(cfg)
    H, D = cfg.n_heads, cfg.d_model
    G = cfg.n_key_value_heads or H
    dk = cfg.d_head or D // H
    for block in model.blocks:
        attn = block.attn
        assert (attn.n_heads, attn.n_key_value_heads, attn.d_head) == (H, G, dk)
        assert attn.qkv_proj.weight.shape == ((H + 2 * G) * dk, D) and attn.out_proj.weight.shape == (D, H * dk)
        assert attn.rotary_base == (cfg.rotary_base if cfg.positional_embedding_type == "rotary" else None)
        assert hasattr(block, "mlp") != cfg.attn_only
    names = {n for n, _ in model.named_parameters()}
    assert any(".mlp." in n for n in names) != cfg.attn_only
    assert ("embed.positions.weight" in names) == (cfg.positional_embedding_type == "standard")
    assert model(tokens()).shape == (B, T, V)


@pytest.mark.parametrize("name", VARIANTS)
def test_each_config_option_trains(name):
    """Forty Adam steps on one batch of a copy task (predict the current token) bring the loss below half."""
    torch.manual_seed(0)
    model = Transformer(small(causal=True, **VARIANTS[name]))
    x = tokens(batch=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2, losses[::10]


@pytest.mark.parametrize("name", ["grouped_query", "rotary", "all_at_once", "llama_like", "bert_like"])
def test_generation_with_a_cache_equals_recomputing_for_rotary_and_grouped_models(name):
    model = Transformer(small(causal=True, **VARIANTS[name])).eval()
    prompt = tokens(length=4)
    slow = prompt
    with torch.no_grad():
        for _ in range(6):
            slow = torch.cat([slow, model(slow)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(model.generate(prompt, 6), slow)


def test_without_positions_a_bidirectional_model_cannot_tell_order_but_a_rotary_one_can():
    x = tokens()
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(1))
    for positions, order_blind in (("none", True), ("rotary", False)):
        model = Transformer(small(positional_embedding_type=positions)).eval()
        with torch.no_grad():
            permuted_then_run, run_then_permuted = model(x[:, perm]), model(x)[:, perm]
        assert torch.allclose(permuted_then_run, run_then_permuted, atol=1e-5) == order_blind, positions


def test_the_norm_mlp_and_tying_fields_build_what_they_say():
    from mhalab.blocks import MLP, GatedMLP, RMSNorm

    llama = Transformer(small(causal=True, **VARIANTS["llama_like"])).eval()
    block = llama.blocks[0]
    assert isinstance(block.ln1, RMSNorm) and isinstance(llama.ln_final, RMSNorm) and not block.post_norm
    assert isinstance(block.mlp, GatedMLP) and block.attn.qkv_proj.bias is None and llama.head is None
    x = tokens()
    with torch.no_grad():  # tied: the logits are the final norm's output times the token embedding
        resid = llama(x, stop_at_layer=2)  # [B, T, D]: after both blocks, before the final norm
        torch.testing.assert_close(llama(x), llama.ln_final(resid) @ llama.embed.tokens.weight.T)
        torch.testing.assert_close(llama(x, logits_to_keep=2), llama(x)[:, -2:])
    bert = Transformer(small(**VARIANTS["bert_like"]))
    assert bert.ln_final is None and bert.blocks[0].post_norm and isinstance(bert.blocks[0].mlp, MLP)
    assert bert.embed.ln.eps == bert.blocks[0].ln2.eps == 1e-12 and bert.embed.token_types.num_embeddings == 2
    untied, tied = (sum(p.numel() for p in Transformer(small(tie_word_embeddings=t)).parameters())
                    for t in (False, True))
    assert untied - tied == 16 * V + V  # the head's weight [V, D] and bias [V]


@pytest.mark.parametrize("act_fn, expected", [("gelu", torch.nn.functional.gelu), ("relu", torch.relu),
                                              ("silu", torch.nn.functional.silu)])
def test_act_fn_is_the_mlps_activation(act_fn, expected):
    mlp = Transformer(small(act_fn=act_fn)).blocks[0].mlp
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), mlp.fc_out(expected(mlp.fc_in(x))))


def test_stop_at_layer_returns_the_residual_stream():
    model = Transformer(small()).eval()
    x = tokens()
    _, cache = model.run_with_cache(x)
    with torch.no_grad():
        torch.testing.assert_close(model(x, stop_at_layer=1), cache["blocks.0.hook_resid_post"])
        torch.testing.assert_close(model(x, stop_at_layer=-1), cache["blocks.0.hook_resid_post"])
    with pytest.raises(ValueError, match="stop_at_layer must be between -2 and 2"):
        model(x, stop_at_layer=3)
