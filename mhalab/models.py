"""The model: :class:`Transformer`, built from one :class:`ModelConfig` (:mod:`mhalab.config`) out of
:class:`mhalab.blocks.Block`; sized for a laptop CPU, or as large as MiniLM and SmolLM2. Also the pieces every model
shares (the embedding, the output head, the checks of a config and of token ids; :mod:`mhalab.encoder_decoder`
builds on them) and the running helpers :func:`eval_mode` and :func:`batch_logits`.

Shapes: B batch, T length, D d_model, H heads, V vocab size. Hook points are named by place (see
:mod:`mhalab.hooks`): ``hook_embed``, ``hook_pos_embed``, ``blocks.{i}.*``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import circuits
from .arguments import validate_int
from .blocks import Block, norm_layer
from .config import ModelConfig
from .factored_matrix import FactoredMatrix
from .generation import generate_tokens
from .head_weights import unembedding_weights
from .hook_points import HookPoint
from .hooks import HookedRootModule
from .kv_cache import KVCache, layer_caches
from .positions import sinusoidal_positions

__all__ = ["ModelConfig", "Transformer", "eval_mode", "batch_logits", "validate_token_ids"]

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


def validate_token_ids(tokens: Any, hint: str = "add a batch axis with .unsqueeze(0) for a single sequence"):
    """Raise unless ``tokens`` is a ``[batch, seq]`` tensor of integer ids; ``hint`` says how to make one."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a [batch, seq] tensor of token ids, got {shape}; {hint}")
    if tokens.dtype not in (torch.int64, torch.int32):  # the index dtypes nn.Embedding accepts
        integer = not (tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool)
        advice = "; convert with tokens.long()" if integer else ""
        raise TypeError(f"tokens must hold integer token ids as int64 (torch.long) or int32, the index dtypes "
                        f"nn.Embedding takes; got dtype {tokens.dtype}{advice}")


class _Embedding(nn.Module):
    """Token embedding plus positions (plus segment 0's row with ``n_token_types``, then a norm with
    ``post_embedding_ln``): ``tokens [B, T]`` (starting at
    position ``offset``) -> ``[B, T, D]``.

    ``hook_embed`` and ``hook_pos_embed`` belong to the model (their names have no prefix) and are passed in.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_ctx = config.n_ctx
        self.tokens = nn.Embedding(config.d_vocab, config.d_model)
        self.learned = config.positional_embedding_type == "standard"
        if self.learned:
            self.positions = nn.Embedding(config.n_ctx, config.d_model)
        elif config.positional_embedding_type == "sinusoidal":
            # A buffer, not a parameter: it moves with .to(device) but is never trained
            # (and, not being persistent, is rebuilt rather than stored in checkpoints).
            table = sinusoidal_positions(config.n_ctx, config.d_model)  # [n_ctx, d_model]
            self.register_buffer("positions_table", table, persistent=False)
        # rotary acts inside attention; "none" has no positions at all
        self.has_table = config.positional_embedding_type in ("standard", "sinusoidal")
        self.token_types = nn.Embedding(config.n_token_types, config.d_model) if config.n_token_types else None
        self.ln = norm_layer(config) if config.post_embedding_ln else None
        self.dropout = config.dropout

    def forward(self, tokens: Tensor, offset: int, hook_embed: HookPoint, hook_pos_embed: HookPoint | None) -> Tensor:
        T = tokens.size(1)  # (the model has checked tokens with validate_token_ids)
        if offset + T > self.n_ctx:
            raise ValueError(f"sequence of length {offset + T} is longer than n_ctx={self.n_ctx}; "
                             f"build the model with ModelConfig(n_ctx>={offset + T})")
        x = hook_embed(self.tokens(tokens))  # [B, T, D]
        if self.has_table:
            table = self.positions.weight if self.learned else self.positions_table  # [n_ctx, D]
            x = x + hook_pos_embed(table[offset : offset + T].expand_as(x))  # [T, D] as a [B, T, D] view, no copy
        if self.token_types is not None:
            x = x + self.token_types.weight[0]  # [D]: every token is in segment 0
        if self.ln is not None:
            x = self.ln(x)
        return F.dropout(x, self.dropout, self.training)


def _output_head(config: ModelConfig) -> nn.Linear | None:
    """The output matrix of its own, or None with ``tie_word_embeddings`` (the token embedding serves)."""
    return None if config.tie_word_embeddings else nn.Linear(config.d_model, config.n_targets * config.d_vocab)


def _output_logits(model: nn.Module, x: Tensor) -> Tensor:
    """``x [B, T, D]`` (after the final norm) -> logits ``[B, T, V]``, or ``[B, T, n_targets, V]``."""
    if model.head is None:
        return F.linear(x, model.embed.tokens.weight)  # tied: [B, T, D] @ [D, V] -> [B, T, V]
    logits = model.head(x)  # [B, T, n_targets * V]
    if model.config.n_targets > 1:
        logits = logits.unflatten(-1, (model.config.n_targets, model.config.d_vocab))  # [B, T, n_targets, V]
    return logits


def _validate_rows(name: str, rows: Any, low: int, high: int, width: int, rows_text: str) -> None:
    """Raise unless ``rows`` is a finite float tensor ``[n, width]`` with ``low <= n <= high`` (``rows_text``
    says so in the message, e.g. "d_vocab=13")."""
    shape = getattr(rows, "shape", None)
    if not isinstance(rows, Tensor) or rows.dim() != 2 or not low <= rows.shape[0] <= high or rows.shape[1] != width:
        raise ValueError(f"{name} must be a tensor of {rows_text} rows of width d_model={width}, got "
                         f"{type(rows).__name__}{'' if shape is None else ' of shape ' + str(tuple(shape))}")
    if not rows.is_floating_point() or not torch.isfinite(rows).all():
        raise ValueError(f"{name} must hold finite floating-point numbers, got dtype {rows.dtype}"
                         + ("" if not rows.is_floating_point() else " with inf or nan"))


def _validate_config(config: Any) -> ModelConfig:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"expected a mhalab.models.ModelConfig, got {type(config).__name__}; "
                        "build one with ModelConfig(d_vocab=..., d_model=..., n_heads=...)")
    return config


# ---------------------------------------------------------------------------- models
class _SharedNames:
    """TransformerLens's names for what every model here has once: ``cfg`` and the embeddings, the unembedding."""

    @property
    def cfg(self) -> ModelConfig:
        """The model's :class:`ModelConfig` by TransformerLens's name (the same object as ``config``)."""
        return self.config

    @property
    def W_E(self) -> Tensor:
        """``[d_vocab, d_model]``: the token embedding."""
        return self.embed.tokens.weight.detach()

    @property
    def W_pos(self) -> Tensor:
        """``[n_ctx, d_model]``: the position table added to the embeddings (learned, or the fixed sinusoids)."""
        if not self.embed.has_table:
            raise AttributeError(f"W_pos is the table of positions added to the embeddings; this model has none "
                                 f"(positional_embedding_type={self.config.positional_embedding_type!r}: rotary acts "
                                 f"on queries and keys inside each attention layer, 'none' has no positions)")
        return (self.embed.positions.weight if self.embed.learned else self.embed.positions_table).detach()

    @property
    def W_U(self) -> Tensor:
        """``[d_model, d_vocab]``: the unembedding, the final norm's scale folded in (centred over d_model after a
        LayerNorm), as TransformerLens reads it; ``norm's normalisation(x) @ W_U + b_U`` are the logits."""
        return unembedding_weights(self)[0]

    @property
    def b_U(self) -> Tensor:
        """``[d_vocab]``: the unembedding's bias with the final norm's bias folded in (zeros where there is none)."""
        W_U, b_U = unembedding_weights(self)
        return torch.zeros(W_U.size(1), dtype=W_U.dtype, device=W_U.device) if b_U is None else b_U


_RETURN_TYPES = ("logits", "loss", "both", None)


def _validate_return_type(return_type: Any, allowed: tuple = _RETURN_TYPES) -> None:
    if return_type not in allowed:
        raise ValueError(f"return_type must be one of {allowed} (TransformerLens's), got {return_type!r}")


class Transformer(_SharedNames, HookedRootModule):
    """Encoder-only (``config.causal=False``) or decoder-only (``config.causal=True``) transformer: embedding
    and positions, ``n_layers`` blocks (:meth:`Block.from_config`), a final norm (pre-norm models only: a
    post-norm block ends in one) and an output head (the token embedding itself with ``tie_word_embeddings``).
    The toy models, all-MiniLM-L6-v2 and SmolLM2 are each one :class:`ModelConfig` of it.

    TransformerLens's attributes, with its shapes and as it reads the weights in compatibility mode (norms'
    scales folded in; :mod:`mhalab.head_weights` says how): ``cfg`` (the config), ``W_E [V, D]``, ``W_pos [n_ctx, D]``,
    ``W_U [D, V]``, ``b_U [V]``, ``W_Q, W_O [N, H, ...]`` and ``W_K, W_V [N, G, D, d_head]`` (the K/V heads as
    stored, TransformerLens 4's convention), ``QK``, ``OV`` (``FactoredMatrix [N, H, D, D]``, K/V heads repeated
    per query head), ``all_composition_scores(mode)``, ``model(tokens, return_type=...)``."""

    #: How to make valid ``tokens``, said by the error for invalid ones.
    tokens_hint = "add a batch axis with .unsqueeze(0) for a single sequence"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = _validate_config(config)
        self.embed = _Embedding(config)
        self.hook_embed = HookPoint()  # token embeddings [B, T, D]
        self.hook_pos_embed = HookPoint() if self.embed.has_table else None  # position rows [B, T, D]
        self.blocks = nn.ModuleList(Block.from_config(config) for _ in range(config.n_layers))
        self.ln_final = None if config.post_norm else norm_layer(config)
        self.head = _output_head(config)

    def forward(
        self, tokens: Tensor, *, return_type: str | None = "logits", key_padding_mask: Tensor | None = None,
        kv_caches: list[KVCache] | None = None, logits_to_keep: int = 0, stop_at_layer: int | None = None,
    ) -> Tensor | tuple[Tensor, Tensor] | None:
        """Logits ``[B, T, V]`` (or ``[B, T, n_targets, V]``) for ``tokens [B, T]``.

        ``return_type`` (TransformerLens's): "logits"; "loss", the mean next-token cross-entropy (a decoder with one
        prediction per position, every position's logits); "both", ``(logits, loss)``; None, nothing.
        ``key_padding_mask [B, T]``: True = padding. ``kv_caches`` (causal models): one :class:`KVCache`
        per layer; ``tokens`` are then the *new* tokens, after the cached ones. ``logits_to_keep``: 0 for every
        position, else only the last that many (``[B, n, V]``; decoding needs only the last). ``stop_at_layer``
        (TransformerLens's): run only that many blocks and return the residual stream ``[B, T, D]`` there.
        """
        validate_token_ids(tokens, self.tokens_hint)
        validate_int("logits_to_keep", logits_to_keep, 0)
        _validate_return_type(return_type)
        if return_type in ("loss", "both") and (not self.config.causal or self.config.n_targets != 1
                                                or logits_to_keep or kv_caches is not None):
            raise ValueError("return_type='loss' is the next-token loss of a decoder (ModelConfig(causal=True), "
                             "n_targets=1) over every position of one call: no logits_to_keep, no kv_caches; for a "
                             "task's loss use task.loss(logits, batch)")
        if kv_caches is not None and not self.config.causal:
            raise ValueError("kv_caches are for decoder-only models (ModelConfig(causal=True)): "
                             "a bidirectional model must re-read the whole sequence")
        past, caches = layer_caches(kv_caches, len(self.blocks))
        blocks, n = self.blocks, len(self.blocks)
        if stop_at_layer is not None and validate_int("stop_at_layer", stop_at_layer, -n, maximum=n) != n:
            blocks = blocks[:stop_at_layer]
        x = self.embed(tokens, past, self.hook_embed, self.hook_pos_embed)  # [B, T, D]
        for block, cache in zip(blocks, caches):
            x = block(x, causal=self.config.causal, key_padding_mask=key_padding_mask, kv_cache=cache)
        if stop_at_layer is not None:
            return x
        if logits_to_keep:
            x = x[:, -logits_to_keep:]  # [B, n, D]
        logits = _output_logits(self, x if self.ln_final is None else self.ln_final(x))
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())  # predict token t + 1 at t
        return loss if return_type == "loss" else (logits, loss)

    # ---------------------------------------------------------------- TransformerLens's weights, every layer
    def _stacked(self, name: str) -> Tensor:
        return torch.stack([getattr(block.attn, name) for block in self.blocks])

    @property
    def W_Q(self) -> Tensor:
        """``[n_layers, n_heads, d_model, d_head]``: every layer's ``blocks[l].attn.W_Q`` (folded)."""
        return self._stacked("W_Q")

    @property
    def W_K(self) -> Tensor:
        """``[n_layers, G, d_model, d_head]``: the K/V heads as stored (G = n_key_value_heads, or n_heads)."""
        return self._stacked("W_K")

    @property
    def W_V(self) -> Tensor:
        """``[n_layers, G, d_model, d_head]``: the K/V heads as stored (G = n_key_value_heads, or n_heads)."""
        return self._stacked("W_V")

    @property
    def W_O(self) -> Tensor:
        """``[n_layers, n_heads, d_head, d_model]``: every head's slice of W_O."""
        return self._stacked("W_O")

    @property
    def QK(self) -> FactoredMatrix:
        """Every head's ``W_Q W_Kᵀ`` ``[n_layers, n_heads, d_model, d_model]`` (:func:`mhalab.circuits.QK`)."""
        return circuits.QK(self)

    @property
    def OV(self) -> FactoredMatrix:
        """Every head's ``W_V W_O`` ``[n_layers, n_heads, d_model, d_model]`` (:func:`mhalab.circuits.OV`)."""
        return circuits.OV(self)

    def all_composition_scores(self, mode: str) -> Tensor:
        """``[n_layers, n_heads, n_layers, n_heads]`` Q-, K- or V-composition scores
        (:func:`mhalab.circuits.all_composition_scores`)."""
        return circuits.all_composition_scores(self, mode)

    def new_kv_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per layer (each holds ``n_key_value_heads`` heads)."""
        return [KVCache() for _ in self.blocks]

    def fix_embedding(self, tokens: Tensor, positions: Tensor | None = None) -> Transformer:
        """Give the model its embedding and keep it out of training: ``tokens [d_vocab, d_model]`` (e.g. from
        :meth:`mhalab.tasks.TableLookup.factored_code`) become the token embedding's rows; ``positions [n, d_model]``
        (``n <= n_ctx``; learned positions only) the first ``n`` rows of the position table, the rest zero. Both
        stop requiring gradients, so :func:`mhalab.train.train` leaves them as given. A state dict does not keep
        that: call it again on a model built or loaded anew. Returns the model."""
        config = self.config
        if self.head is None:
            raise ValueError("fix_embedding would also fix the output matrix of a model with tie_word_embeddings=True "
                             "(its logits are read off the token embedding); build it with tie_word_embeddings=False")
        for field, value, plain in (("n_token_types", config.n_token_types, 0),
                                    ("post_embedding_ln", config.post_embedding_ln, False)):
            if value != plain:
                raise ValueError(f"fix_embedding gives the token and position rows, but this model's embedding also "
                                 f"has {field}={value!r}, which would still train; build it with {field}={plain!r}")
        _validate_rows("tokens", tokens, config.d_vocab, config.d_vocab, config.d_model, f"d_vocab={config.d_vocab}")
        if positions is not None:
            if not self.embed.learned:
                raise ValueError(f"positions= sets a learned position table, but this model's positions are "
                                 f"{config.positional_embedding_type!r}; build it with "
                                 f"ModelConfig(positional_embedding_type='standard') or pass "
                                 f"tokens alone")
            _validate_rows("positions", positions, 1, config.n_ctx, config.d_model, f"1 to n_ctx={config.n_ctx}")
        with torch.no_grad():
            self.embed.tokens.weight.copy_(tokens)
            self.embed.tokens.weight.requires_grad_(False)
            if positions is not None:
                table = self.embed.positions.weight  # [n_ctx, d_model]
                table.zero_()
                table[: positions.shape[0]] = positions
                table.requires_grad_(False)
        return self

    def generate(self, prompt: Tensor, new_tokens: int, *, use_cache: bool = True, stop: Sequence[int] = ()) -> Tensor:
        """Greedy continuation of ``prompt [B, T0]``: ``[B, T0 + new_tokens]``, or shorter once every row has
        emitted a ``stop`` token (see :func:`mhalab.generation.generate_tokens`); without ``use_cache`` every step
        recomputes the whole prefix (same tokens, slower)."""
        if not self.config.causal:
            raise ValueError("generate needs a decoder-only model: ModelConfig(causal=True)")
        if self.config.n_targets != 1:
            raise ValueError("generate needs one prediction per position (n_targets=1)")
        validate_token_ids(prompt, self.tokens_hint)
        with eval_mode(self):
            caches = self.new_kv_caches() if use_cache else None
            step = lambda ids: self(ids, kv_caches=caches, logits_to_keep=1)  # noqa: E731 - [B, 1, V]: the next token's
            prompt = prompt.to(self.embed.tokens.weight.device)
            return generate_tokens(step, prompt, new_tokens, cached=use_cache, stop=stop)
