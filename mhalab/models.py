"""Small transformers built from :class:`mhalab.MultiHeadAttention`, sized for a laptop CPU.

Shapes: B batch, T (target) length, S source length, D d_model, H heads, V vocab size. Hook points are
named by place (see :mod:`mhalab.hooks`): ``blocks.{i}.attn`` in a :class:`Transformer`; ``encoder.{i}.attn``,
``decoder.{i}.self_attn`` and ``decoder.{i}.cross_attn`` in an :class:`EncoderDecoder`.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_head_shape, check_int
from .attention import KVCache, MultiHeadAttention
from .kv_cache import layer_caches
from .positions import sinusoidal_positions

__all__ = [
    "ModelConfig", "MLP", "Block", "DecoderBlock", "Transformer", "EncoderDecoder",
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

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(self.fc_out(F.gelu(self.fc_in(x))), self.dropout, self.training)


class Block(nn.Module):
    """One pre-norm block (GPT-2): ``x + attn(LN(x))``, then ``x + mlp(LN(x))`` (no MLP if ``attn_only``); stable without warm-up."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = config.attention()
        if not config.attn_only:
            self.ln_mlp = nn.LayerNorm(config.d_model)
            self.mlp = MLP(config.d_model, config.d_ff, config.dropout)
        self.attn_only = config.attn_only
        self.dropout = config.dropout

    def forward(
        self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None
    ) -> Tensor:
        """``x`` ``[B, T, D]`` -> ``[B, T, D]``."""
        attended, _ = self.attn(self.ln_attn(x), is_causal=causal, key_padding_mask=key_padding_mask, kv_cache=kv_cache, need_weights=False)
        x = x + F.dropout(attended, self.dropout, self.training)
        return x if self.attn_only else x + self.mlp(self.ln_mlp(x))


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: causal self-attention, cross-attention to the encoder, MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D, H = config.d_model, config.n_heads
        self.ln_self = nn.LayerNorm(D)
        self.self_attn = config.attention()
        self.ln_cross = nn.LayerNorm(D)
        # No rotation across two sequences: a decoder position and an encoder position share no axis.
        self.cross_attn = config.attention(rotary=False)
        if not config.attn_only:
            self.ln_mlp = nn.LayerNorm(D)
            self.mlp = MLP(D, config.d_ff, config.dropout)
        self.attn_only = config.attn_only
        self.dropout = config.dropout

    def forward(
        self, x: Tensor, memory: Tensor, *, memory_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None
    ) -> Tensor:
        """``x`` ``[B, T, D]`` and the encoder's output ``memory`` ``[B, S, D]`` -> ``[B, T, D]``."""
        attended, _ = self.self_attn(self.ln_self(x), is_causal=True, kv_cache=kv_cache, need_weights=False)
        x = x + F.dropout(attended, self.dropout, self.training)
        # Queries come from the decoder, keys and values from the encoder's output.
        attended, _ = self.cross_attn(self.ln_cross(x), memory, memory, key_padding_mask=memory_padding_mask, need_weights=False)
        x = x + F.dropout(attended, self.dropout, self.training)
        return x if self.attn_only else x + self.mlp(self.ln_mlp(x))


class _Embedding(nn.Module):
    """Token embedding plus positions: ``tokens [B, T]`` (starting at position ``offset``) -> ``[B, T, D]``."""

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
        self.dropout = config.dropout

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        check_token_ids(tokens)
        T = tokens.size(1)
        if offset + T > self.max_len:
            raise ValueError(f"sequence of length {offset + T} is longer than max_len={self.max_len}; "
                             f"build the model with ModelConfig(max_len>={offset + T})")
        x = self.tokens(tokens)  # [B, T, D]
        table = self.positions.weight if self.learned else getattr(self, "positions_table", None)  # [max_len, D]
        if table is not None:  # (rotary positions act inside attention; "none" has none)
            x = x + table[offset : offset + T]  # [B, T, D] + [T, D] broadcasts over the batch
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
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
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
        x = self.embed(tokens, past)  # [B, T, D]
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
        self.embed = _Embedding(config)
        self.encoder = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_encoder = nn.LayerNorm(config.d_model)
        self.decoder = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.n_targets * config.vocab_size)

    def encode(self, src: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """``src [B, S]`` -> memory ``[B, S, D]``."""
        x = self.embed(src)  # [B, S, D]
        for block in self.encoder:
            x = block(x, causal=False, key_padding_mask=src_padding_mask)
        return self.ln_encoder(x)

    def decode(
        self, tgt: Tensor, memory: Tensor, *, src_padding_mask: Tensor | None = None,
        kv_caches: list[KVCache] | None = None,
    ) -> Tensor:
        """``tgt [B, T]`` and ``memory [B, S, D]`` -> logits ``[B, T, V]``."""
        past, caches = layer_caches(kv_caches, len(self.decoder))
        x = self.embed(tgt, past)  # [B, T, D]
        for block, cache in zip(self.decoder, caches):
            x = block(x, memory, memory_padding_mask=src_padding_mask, kv_cache=cache)
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
        """Greedy decoding: ``src [B, S]`` -> ``[B, 1 + new_tokens]`` starting with ``bos_id``; encodes once."""
        with eval_mode(self):
            memory = self.encode(src)  # [B, S, D]
            caches = [KVCache() for _ in self.decoder]
            bos = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # [B, 1]
            return generate_tokens(lambda ids: self.decode(ids, memory, kv_caches=caches), bos, new_tokens)
