"""Multi-head attention, written to be read: :class:`MultiHeadAttention` (a drop-in for
``torch.nn.MultiheadAttention``) and :class:`HeadProjections` (one head's slices of its weights). Each head runs the
single operation of :mod:`mhalab.dot_product_attention`, or PyTorch's fused kernel.

Shapes: B batch, L query length, S key/value length, D d_model, H query heads (n_heads),
G key/value heads (n_key_value_heads; G = H unless grouped-query), dk head size (``d_head``; the paper's d_k).

The two PyTorch mask conventions both appear, on purpose:
:func:`~mhalab.dot_product_attention.scaled_dot_product_attention` follows ``F.scaled_dot_product_attention`` (bool
True = **may** attend); :class:`MultiHeadAttention` follows ``torch.nn.MultiheadAttention`` (bool True =
**forbidden**), and refuses a bool mask that is plainly the other one (:mod:`mhalab.masks`, whose helpers are named
by what True means). Float masks are added to the scores in both. A query that may see no key gets zero weights, a
zero output and finite gradients on both paths and every device (torch's module returns NaN on one path and zeros on
the other). Hook points: :mod:`mhalab.hooks`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arguments import validate_head_shape, validate_index
from .device import sdpa_shares_kv_heads, sdpa_zeroes_blind_rows
from .dot_product_attention import attention_scores, softmax_over_keys
from .head_weights import layer_weights
from .hook_points import HookPoint
from .kv_cache import KVCache, cache_state
from .masks import combine_forbidden_masks, validate_forbidden_mask
from .positions import apply_rotary

__all__ = ["HeadProjections", "MultiHeadAttention"]


class HeadProjections(NamedTuple):
    """Views of one head's slices: ``W_Q, W_K, W_V [D, dk]`` (``x @ W_Q``), ``W_O [dk, D]``, biases ``[dk]`` or None.

    With grouped-query attention ``W_K``/``W_V`` are the shared K/V head this head reads.
    """

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor | None
    b_K: Tensor | None
    b_V: Tensor | None


class MultiHeadAttention(nn.Module):
    """Multi-head attention: h heads of width d_k = d_model / h (``d_head`` in code), concatenated and mixed by W_O.

    ``forward`` is a drop-in for ``torch.nn.MultiheadAttention.forward``: the same arguments in the same
    order with the same defaults and mask meanings, returning ``(out, weights)``, the weights after
    dropout. The constructor takes torch's first four arguments in their order (``d_model`` = ``embed_dim``,
    ``n_heads`` = ``num_heads``, ``dropout``, ``bias``) and its ``device=``/``dtype=``; unlike torch's,
    ``batch_first`` defaults to True (``[B, T, D]``); :mod:`mhalab.torch_interop` converts to and from torch's.
    Off by default: ``n_key_value_heads`` (grouped-query attention, Ainslie et al. 2023;
    1 = multi-query, Shazeer 2019; query head j reads K/V head ``j // (H // G)``), ``d_head`` (head size
    other than D / H) and ``rotary_base`` (rotary positions on queries and keys); the names are
    :class:`~mhalab.config.ModelConfig`'s, which are TransformerLens's.

    ``qkv_proj`` holds W_Q, W_K, W_V stacked by rows (``D -> (H + 2G) dk``, each head's rows
    contiguous); ``out_proj`` is W_O. ``forward`` runs the fused ``F.scaled_dot_product_attention``
    unless the scores or weights are wanted (``need_weights``, or a hook on ``hook_attn_scores`` or
    ``hook_pattern``); then the explicit math. Hook points (axes in :mod:`mhalab.hooks`): ``hook_q``,
    ``hook_k``, ``hook_v`` (before rotary), ``hook_rot_q``, ``hook_rot_k`` (after; only with ``rotary_base``),
    ``hook_attn_scores``, ``hook_pattern``, ``hook_z``, and ``hook_result`` (each head's output after W_O), which
    fires only with ``use_attn_result`` (TransformerLens's switch: it costs ``[B, L, H, D]``).

    ``W_Q`` ``[H, D, dk]``, ``W_K``, ``W_V`` ``[G, D, dk]`` and ``W_O`` ``[H, dk, D]`` are TransformerLens's
    per-head matrices (``x @ W_Q[h]`` is head h's query), as it reads them after folding: inside a pre-norm block
    the norm before the layer has its scale folded in (and, a LayerNorm, the rows centred; see
    :func:`mhalab.head_weights.layer_weights`); a module on its own, or in a post-norm block, gives its weights as they
    are. :meth:`head_projections` gives one head's slices as stored.
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, *,
        n_key_value_heads: int | None = None, d_head: int | None = None, rotary_base: float | None = None,
        batch_first: bool = True, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        G, d_head = validate_head_shape(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head)
        if rotary_base is not None:
            if isinstance(rotary_base, bool) or not isinstance(rotary_base, (int, float)) or rotary_base <= 1:
                raise ValueError(f"rotary_base must be a number above 1 (e.g. 10000), or None for no rotary "
                                 f"embedding, got {rotary_base!r}")
            if d_head % 2:
                raise ValueError(f"rotary embedding rotates pairs of features, so d_head must be even, "
                                 f"got d_head={d_head}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first must be True ([batch, seq, d_model]) or False ([seq, batch, d_model]), "
                            f"got {batch_first!r}")
        self.d_model, self.n_heads, self.n_key_value_heads, self.d_head = d_model, n_heads, G, d_head
        self.dropout, self.rotary_base, self.batch_first = dropout, rotary_base, batch_first
        made = {"device": device, "dtype": dtype}  # where and in which dtype the weights are made, as torch's
        self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * G) * d_head, bias=bias, **made)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=bias, **made)
        self.hook_q = HookPoint()  # queries [B, L, H, dk] (before rotary)
        self.hook_k = HookPoint()  # keys [B, S_new, G, dk]: the K/V heads as stored; only the new ones with a cache
        self.hook_v = HookPoint()  # values [B, S_new, G, dk]
        if rotary_base is not None:
            self.hook_rot_q = HookPoint()  # queries after rotary [B, L, H, dk]
            self.hook_rot_k = HookPoint()  # keys after rotary [B, S_new, G, dk]
        self.hook_attn_scores = HookPoint()  # Q Kᵀ / sqrt(dk) + mask, before the softmax [B, H, L, S]
        self.hook_pattern = HookPoint()  # attention weights [B, H, L, S] (before dropout)
        self.hook_z = HookPoint()  # each head's output before W_O [B, L, H, dk]
        self.hook_result = HookPoint()  # each head's output after W_O [B, L, H, D]; only with use_attn_result
        self.use_attn_result = False  # TransformerLens's flag (ModelConfig(use_attn_result=True) sets it)
        self._input_norm: tuple[nn.Module, ...] = ()  # the norm this layer reads through (a tuple: not a submodule)
        # Same initialisation as torch.nn.MultiheadAttention, so the two train alike.
        nn.init.xavier_uniform_(self.qkv_proj.weight)
        if bias:
            nn.init.zeros_(self.qkv_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    @property
    def bias(self) -> bool:
        return self.qkv_proj.bias is not None

    @property
    def is_standard(self) -> bool:
        """True for the paper's multi-head attention (what ``torch.nn.MultiheadAttention`` can hold)."""
        return (self.n_key_value_heads == self.n_heads and self.d_head * self.n_heads == self.d_model
                and self.rotary_base is None)

    def extra_repr(self) -> str:
        extra = "" if self.n_key_value_heads == self.n_heads else f", n_key_value_heads={self.n_key_value_heads}"
        extra += "" if self.rotary_base is None else f", rotary_base={self.rotary_base:g}"
        extra += "" if self.batch_first else ", batch_first=False"
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_head={self.d_head}{extra}, bias={self.bias}, "
                f"dropout={self.dropout}")

    def reads_through(self, norm: nn.Module) -> None:
        """Say that this layer's input is ``norm``'s output (its :class:`~mhalab.blocks.Block` does), so that
        ``W_Q``, ``W_K``, ``W_V`` fold it in as TransformerLens does."""
        self._input_norm = (norm,)

    @property
    def input_norm(self) -> nn.Module | None:
        """The norm this layer reads through (:meth:`reads_through`), or None."""
        return self._input_norm[0] if self._input_norm else None

    @property
    def W_Q(self) -> Tensor:
        """``[H, D, dk]``: each query head's W_Q, folded (see the class)."""
        return self._folded().W_Q

    @property
    def W_K(self) -> Tensor:
        """``[G, D, dk]``: each K/V head's W_K, as stored with grouped-query attention (TransformerLens 4), folded."""
        return self._folded().W_K

    @property
    def W_V(self) -> Tensor:
        """``[G, D, dk]``: each K/V head's W_V, as stored with grouped-query attention (TransformerLens 4), folded."""
        return self._folded().W_V

    @property
    def W_O(self) -> Tensor:
        """``[H, dk, D]``: each head's slice of W_O."""
        return self._folded().W_O

    def _folded(self):
        return layer_weights(self)

    def head_projections(self, i: int) -> HeadProjections:
        """Views of W_Q, W_K, W_V (``[d_model, d_head]``) and W_O (``[d_head, d_model]``) for head ``i``."""
        validate_index("head index", i, self.n_heads, valid="this module has heads")
        H, G, dk, D = self.n_heads, self.n_key_value_heads, self.d_head, self.d_model
        g = i // (H // G)  # the K/V head this query head reads
        blocks = (i, H + g, H + G + g)  # its rows of qkv_proj: Q head i, then K and V head g
        w = self.qkv_proj.weight.view(H + 2 * G, dk, D)  # [(H + 2G) dk, D] -> a [dk, D] block per head
        W_Q, W_K, W_V = (w[j].t() for j in blocks)  # each [D, dk]
        b = self.qkv_proj.bias
        b_Q, b_K, b_V = (b.view(H + 2 * G, dk)[j] for j in blocks) if b is not None else (None, None, None)
        W_O = self.out_proj.weight.view(D, H, dk)[:, i].t()  # [D, H dk] -> [D, H, dk] -> [dk, D]
        return HeadProjections(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V)

    def split_heads(self, x: Tensor, hook: HookPoint | None = None) -> Tensor:
        """``[B, T, n dk] -> [B, n, T, dk]`` for n query or K/V heads: a view, no copy. ``hook`` sees the heads
        as ``[B, T, n, dk]`` (TransformerLens's layout) and may replace them."""
        B, T, width = x.shape
        x = x.view(B, T, width // self.d_head, self.d_head)  # [B, T, n dk] -> [B, T, n, dk]
        if hook is not None:
            x = hook(x)
        return x.transpose(1, 2)  # [B, T, n, dk] -> [B, n, T, dk]

    def merge_heads(self, x: Tensor, hook: HookPoint | None = None) -> Tensor:
        """``[B, H, T, dk] -> [B, T, H dk]``: concatenate the heads along the feature axis. ``hook`` sees each
        head's output as ``[B, T, H, dk]`` and may replace it."""
        B, H, T, dk = x.shape
        x = x.transpose(1, 2)  # [B, H, T, dk] -> [B, T, H, dk]
        if hook is not None:
            x = hook(x)
        return x.reshape(B, T, H * dk)  # [B, T, H, dk] -> [B, T, H dk]

    def forward(
        self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
        key_padding_mask: Tensor | None = None, need_weights: bool = True, attn_mask: Tensor | None = None,
        average_attn_weights: bool = True, is_causal: bool = False, *, kv_cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query [B, L, D]`` to ``key``/``value [B, S, D]`` (``[L, B, D]``, ``[S, B, D]`` with
        ``batch_first=False``); omit both, or pass ``query`` itself, for self-attention.

        Masks as torch's module: ``key_padding_mask [B, S]``, ``attn_mask`` ``[L, S]``, ``[B * H, L, S]``
        or ``[B, H, L, S]`` (bool True = forbidden, or float added; a bool mask that is plainly True = may
        attend is refused). ``is_causal`` needs no ``attn_mask``; with more keys than queries the queries
        are the *last* L positions. ``need_weights`` (default True, as torch) also returns the weights,
        after dropout: ``[B, L, S]`` averaged over heads, or ``[B, H, L, S]`` without ``average_attn_weights``;
        pass ``need_weights=False`` for the fused kernel. ``kv_cache``: in self-attention decoding the new
        keys/values join the cached ones (a multi-token prompt must be causal); in cross-attention the first
        call keeps the projected ``key``/``value`` (an encoder's output) and later calls reuse them, so
        ``hook_k``/``hook_v`` fire only on that first call. An empty sequence gives an empty result, as torch's.
        Returns ``(out [B, L, D] (or [L, B, D]), weights or None)``.
        """
        query, key, value, self_attention = self._batch_first(query, key, value)  # each [B, T, D]
        self._validate_inputs(query, key, value)
        B, L, _ = query.shape
        past, reuse_memory = cache_state(kv_cache, query, key, self_attention=self_attention, is_causal=is_causal)
        S = past + key.size(1)  # every key the queries will see
        explicit = need_weights or self.hook_attn_scores.is_hooked or self.hook_pattern.is_hooked
        # Only is_causal over a square score matrix: the fused kernel builds that mask itself (and skips the masked
        # blocks). Otherwise all masks become one float tensor added to the scores, built before anything is cached.
        fused_causal = is_causal and not explicit and attn_mask is None and key_padding_mask is None and L == S
        for name, m in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            validate_forbidden_mask(m, name, L, S, self_attention=self_attention)
        mask = None if fused_causal else combine_forbidden_masks(
            B, self.n_heads, L, S, key_padding_mask, attn_mask, is_causal, query.dtype, query.device
        )  # None, or float [B or 1, H or 1, L, S] added to the scores

        q, k, v = self._project(query, key, value, self_attention=self_attention, keys=not reuse_memory)
        q = self.split_heads(q, self.hook_q)  # [B, L, H dk] -> [B, H, L, dk]
        if not reuse_memory:
            k = self.split_heads(k, self.hook_k)  # [B, S_new, G dk] -> [B, G, S_new, dk]
            v = self.split_heads(v, self.hook_v)  # [B, S_new, G dk] -> [B, G, S_new, dk]
        if self.rotary_base is not None:  # positions turn queries and keys, after hook_q / hook_k
            q = self._hooked(self.hook_rot_q, apply_rotary(q, past, self.rotary_base))  # [B, H, L, dk]
            if not reuse_memory:
                k = self._hooked(self.hook_rot_k, apply_rotary(k, past, self.rotary_base))  # [B, G, S_new, dk]
        if reuse_memory:
            k, v = kv_cache.k, kv_cache.v  # [B, G, S, dk]: the memory's keys/values, projected on the first call
        elif kv_cache is not None:
            k, v = kv_cache.append(k, v)  # [B, G, past + S_new, dk]: after the cached ones (or kept: a memory)

        heads, weights = self._attend(q, k, v, mask, explicit=explicit, is_causal=fused_causal)  # [B, H, L, dk]
        # [B, H, L, dk] -> [B, L, H dk] (hook_z sees each head's output, and may replace it) -> W_O -> [B, L, D]
        z = self.merge_heads(heads, self.hook_z)
        out = self._per_head_results(z) if self.use_attn_result else self.out_proj(z)
        if not self.batch_first:
            out = out.transpose(0, 1)  # [B, L, D] -> [L, B, D]
        if not need_weights:
            return out, None
        return out, weights.mean(dim=1) if average_attn_weights else weights  # [B, L, S] or [B, H, L, S]

    def head_results(self, z: Tensor) -> Tensor:
        """``z [..., H, dk]`` (``hook_z``) -> ``[..., H, D]``: each head's output through its own slice of W_O,
        ``z_h @ W_O^h``, without the bias (what ``hook_result`` holds; their sum plus the bias is the output)."""
        H, dk, D = self.n_heads, self.d_head, self.d_model
        W_O = self.out_proj.weight.view(D, H, dk).to(dtype=z.dtype)  # [D, H dk] -> [D, H, dk]
        return torch.einsum("...hd,mhd->...hm", z, W_O)  # [..., H, D]

    def _per_head_results(self, z: Tensor) -> Tensor:
        """``z [B, L, H dk]`` -> ``[B, L, D]`` through each head's own result (``hook_result``, :meth:`head_results`),
        summed, plus the bias: W_O applied head by head."""
        B, L, _ = z.shape
        result = self.hook_result(self.head_results(z.view(B, L, self.n_heads, self.d_head)))  # [B, L, H, D]
        out = result.sum(2)  # [B, L, D]
        return out if self.out_proj.bias is None else out + self.out_proj.bias

    @staticmethod
    def _hooked(hook: HookPoint, x: Tensor) -> Tensor:
        """``x [B, n, T, dk]`` through ``hook``, which sees TransformerLens's ``[B, T, n, dk]`` (views, no copy)."""
        return hook(x.transpose(1, 2)).transpose(1, 2)  # [B, n, T, dk] -> [B, T, n, dk] -> hook -> back

    def _batch_first(
        self, query: Tensor, key: Tensor | None, value: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, bool]:
        """``(query, key, value, self_attention)``, each ``[B, T, D]``; self-attention when ``key`` and ``value``
        are both omitted or ``query`` itself."""
        self_attention = (key is None and value is None) or (key is query and value is query)
        if not self.batch_first:  # [T, B, D] -> [B, T, D]: views; the output goes back the same way
            query, key, value = (t.transpose(0, 1) if isinstance(t, Tensor) and t.dim() == 3 else t
                                 for t in (query, key, value))
        if self_attention:
            return query, query, query, True
        if key is None or value is None:
            raise ValueError("pass both key and value for cross-attention, or neither for self-attention")
        return query, key, value, False

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, *, self_attention: bool, keys: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``q [B, L, H dk]``, ``k, v [B, S, G dk]`` (None unless ``keys``): one matmul for self-attention,
        three slices of the same weight for cross-attention."""
        G = self.n_key_value_heads
        sizes = (self.n_heads * self.d_head, G * self.d_head, G * self.d_head)
        if self_attention:
            return self.qkv_proj(query).split(sizes, dim=-1)  # [B, L, (H + 2G) dk] -> three slices
        w_q, w_k, w_v = self.qkv_proj.weight.split(sizes, dim=0)
        b_q, b_k, b_v = self.qkv_proj.bias.split(sizes) if self.bias else (None, None, None)
        kv = (F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)) if keys else (None, None)
        return F.linear(query, w_q, b_q), *kv

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, explicit: bool, is_causal: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``q [B, H, L, dk]``, ``k, v [B, G, S, dk]`` -> each head's output ``[B, H, L, dk]`` and, written out
        (``explicit``), the weights ``[B, H, L, S]`` after dropout; else the fused kernel and None."""
        dropout_p = self.dropout if self.training else 0.0
        H, G = self.n_heads, k.size(1)
        if G != H and (explicit or not sdpa_shares_kv_heads(q.device)):  # each query head its group's K/V head:
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # -> [B, H, S, dk]
        if not explicit:
            return self._fused(q, k, v, mask, dropout_p=dropout_p, is_causal=is_causal), None
        scores = self.hook_attn_scores(attention_scores(q, k, mask=mask))  # [B, H, L, S]; a hook may replace it
        pattern = self.hook_pattern(softmax_over_keys(scores))  # [B, H, L, S]
        weights = F.dropout(pattern, p=dropout_p)  # what torch returns: the weights the values are summed with
        return weights @ v, weights  # [B, H, L, dk]: each head's weighted sum of its values

    @staticmethod
    def _fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, dropout_p: float, is_causal: bool) -> Tensor:
        """``F.scaled_dot_product_attention`` -> ``[B, H, L, dk]``, with zeros for a query that may see no key on
        every device: the kernel gives them on CPU and CUDA, NaN on MPS."""
        gqa = {"enable_gqa": True} if k.size(1) != q.size(1) else {}  # the kernel shares the K/V heads itself
        blind = None
        if mask is not None and not sdpa_zeroes_blind_rows(q.device):
            blind = (mask == float("-inf")).all(dim=-1, keepdim=True)  # [B or 1, H or 1, L, 1]; True with no keys
            mask = mask.masked_fill(blind, 0.0)  # finite scores there, so no NaN reaches a gradient ...
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, **gqa)
        return heads if blind is None else heads.masked_fill(blind, 0.0)  # ... and zeros, as the explicit path gives

    def _validate_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3:
                layout = ("[batch, seq, d_model] (batch_first=True)" if self.batch_first
                          else "[seq, batch, d_model] (batch_first=False)")
                raise ValueError(f"{name} must be 3-D {layout}, got shape {tuple(t.shape)}; add a batch axis "
                                 f"with .unsqueeze({0 if self.batch_first else 1}) for a single sequence")
            if t.size(-1) != self.d_model:
                raise ValueError(f"{name} has width {t.size(-1)} in its last dimension, but this module has "
                                 f"d_model={self.d_model}; project it to {self.d_model} features or build "
                                 f"MultiHeadAttention({t.size(-1)}, n_heads)")
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
            weight_dtype = self.qkv_proj.weight.dtype
            if t.dtype != weight_dtype and not torch.is_autocast_enabled(t.device.type):
                raise TypeError(f"{name} is {t.dtype} but this module's weights are {weight_dtype}: convert the input "
                                f"with .to({weight_dtype}) or the module with .to({t.dtype})")
        if key.size(1) != value.size(1):
            raise ValueError(f"key and value must have the same length (one value per key), got key length "
                             f"{key.size(1)} and value length {value.size(1)}")
        if not (query.size(0) == key.size(0) == value.size(0)):
            raise ValueError(f"query, key and value must have the same batch size, got {query.size(0)}, "
                             f"{key.size(0)} and {value.size(0)}")
