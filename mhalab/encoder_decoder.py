"""The original transformer's shape for sequence-to-sequence tasks: :class:`EncoderDecoder`, an encoder and a
decoder that cross-attends to the encoder's output, built from the same :class:`~mhalab.config.ModelConfig` and
:class:`~mhalab.blocks.Block` as :class:`~mhalab.models.Transformer`, whose embedding and output head it shares.

Shapes: B batch, T target length, S source length, D d_model, V vocab size. Hook points are named T5-style (as
TransformerLens's HookedEncoderDecoder; see :mod:`mhalab.hooks`): ``encoder.{i}.*`` (``encoder.{i}.attn``),
``decoder.{i}.*`` (``decoder.{i}.attn`` its causal self-attention, ``decoder.{i}.cross_attn``),
``hook_embed``/``hook_pos_embed`` for the source and ``hook_decoder_embed``/``hook_decoder_pos_embed`` for the target.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .blocks import Block, norm_layer
from .config import ModelConfig
from .generation import generate_tokens
from .hook_points import HookPoint
from .hooks import HookedRootModule
from .kv_cache import KVCache, layer_caches
from .models import (
    _Embedding,
    _output_head,
    _output_logits,
    _SharedNames,
    _validate_config,
    _validate_return_type,
    eval_mode,
    validate_token_ids,
)

__all__ = ["EncoderDecoder"]


class EncoderDecoder(_SharedNames, HookedRootModule):
    """The original transformer's shape for sequence-to-sequence tasks (one vocabulary): the encoder reads
    ``src [B, S]``; the decoder reads ``tgt [B, T]`` causally and cross-attends to the encoder's output. Built from
    the same :class:`ModelConfig` as :class:`~mhalab.models.Transformer` (``n_layers`` in each of encoder and decoder;
    ``causal`` is ignored: the encoder never is, the decoder always)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = _validate_config(config)
        self.embed = _Embedding(config)  # one vocabulary, one table: shared by source and target
        self.hook_embed = HookPoint()  # the source's token embeddings [B, S, D]
        self.hook_pos_embed = HookPoint() if self.embed.has_table else None  # [B, S, D]
        self.hook_decoder_embed = HookPoint()  # the target's [B, T, D]
        self.hook_decoder_pos_embed = HookPoint() if self.embed.has_table else None  # [B, T, D]
        self.encoder = nn.ModuleList(Block.from_config(config) for _ in range(config.n_layers))
        self.ln_encoder = None if config.post_norm else norm_layer(config)
        self.decoder = nn.ModuleList(Block.from_config(config, cross=True) for _ in range(config.n_layers))
        self.ln_final = None if config.post_norm else norm_layer(config)
        self.head = _output_head(config)

    def encode(self, src: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """``src [B, S]`` -> memory ``[B, S, D]``."""
        validate_token_ids(src)
        x = self.embed(src, 0, self.hook_embed, self.hook_pos_embed)  # [B, S, D]
        for block in self.encoder:
            x = block(x, causal=False, key_padding_mask=src_padding_mask)
        return x if self.ln_encoder is None else self.ln_encoder(x)

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
        validate_token_ids(tgt)
        past, caches = layer_caches(kv_caches, len(self.decoder))
        _, cross_caches = layer_caches(cross_kv_caches, len(self.decoder))
        x = self.embed(tgt, past, self.hook_decoder_embed, self.hook_decoder_pos_embed)  # [B, T, D]
        for block, cache, cross_cache in zip(self.decoder, caches, cross_caches):
            x = block(x, causal=True, kv_cache=cache, memory=memory, memory_padding_mask=src_padding_mask,
                      cross_kv_cache=cross_cache)
        return _output_logits(self, x if self.ln_final is None else self.ln_final(x))

    def forward(self, src: Tensor, tgt: Tensor, *, return_type: str | None = "logits",
                src_padding_mask: Tensor | None = None) -> Tensor | None:
        """Teacher-forced logits ``[B, T, V]`` for ``src [B, S]`` and the target shifted right ``tgt [B, T]``
        (``return_type=None``: nothing, as TransformerLens's; a task's loss is ``task.loss(logits, batch)``)."""
        _validate_return_type(return_type, ("logits", None))
        memory = self.encode(src, src_padding_mask=src_padding_mask)
        logits = self.decode(tgt, memory, src_padding_mask=src_padding_mask)
        return logits if return_type == "logits" else None

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


def _two_stacks(name: str) -> property:
    """A property of :class:`EncoderDecoder` that refuses a one-stack name (``W_Q``, ``QK``, ``blocks``, ...)."""

    def refuse(self: EncoderDecoder) -> None:
        raise AttributeError(
            f"an EncoderDecoder has two stacks, so no model.{name}: read a layer's weights from "
            "model.encoder[i].attn.W_Q, model.decoder[i].attn.W_Q or model.decoder[i].cross_attn.W_Q (W_K, W_V, W_O "
            "alike); QK, OV and composition scores live within one residual stream, and TransformerLens refuses them "
            "across an encoder-decoder too")

    return property(refuse)


for _name in ("blocks", "W_Q", "W_K", "W_V", "W_O", "QK", "OV", "all_composition_scores"):
    setattr(EncoderDecoder, _name, _two_stacks(_name))
