"""What the views of attention show, computed once: every head's patterns, scores and ablation on one input.

:func:`head_data` runs a model on a task batch or token ids and returns a :class:`HeadData`; the views in
:mod:`mhalab.widgets` (the head explorer, the model view, the head grid) only look things up in it. A
slider move never runs the model again; new text does, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .ablation import AblationTable, ablate_each_head
from .head_roles import FRACTION_SCORES, NO_ROLE, fraction_keys, head_scores, role_of, stack_attention
from .hooks import attention_modules
from .models import eval_mode

__all__ = ["HeadData", "head_data", "AttentionLayers", "SPECIAL_LABELS", "hide_keys"]

#: Token labels that are bookkeeping rather than text; with the first token they can be hidden.
SPECIAL_LABELS = ("[CLS]", "[SEP]", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: A head follows a relation or score when at least this fraction of its attention lands there.
THRESHOLD = 0.5


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one CPU thread for the views' small forward passes: on a busy machine two OpenMP threads
    wait for each other at every matrix product (benchmarks/RESULTS.md: 5-9 s per new text against 0.4-0.7 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def hide_keys(attention: np.ndarray, keys) -> np.ndarray:
    """``attention [..., T, S]`` without the weight on key positions ``keys``, each row renormalised to sum
    to 1 over the keys left (a row with nothing left, e.g. a causal query 0 that only sees token 0, is 0)."""
    shown = np.array(attention, dtype=np.float64, copy=True)
    shown[..., list(keys)] = 0.0
    total = shown.sum(-1, keepdims=True)
    return np.divide(shown, total, out=np.zeros_like(shown), where=total > 0)


class AttentionLayers:
    """A model's attention layers and their hook names, looked up once (not again per text or per head)."""

    def __init__(self, model: nn.Module) -> None:
        layers = attention_modules(model)
        self.patterns = [f"{name}.hook_pattern" if name else "hook_pattern" for name in layers]  # one per layer
        self.n_key_value_heads = next(iter(layers.values())).n_key_value_heads


@dataclass
class HeadData:
    """Every head of a model on one input: ``attention [N, E, H, T, S]`` (the first E examples), ``scores``
    ``{name: [N, H]}`` over the whole batch, ``labels`` (E token lists), ``keys`` ``{highlight: [E, T]}`` (the
    key each query should look at, -1 for none), ``relations`` (the task's), ``ablation`` (or None),
    ``n_key_value_heads`` and the ``text`` it came from (None for a task batch)."""

    attention: np.ndarray
    scores: dict[str, np.ndarray]
    labels: list[list[str]]
    keys: dict[str, np.ndarray]
    relations: list[str]
    ablation: AblationTable | None
    n_key_value_heads: int
    text: str | None = None
    threshold: float = THRESHOLD

    def __post_init__(self) -> None:
        self.n_layers, self.n_examples, self.n_heads, self.T, self.S = self.attention.shape

    @property
    def heads(self) -> list[tuple[int, int]]:
        """Every ``(layer, head)`` pair, in order."""
        return [(l, h) for l in range(self.n_layers) for h in range(self.n_heads)]

    @property
    def bar_names(self) -> list[str]:
        """The scores that are fractions of attention in [0, 1]: the relations, then :data:`FRACTION_SCORES`."""
        return self.relations + list(FRACTION_SCORES)

    def special_keys(self, example: int = 0) -> list[int]:
        """Key positions a view may hide: the first token, and any [CLS]/[SEP]-like token."""
        return sorted({0, *(i for i, label in enumerate(self.labels[example]) if label in SPECIAL_LABELS)})

    def shown_map(self, layer: int, head: int, example: int = 0, *, hide_special: bool = False) -> np.ndarray:
        """A head's ``[T, S]`` map: as computed, or with :meth:`special_keys` hidden (rows renormalised)."""
        weights = self.attention[layer, example, head]
        return hide_keys(weights, self.special_keys(example)) if hide_special else weights

    def kv_group(self, head: int) -> list[int]:
        """The query heads that share ``head``'s K/V head (grouped-query attention); ``[head]`` without it."""
        if self.n_key_value_heads == self.n_heads:
            return [head]
        size = self.n_heads // self.n_key_value_heads
        return list(range(head // size * size, (head // size + 1) * size))

    def role_name(self, layer: int, head: int) -> str:
        """The head's role (:func:`mhalab.head_roles.role_of`): a relation, a generic score or ``"none"``."""
        return role_of(self.scores, layer, head, self.relations, self.threshold)

    def role(self, layer: int, head: int) -> str:
        """:meth:`role_name` with its score, or ``"none"`` with why (spread out, or no single position)."""
        best = self.role_name(layer, head)
        if best != NO_ROLE:
            return f"{best} ({float(self.scores[best][layer, head]):.2f})"
        spread = float(self.scores["entropy"][layer, head]) > 0.75 * np.log(self.S)
        return f"{NO_ROLE} ({'spread out' if spread else 'no single position'})"

    def ablation_text(self, layer: int, head: int) -> str:
        """One line: what switching this head off does to accuracy (overall and per relation); "" without one."""
        if self.ablation is None:
            return ""
        base, after = self.ablation.baseline, self.ablation.ablated
        text = f"head off (zero): accuracy {base['accuracy']:.3f} -> {float(after['accuracy'][layer, head]):.3f}"
        per_relation = [f"{r} {float(after[f'accuracy/{r}'][layer, head]):.2f}"
                        for r in self.relations if f"accuracy/{r}" in after]
        return text + ("   |  " + "  ".join(per_relation) if per_relation else "")


def head_data(model: nn.Module, batch: Any, task: Any = None, *, examples: int = 8,
              ablation: bool | AblationTable = True, text: str | None = None,
              layers: AttentionLayers | None = None) -> HeadData:
    """Run ``model`` once on ``batch`` (a task ``Batch``, whose ``sources`` give relation scores, or ``[B, T]``
    token ids) and gather what the views show. ``task``: token labels and ``task.metrics``; ``ablation``: zero
    each head once (needs ``task``), or an :class:`~mhalab.ablation.AblationTable` computed on the same batch;
    ``layers``: the model's :class:`AttentionLayers`, when already looked up."""
    tokens = getattr(batch, "inputs", batch)  # [B, T]
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"expected text, a task Batch or a [batch, seq] tensor of token ids, "
                        f"got {type(batch).__name__}")
    layers = layers or AttentionLayers(model)
    device = next(model.parameters()).device
    with eval_mode(model), _one_thread():
        _, cache = model.run_with_cache(tokens.to(device), names_filter=layers.patterns)
    attention = stack_attention(cache)  # [N, B, H, T, S]
    B, T, S = attention.shape[1], attention.shape[3], attention.shape[4]
    E = max(1, min(int(examples), B))
    relations = list(batch.sources) if getattr(batch, "sources", None) is not None else []
    scores = head_scores(attention, batch if relations else None)
    keys = {r: batch.sources[r][:E].cpu().numpy() for r in relations}  # where each highlight says a head looks
    for name in FRACTION_SCORES:  # the same keys in every example
        keys[name] = np.broadcast_to(fraction_keys(name, T, S).numpy(), (E, T))
    keys[NO_ROLE] = np.full((E, T), -1)
    label = getattr(task, "token_labels", None) or (lambda ids: [str(int(t)) for t in ids])
    if not isinstance(ablation, AblationTable):  # else computed already (e.g. by the notebook): reuse it
        ablation = ablate_each_head(model, task, batch) if ablation and task is not None else None
    return HeadData(
        attention=attention[:, :E].float().cpu().numpy(), scores={n: s.cpu().numpy() for n, s in scores.items()},
        labels=[list(label(tokens[e].cpu())) for e in range(E)], keys=keys, relations=relations, ablation=ablation,
        n_key_value_heads=layers.n_key_value_heads, text=text,
    )
