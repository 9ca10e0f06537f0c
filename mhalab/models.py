"""Small transformers built from :class:`mhalab.MultiHeadAttention`, sized for a laptop CPU.

Shapes: B batch, T (target) length, S source length, D d_model, H heads, V vocab size. Hook points are
named by place (see :mod:`mhalab.hooks`): ``hook_embed``, ``hook_pos_embed``, ``blocks.{i}.*`` in a
:class:`Transformer`; in an :class:`EncoderDecoder` T5-style (as TransformerLens's HookedEncoderDecoder):
``encoder.{i}.*`` (``encoder.{i}.attn``), ``decoder.{i}.*`` (``decoder.{i}.attn`` its causal self-attention,
``decoder.{i}.cross_attn``), ``hook_embed``/``hook_pos_embed`` for the source and ``hook_decoder_embed``/
``hook_decoder_pos_embed`` for the target.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arguments import check_head_shape, check_int
from .attention import MultiHeadAttention
from .kv_cache import KVCache
from .hook_points import HookPoint
from .kv_cache import layer_caches
from .positions import sinusoidal_positions

__all__ = [
    "ModelConfig", "POSITIONS", "MLP", "GatedMLP", "RMSNorm", "Block", "Transformer", "EncoderDecoder",
    "eval_mode", "batch_logits", "check_token_ids", "generate_tokens",
]

# ---------------------------------------------------------------------------- config
#: Where a model's positions come from: a trained table, the fixed sinusoids, rotary embedding of queries and
#: keys (Su et al. 2021), or nowhere (a causal mask alone still gives order away).
POSITIONS = ("learned", "sinusoidal", "rotary", "none")


@dataclass(frozen=True)
class ModelConfig:
    """Every size of a model in one place; invalid combinations fail here, before any training.

    Frozen: change a field with ``dataclasses.replace(config, n_heads=8)``, which checks again.
    """

    vocab_size: int  # distinct tokens (input and output)
    d_model: int = 64  # width of the residual stream
    n_heads: int = 4  # query heads; must divide d_model unless d_head is given
    n_layers: int = 2  # blocks (EncoderDecoder: in each of encoder and decoder)
    d_ff: int | None = None  # MLP width; None: 4 * d_model
    max_len: int = 64  # longest sequence the model takes
    dropout: float = 0.0  # on embeddings, attention weights and residual branches
    causal: bool = False  # decoder-only; EncoderDecoder ignores it
    positions: str = "learned"  # "learned" table, "sinusoidal" (fixed, 2017 paper), "rotary" (RoPE on q, k), "none"
    n_targets: int = 1  # predictions per position: logits [B, T, V], or [B, T, n_targets, V]
    bias: bool = True  # biases in the attention projections
    attn_only: bool = False  # blocks without an MLP (attention-only, as in Elhage et al. 2021)
    n_kv_heads: int | None = None  # K/V heads, grouped-query attention; None: n_heads (must divide n_heads)
    d_head: int | None = None  # width of one head; None: d_model // n_heads (d_k in the paper)
    rope_base: float = 10000.0  # rotary base (positions="rotary" only)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "max_len", "n_targets"):
            check_int(name, getattr(self, name), 1)
        # The same messages MultiHeadAttention would give, but before any module is built. n_kv_heads and
        # d_head stay None when not given, so dataclasses.replace(config, n_heads=8) derives them again.
        _, d_head = check_head_shape(self.d_model, self.n_heads, n_kv_heads=self.n_kv_heads, d_head=self.d_head)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)  # frozen: the one place a field is filled in
        check_int("d_ff", self.d_ff, 1)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        for name in ("causal", "bias", "attn_only"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or not self.rope_base > 1:
            raise ValueError(f"rope_base must be a number above 1 (e.g. 10000), got {self.rope_base!r}")
        if self.positions == "rotary" and d_head % 2:
            raise ValueError(f"positions='rotary' rotates pairs of features, so the head width must be even, got "
                             f"d_head={d_head}; choose an even d_head (or n_heads with an even d_model // n_heads)")

    def attention(self, *, rotary: bool | None = None) -> MultiHeadAttention:
        """A :class:`MultiHeadAttention` of this config's shape (rotary if ``positions="rotary"``, or as ``rotary`` says)."""
        rotary = self.positions == "rotary" if rotary is None else rotary
        return MultiHeadAttention(
            self.d_model, self.n_heads, n_kv_heads=self.n_kv_heads, d_head=self.d_head, bias=self.bias,
            dropout=self.dropout, rope_base=self.rope_base if rotary else None,
        )

    @classmethod
    def for_task(cls, task: Any, **overrides: Any) -> "ModelConfig":
        """A config whose vocab, length, causality and targets match ``task``; ``overrides`` set any field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown ModelConfig field(s) {unknown}; the fields are {sorted(known)}")
        derived = dict(vocab_size=task.vocab_size, max_len=task.seq_len, causal=bool(task.causal),
                       n_targets=getattr(task, "n_targets", 1))
        return cls(**{**derived, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only (what a checkpoint stores; ``ModelConfig(**d)`` reads it back)."""
        return asdict(self)


# ---------------------------------------------------------------------------- running
@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run the ``with`` body in eval mode (no dropout), then give ``model`` back its own mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def batch_logits(model: nn.Module, batch: Any) -> Tensor:
    """Logits for a ``[B, T]`` tensor of ids or a task ``Batch`` (via ``model.forward_batch`` if it has one)."""
    if isinstance(batch, Tensor):
        return model(batch)
    if not isinstance(getattr(batch, "inputs", None), Tensor):
        raise TypeError(f"expected a task Batch or a [batch, seq] tensor of token ids, got {type(batch).__name__}")
    forward_batch = getattr(model, "forward_batch", None)
    return forward_batch(batch) if forward_batch is not None else model(batch.inputs)


def check_token_ids(tokens: Any, hint: str = "add a batch axis with .unsqueeze(0) for a single sequence"):
    """Raise unless ``tokens`` is a ``[batch, seq]`` tensor of integer ids; ``hint`` says how to make one."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a [batch, seq] tensor of token ids, got {shape}; {hint}")
    if tokens.dtype not in (torch.int64, torch.int32):  # the index dtypes nn.Embedding accepts
        integer = not (tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool)
        raise TypeError(f"tokens must hold integer token ids as int64 (torch.long) or int32, the index dtypes "
                        f"nn.Embedding takes; got dtype {tokens.dtype}" + ("; convert with tokens.long()" if integer else ""))


@torch.no_grad()
def generate_tokens(
    step: Callable[[Tensor], Tensor], prompt: Tensor, new_tokens: int, *, cached: bool = True,
    stop: Sequence[int] = (),
) -> Tensor:
    """Greedy decoding: ``prompt [B, T0]`` -> ``[B, T0 + new_tokens]``.

    ``step(ids)`` returns logits ``[B, t, V]``; with ``cached`` it is fed only the newest token (the
    model keeps the others' keys and values in its KV caches), else the whole sequence so far.
    ``stop``: token ids that end a row (an end-of-turn token); a row that has emitted one repeats it, and
    decoding ends as soon as every row has, so the result can be shorter: ``[B, T0 + n]``, ``n <= new_tokens``.
    """
    check_int("new_tokens", new_tokens, 0)
    stop = [check_int("a stop token id", t, 0) for t in ([stop] if isinstance(stop, int) else stop)]
    stop_ids = torch.tensor(stop, dtype=prompt.dtype, device=prompt.device) if stop else None  # [S]
    done = torch.zeros(prompt.size(0), 1, dtype=torch.bool, device=prompt.device)  # [B, 1]: row has stopped
    tokens = step_input = prompt
    for _ in range(new_tokens):
        next_token = step(step_input)[:, -1].argmax(-1, keepdim=True)  # [B, 1]: the most likely next token
        if stop_ids is not None:
            next_token = torch.where(done, tokens[:, -1:], next_token)  # a stopped row repeats its stop token
            done = done | (next_token == stop_ids).any(-1, keepdim=True)  # [B, 1] == [S] -> [B, S] -> [B, 1]
        tokens = torch.cat([tokens, next_token], dim=1)  # [B, t + 1]
        if stop_ids is not None and bool(done.all()):  # (one host sync per step, only with stop tokens)
            break
        step_input = next_token if cached else tokens
    return tokens


# ---------------------------------------------------------------------------- parts
class MLP(nn.Module):
    """Position-wise feed-forward network: ``[B, T, D] -> [B, T, d_ff] -> [B, T, D]`` with GELU."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(self.fc_out(F.gelu(self.fc_in(x))), self.dropout, self.training)


class GatedMLP(nn.Module):
    """SwiGLU feed-forward network (Shazeer 2020; Llama): ``down(silu(gate(x)) * up(x))``, no biases,
    ``[B, T, D] -> [B, T, d_ff] -> [B, T, D]``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (no centring, no bias), in float32 or wider."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # half precision in float32; float64 stays
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Block(nn.Module):
    """One transformer block, as every model here builds it: self-attention, optionally cross-attention to
    an encoder's output, optionally an MLP, each on a residual branch.

    Pre-norm (GPT-2, Llama; the toy models): ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, stable without
    warm-up. Post-norm (the 2017 paper, BERT): ``norm(x + attn(x))``, then ``norm(x + mlp(x))``. ``norm`` makes
    the norm layers (``nn.LayerNorm``, :class:`RMSNorm`), ``mlp`` is :class:`MLP`, :class:`GatedMLP` or None
    (attention-only). Hook points (axes in :mod:`mhalab.hooks`): ``hook_resid_pre``, ``hook_attn_out``,
    ``hook_resid_mid`` (when a sublayer follows the attention), ``hook_cross_attn_out`` and
    ``hook_resid_mid_cross`` (decoder blocks; the latter before an MLP), ``hook_mlp_out``, ``hook_resid_post``.
    In a post-norm block the residual points are the sums before the norm, as in TransformerLens's BERT.
    """

    def __init__(
        self, attn: MultiHeadAttention, mlp: nn.Module | None, norm: Callable[[], nn.Module], *,
        cross_attn: MultiHeadAttention | None = None, post_norm: bool = False, dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.post_norm, self.dropout = post_norm, dropout
        self.has_cross, self.has_mlp = cross_attn is not None, mlp is not None
        # Registered in the order they run, so hook_points(model) lists them so.
        self.hook_resid_pre = HookPoint()  # [B, T, D]
        self.ln_attn = norm()
        self.attn = attn
        self.hook_attn_out = HookPoint()  # [B, T, D]: what the attention adds to the stream
        if self.has_cross or self.has_mlp:
            self.hook_resid_mid = HookPoint()  # [B, T, D]
        if self.has_cross:
            self.ln_cross = norm()
            self.cross_attn = cross_attn
            self.hook_cross_attn_out = HookPoint()  # [B, T, D]
            if self.has_mlp:
                self.hook_resid_mid_cross = HookPoint()  # [B, T, D]
        if self.has_mlp:
            self.ln_mlp = norm()
            self.mlp = mlp
            self.hook_mlp_out = HookPoint()  # [B, T, D]
        self.hook_resid_post = HookPoint()  # [B, T, D]
        names = ["hook_resid_mid", "hook_resid_mid_cross", "hook_resid_post"]
        self._resid_points = [p for p in (getattr(self, n, None) for n in names) if p is not None]

    @classmethod
    def from_config(cls, config: ModelConfig, *, cross: bool = False) -> "Block":
        """The toy models' pre-norm block (LayerNorm, GELU MLP unless ``attn_only``); ``cross``: a decoder block."""
        # Built in the order they run, so a seed gives the same weights as before the blocks were shared.
        attn = config.attention()
        # No rotation in cross-attention: a decoder position and an encoder position share no axis.
        cross_attn = config.attention(rotary=False) if cross else None
        mlp = None if config.attn_only else MLP(config.d_model, config.d_ff, config.dropout)
        return cls(attn, mlp, lambda: nn.LayerNorm(config.d_model), cross_attn=cross_attn, dropout=config.dropout)

    def _add(self, x: Tensor, added: Tensor, norm: nn.Module, out_hook: HookPoint, resid_hook: HookPoint) -> Tensor:
        """The end of one residual branch: ``x + added``, then the norm if post-norm."""
        x = resid_hook(x + out_hook(F.dropout(added, self.dropout, self.training)))
        return norm(x) if self.post_norm else x

    def forward(
        self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None,
        memory: Tensor | None = None, memory_padding_mask: Tensor | None = None, cross_kv_cache: KVCache | None = None,
    ) -> Tensor:
        """``x [B, T, D]`` -> ``[B, T, D]``; a decoder block also reads the encoder's output ``memory [B, S, D]``,
        whose projected keys/values ``cross_kv_cache`` keeps after the first call (see MultiHeadAttention)."""
        post = self.post_norm
        resid = iter(self._resid_points)  # the residual points after each branch, in order
        x = self.hook_resid_pre(x)
        attended, _ = self.attn(x if post else self.ln_attn(x), is_causal=causal, key_padding_mask=key_padding_mask,
                                kv_cache=kv_cache, need_weights=False)
        x = self._add(x, attended, self.ln_attn, self.hook_attn_out, next(resid))
        if self.has_cross:
            if memory is None:
                raise ValueError("a decoder block (with cross-attention) needs memory=, the encoder's output [B, S, D]")
            # Queries come from the decoder, keys and values from the encoder's output.
            attended, _ = self.cross_attn(x if post else self.ln_cross(x), memory, memory,
                                          key_padding_mask=memory_padding_mask, kv_cache=cross_kv_cache,
                                          need_weights=False)
            x = self._add(x, attended, self.ln_cross, self.hook_cross_attn_out, next(resid))
        if self.has_mlp:
            x = self._add(x, self.mlp(x if post else self.ln_mlp(x)), self.ln_mlp, self.hook_mlp_out, next(resid))
        return x


class _Embedding(nn.Module):
    """Token embedding plus positions: ``tokens [B, T]`` (starting at position ``offset``) -> ``[B, T, D]``.

    ``hook_embed`` and ``hook_pos_embed`` belong to the model (their names have no prefix) and are passed in.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.max_len = config.max_len
        self.tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.learned = config.positions == "learned"
        if self.learned:
            self.positions = nn.Embedding(config.max_len, config.d_model)
        elif config.positions == "sinusoidal":
            # A buffer, not a parameter: it moves with .to(device) but is never trained
            # (and, not being persistent, is rebuilt rather than stored in checkpoints).
            self.register_buffer("positions_table", sinusoidal_positions(config.max_len, config.d_model), persistent=False)
        self.has_table = config.positions in ("learned", "sinusoidal")  # rotary acts inside attention; "none" has none
        self.dropout = config.dropout

    def forward(self, tokens: Tensor, offset: int, hook_embed: HookPoint, hook_pos_embed: HookPoint | None) -> Tensor:
        check_token_ids(tokens)
        T = tokens.size(1)
        if offset + T > self.max_len:
            raise ValueError(f"sequence of length {offset + T} is longer than max_len={self.max_len}; "
                             f"build the model with ModelConfig(max_len>={offset + T})")
        x = hook_embed(self.tokens(tokens))  # [B, T, D]
        if self.has_table:
            table = self.positions.weight if self.learned else self.positions_table  # [max_len, D]
            x = x + hook_pos_embed(table[offset : offset + T].expand_as(x))  # [T, D] as a [B, T, D] view, no copy
        return F.dropout(x, self.dropout, self.training)


def _output_logits(head: nn.Linear, x: Tensor, config: ModelConfig) -> Tensor:
    """``x [B, T, D]`` -> logits ``[B, T, V]``, or ``[B, T, n_targets, V]`` when ``n_targets > 1``."""
    logits = head(x)  # [B, T, n_targets * V]
    if config.n_targets > 1:
        logits = logits.unflatten(-1, (config.n_targets, config.vocab_size))  # [B, T, n_targets, V]
    return logits


def _check_config(config: Any) -> ModelConfig:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"expected a mhalab.models.ModelConfig, got {type(config).__name__}; "
                        "build one with ModelConfig(vocab_size=..., d_model=..., n_heads=...)")
    return config


# ---------------------------------------------------------------------------- models
class Transformer(nn.Module):
    """Encoder-only (``config.causal=False``) or decoder-only (``config.causal=True``) transformer:
    embedding + positions, pre-norm blocks, a final LayerNorm and an output head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = _check_config(config)
        self.embed = _Embedding(config)
        self.hook_embed = HookPoint()  # token embeddings [B, T, D]
        self.hook_pos_embed = HookPoint() if self.embed.has_table else None  # position rows [B, T, D]
        self.blocks = nn.ModuleList(Block.from_config(config) for _ in range(config.n_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.n_targets * config.vocab_size)

    def forward(
        self, tokens: Tensor, *, key_padding_mask: Tensor | None = None, kv_caches: list[KVCache] | None = None
    ) -> Tensor:
        """Logits ``[B, T, V]`` (or ``[B, T, n_targets, V]``) for ``tokens [B, T]``.

        ``key_padding_mask [B, T]``: True = padding. ``kv_caches`` (causal models): one :class:`KVCache`
        per layer; ``tokens`` are then the *new* tokens, after the cached ones.
        """
        if kv_caches is not None and not self.config.causal:
            raise ValueError("kv_caches are for decoder-only models (ModelConfig(causal=True)): "
                             "a bidirectional model must re-read the whole sequence")
        past, caches = layer_caches(kv_caches, len(self.blocks))
        x = self.embed(tokens, past, self.hook_embed, self.hook_pos_embed)  # [B, T, D]
        for block, cache in zip(self.blocks, caches):
            x = block(x, causal=self.config.causal, key_padding_mask=key_padding_mask, kv_cache=cache)
        return _output_logits(self.head, self.ln_final(x), self.config)

    def generate(self, prompt: Tensor, new_tokens: int) -> Tensor:
        """Greedy continuation of ``prompt [B, T0]`` with KV caches: ``[B, T0 + new_tokens]``."""
        if not self.config.causal:
            raise ValueError("generate needs a decoder-only model: ModelConfig(causal=True)")
        if self.config.n_targets != 1:
            raise ValueError("generate needs one prediction per position (n_targets=1)")
        with eval_mode(self):
            caches = [KVCache() for _ in self.blocks]
            return generate_tokens(lambda ids: self(ids, kv_caches=caches), prompt, new_tokens)


class EncoderDecoder(nn.Module):
    """The original transformer's shape for sequence-to-sequence tasks (one vocabulary): the encoder reads
    ``src [B, S]``; the decoder reads ``tgt [B, T]`` causally and cross-attends to the encoder's output."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = _check_config(config)
        self.embed = _Embedding(config)  # one vocabulary, one table: shared by source and target
        self.hook_embed = HookPoint()  # the source's token embeddings [B, S, D]
        self.hook_pos_embed = HookPoint() if self.embed.has_table else None  # [B, S, D]
        self.hook_decoder_embed = HookPoint()  # the target's [B, T, D]
        self.hook_decoder_pos_embed = HookPoint() if self.embed.has_table else None  # [B, T, D]
        self.encoder = nn.ModuleList(Block.from_config(config) for _ in range(config.n_layers))
        self.ln_encoder = nn.LayerNorm(config.d_model)
        self.decoder = nn.ModuleList(Block.from_config(config, cross=True) for _ in range(config.n_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.n_targets * config.vocab_size)

    def encode(self, src: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """``src [B, S]`` -> memory ``[B, S, D]``."""
        x = self.embed(src, 0, self.hook_embed, self.hook_pos_embed)  # [B, S, D]
        for block in self.encoder:
            x = block(x, causal=False, key_padding_mask=src_padding_mask)
        return self.ln_encoder(x)

    def decode(
        self, tgt: Tensor, memory: Tensor, *, src_padding_mask: Tensor | None = None,
        kv_caches: list[KVCache] | None = None, cross_kv_caches: list[KVCache] | None = None,
    ) -> Tensor:
        """``tgt [B, T]`` and ``memory [B, S, D]`` -> logits ``[B, T, V]``.

        ``kv_caches``: one :class:`KVCache` per decoder layer for its self-attention (``tgt`` are then the new
        tokens); ``cross_kv_caches``: one per layer for its cross-attention, which projects ``memory`` on the
        first call and reuses those keys and values on every later one (the memory does not change while
        decoding; pass fresh caches for a new memory).
        """
        past, caches = layer_caches(kv_caches, len(self.decoder))
        _, cross_caches = layer_caches(cross_kv_caches, len(self.decoder))
        x = self.embed(tgt, past, self.hook_decoder_embed, self.hook_decoder_pos_embed)  # [B, T, D]
        for block, cache, cross_cache in zip(self.decoder, caches, cross_caches):
            x = block(x, causal=True, kv_cache=cache, memory=memory, memory_padding_mask=src_padding_mask,
                      cross_kv_cache=cross_cache)
        return _output_logits(self.head, self.ln_final(x), self.config)

    def forward(self, src: Tensor, tgt: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits ``[B, T, V]`` for ``src [B, S]`` and the target shifted right ``tgt [B, T]``."""
        memory = self.encode(src, src_padding_mask=src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask=src_padding_mask)

    def forward_batch(self, batch: Any) -> Tensor:
        """Logits for a batch with ``inputs`` (source) and ``decoder_inputs`` (target shifted right)."""
        decoder_inputs = getattr(batch, "decoder_inputs", None)
        if decoder_inputs is None:
            raise ValueError("EncoderDecoder trains on batches that carry decoder_inputs (the target sequence shifted "
                             "right, starting with BOS) next to inputs (the source); this task's batches have none")
        return self(batch.inputs, decoder_inputs)

    @torch.no_grad()
    def generate(self, src: Tensor, new_tokens: int, *, bos_id: int) -> Tensor:
        """Greedy decoding: ``src [B, S]`` -> ``[B, 1 + new_tokens]`` starting with ``bos_id``; encodes once and
        projects the encoder's output to each cross-attention's keys and values once."""
        with eval_mode(self):
            memory = self.encode(src)  # [B, S, D]
            caches = [KVCache() for _ in self.decoder]
            cross = [KVCache() for _ in self.decoder]  # the memory's keys/values, projected once per layer
            bos = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # [B, 1]
            step = lambda ids: self.decode(ids, memory, kv_caches=caches, cross_kv_caches=cross)  # noqa: E731
            return generate_tokens(step, bos, new_tokens)
