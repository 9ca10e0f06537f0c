"""One config for every model here: the toy models, the encoder-decoder, all-MiniLM-L6-v2 and SmolLM2.

Field names and values follow TransformerLens's config (4's ``TransformerBridgeConfig``, 3's
``HookedTransformerConfig``) where it has the field: ``d_vocab``, ``n_ctx``, ``d_mlp``, ``d_head`` (always the
head width, as there), ``n_key_value_heads`` (None: one K/V head per query head), ``act_fn``, ``gated_mlp``,
``normalization_type`` ("LN", "RMS" or None), ``eps``, ``post_embedding_ln``, ``positional_embedding_type``
("standard": a learned table; "rotary"), ``rotary_base``, ``tie_word_embeddings``, ``attn_only``,
``use_attn_result``; the others are mhalab's own ("sinusoidal" and "none" positions among them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .arguments import validate_head_shape, validate_int

__all__ = ["ModelConfig", "POSITIONAL_EMBEDDING_TYPES", "ACT_FNS", "NORMALIZATION_TYPES"]

#: Where a model's positions come from: a trained table ("standard", TransformerLens's name), the fixed sinusoids,
#: rotary embedding of queries and keys (Su et al. 2021), or nowhere (a causal mask alone still gives order away).
POSITIONAL_EMBEDDING_TYPES = ("standard", "sinusoidal", "rotary", "none")
#: The MLP's activation, by TransformerLens's names: "gelu" (exact, BERT), "gelu_new" (tanh approximation, GPT-2),
#: "relu" (the 2017 paper), "silu" (Llama's gate).
ACT_FNS = ("gelu", "gelu_new", "relu", "silu")
#: "LN": LayerNorm (centre, scale, bias); "RMS": RMSNorm (scale only; Llama); None: no norm at all.
NORMALIZATION_TYPES = ("LN", "RMS", None)


def _validate_number(name: str, value: Any, *, above: float, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > above:
        raise ValueError(f"{name} must be a number above {above:g} (e.g. {example}), got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Every size and choice of a model in one place; invalid combinations fail here, before any weight exists.

    Frozen: change a field with ``dataclasses.replace(config, d_model=128)``, which checks again. ``d_head`` and
    ``d_mlp`` are filled in when not given (``d_model // n_heads``, ``4 * d_model``), so give ``d_head=None``
    (``d_mlp=None``) to derive them anew: ``replace(config, n_heads=8, d_head=None)``.
    """

    d_vocab: int  # distinct tokens (input and output)
    d_model: int = 64  # width of the residual stream
    n_heads: int = 4  # query heads; must divide d_model unless d_head is given
    n_layers: int = 2  # blocks (EncoderDecoder: in each of encoder and decoder)
    d_head: int | None = None  # width of one head (d_k in the paper); None: d_model // n_heads, filled in
    n_key_value_heads: int | None = None  # K/V heads, grouped-query attention; None: n_heads (must divide it)
    d_mlp: int | None = None  # MLP width; None: 4 * d_model, filled in
    n_ctx: int = 64  # longest sequence the model takes
    act_fn: str = "gelu"  # the MLP's activation (ACT_FNS); in a gated MLP, the gate's
    gated_mlp: bool = False  # SwiGLU-style MLP, down(act(gate(x)) * up(x)), no biases (Llama)
    normalization_type: str | None = "LN"  # "LN" (LayerNorm), "RMS" (RMSNorm) or None (no norms)
    eps: float = 1e-5  # added to the variance in every norm
    post_norm: bool = False  # norm after each residual sum (2017 paper, BERT), not before each sublayer (GPT-2)
    post_embedding_ln: bool = False  # a norm on the embeddings before the first block (BERT)
    n_token_types: int = 0  # BERT's segment table (every token in segment 0 here); 0: none
    # "standard" (a learned table), "sinusoidal" (fixed, 2017 paper), "rotary" (RoPE on q, k) or "none"
    positional_embedding_type: str = "standard"
    rotary_base: float = 10000.0  # rotary base (positional_embedding_type="rotary" only)
    tie_word_embeddings: bool = False  # the output matrix is the token embedding's transpose (no head of its own)
    bias: bool = True  # biases in the attention projections
    attn_only: bool = False  # blocks without an MLP (attention-only, as in Elhage et al. 2021)
    causal: bool = False  # decoder-only; EncoderDecoder ignores it
    dropout: float = 0.0  # on embeddings, attention weights and residual branches
    n_targets: int = 1  # predictions per position: logits [B, T, V], or [B, T, n_targets, V]
    use_attn_result: bool = False  # attention layers fire hook_result, every head's output [B, pos, H, D] (memory)

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_layers", "n_ctx", "n_targets"):
            validate_int(name, getattr(self, name), 1)
        # The same messages MultiHeadAttention would give, but before any module is built. n_key_value_heads stays
        # None without grouped-query attention, as in TransformerLens.
        _, d_head = validate_head_shape(self.d_model, self.n_heads, n_key_value_heads=self.n_key_value_heads,
                                     d_head=self.d_head)
        validate_int("n_token_types", self.n_token_types, 0)
        object.__setattr__(self, "d_head", d_head)  # frozen: the one place fields are filled in
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        validate_int("d_mlp", self.d_mlp, 1)
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        choices = (("positional_embedding_type", POSITIONAL_EMBEDDING_TYPES), ("act_fn", ACT_FNS),
                   ("normalization_type", NORMALIZATION_TYPES))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                hint = (" ('standard' is a learned table, in TransformerLens's words)"
                        if name == "positional_embedding_type" else "")
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}{hint}")
        flags = ("gated_mlp", "post_norm", "post_embedding_ln", "tie_word_embeddings", "bias", "attn_only", "causal",
                 "use_attn_result")
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        _validate_number("eps", self.eps, above=0, example="1e-5, or BERT's 1e-12")
        _validate_number("rotary_base", self.rotary_base, above=1, example="10000")
        if self.positional_embedding_type == "rotary" and d_head % 2:
            raise ValueError(f"positional_embedding_type='rotary' rotates pairs of features, so the head width must "
                             f"be even, got d_head={d_head}; choose an even d_head (or n_heads with an even "
                             f"d_model // n_heads)")
        if self.tie_word_embeddings and self.n_targets != 1:
            raise ValueError(f"tie_word_embeddings=True reads the logits off the token embedding, one prediction per "
                             f"position; it needs n_targets=1, got n_targets={self.n_targets}")
        if self.attn_only and self.gated_mlp:
            raise ValueError("gated_mlp=True chooses the MLP's kind, but attn_only=True builds blocks without an MLP; "
                             "set one of them")

    @classmethod
    def for_task(cls, task: Any, **overrides: Any) -> ModelConfig:
        """A config whose vocab, length, causality and targets match ``task``; ``overrides`` set any field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown ModelConfig field(s) {unknown}; the fields are {sorted(known)}")
        derived = dict(d_vocab=task.vocab_size, n_ctx=task.seq_len, causal=bool(task.causal),
                       n_targets=getattr(task, "n_targets", 1))
        return cls(**{**derived, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only (what a checkpoint stores; ``ModelConfig(**d)`` reads it back)."""
        return asdict(self)
