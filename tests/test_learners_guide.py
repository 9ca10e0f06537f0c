"""The learners' guide's table of TransformerLens 4 calls (website/learners.md, "From mhalab to TransformerLens 4"):
every code span of its mhalab column runs, top to bottom, in one namespace, as the guide says it does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "website" / "learners.md"
MARKER = "<!-- tl-table"


def table_rows() -> list[tuple[str, list[str]]]:
    """``(what the row is, the code spans of its mhalab cell)`` for every row of the table after MARKER."""
    text = GUIDE.read_text()
    assert MARKER in text, f"{GUIDE.name} has lost its TransformerLens table (marked {MARKER!r})"
    rows = []
    for line in text[text.index(MARKER):].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 3 or set(cells[1]) <= set("-") or cells[1] == "mhalab":
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def test_the_table_has_the_calls_the_course_teaches():
    rows = dict(table_rows())
    assert len(rows) >= 20
    code = " ".join(span for spans in rows.values() for span in spans)
    for call in ("run_with_cache", "run_with_hooks", "stack_head_results", "logit_attrs", "decompose_resid",
                 "accumulated_resid(apply_ln=True)", "all_composition_scores", "set_use_attn_result", ".QK[",
                 ".OV[", "W_U", "hook_scale", "hook_in", "return_type", "positional_embedding_type"):
        assert call in code, f"the table lost {call}"


def test_every_mhalab_call_of_the_table_runs(smollm2):
    import torch

    from mhalab import circuits
    from mhalab.models import ModelConfig, Transformer
    from mhalab.pretrained import load_smollm2

    torch.manual_seed(0)
    namespace = {"torch": torch, "circuits": circuits, "ModelConfig": ModelConfig, "Transformer": Transformer,
                 "load_smollm2": load_smollm2}
    ran = 0
    for what, spans in table_rows():
        for span in spans:
            try:
                with torch.no_grad():
                    exec(compile(span, f"learners.md: {what}", "exec"), namespace)
            except Exception as error:  # noqa: BLE001 - the row and the call say what broke
                pytest.fail(f"the guide's row {what!r}: `{span}` raised {type(error).__name__}: {error}")
            ran += 1
    assert ran >= 30 and isinstance(namespace["model"], Transformer)
    assert namespace["llm"].cfg.n_key_value_heads == 3  # the real model the table loads
