"""``q.check`` and the grade agree on every corpus entry (issue 47, point 2). Each entry of tests/labs_corpus.py is
checked by the learner's live ``q.check`` (here, as in the learner's kernel) and handed in through the grading path
an instructor runs (:func:`mhalab_grader.grade.grade` on a submission, in the sandbox, its kernel forked from one
prepared per notebook, as ``python -m mhalab_grader grade`` does for a class), and both give the same outcome: right
answers pass, wrong ones fail, and both messages name the mistake the corpus names (where it names one of
``q.check``'s fixed cases, the grade's fresh cases need not hold it: then both fail) and neither says what MISBLAMED
says it must not. NumPy scalars (np.int64, np.bool_, np.float32) and 0-d torch tensors are among the answers, and a
test below shows they are.

The grader draws its hidden inputs from a seed; here it is fixed, one per notebook (SEED + its number), so that a
failure can be replayed (one seed: 09.3 draws its hidden models once per seed, which takes most of its time). A
submission holds one entry of each of its notebook's exercises, so a notebook takes as many graded submissions as
its exercise with the most entries: 180 submissions for the 383 entries. Slow: about 4 minutes of processor time
in all here (the grader's and its kernels'), two thirds of it notebook 09's, whose 09.3 runs a 30-layer model."""

from __future__ import annotations

import time

import nbformat
import numpy as np
import pytest
import torch
from labs_corpus import CORPUS, MISBLAMED, as_the_corpus_asks, names_a_fixed_case
from labs_fixture import TESTS, answer_meta
from mhalab_grader.grade import grade, prepare

import mhalab.labs as labs
from mhalab.labs.core import grade_id
from mhalab.labs.verdicts import PASSED, STRICT_ENV

pytestmark = pytest.mark.slow

SEED = 47_000
NOTEBOOKS = sorted({key[:2] for key in CORPUS} & set(labs.available_notebooks()))


def _entries(key: str) -> list[tuple[str, int, str, object, str | None]]:
    """(kind, index, the expression that reaches it in the kernel, the answer, its expected message)."""
    right = [("right", i, f"labs_corpus.CORPUS[{key!r}]['right'][{i}]", a, None)
             for i, a in enumerate(CORPUS[key]["right"])]
    wrong = [("wrong", i, f"labs_corpus.CORPUS[{key!r}]['wrong'][{i}][0]", a, e)
             for i, (a, e) in enumerate(CORPUS[key]["wrong"])]
    return right + wrong


def _setup(nb: str) -> str:
    """The instructor's first cell: the corpus (tests/ is not in the sandbox: its three modules, numpy and torch
    only, are sent as source, in the order they import each other), then the notebook's exercises."""
    cell = "import sys, types\n"
    for name in ("labs_cells", "labs_learners", "labs_corpus"):
        source = (TESTS / f"{name}.py").read_text()
        cell += (f"{name} = sys.modules[{name!r}] = types.ModuleType({name!r})\n"
                 f"exec(compile({source!r}, '{name}.py', 'exec'), {name}.__dict__)\n")
    n = len(labs.load(nb))
    return cell + f"from mhalab import labs\n{', '.join(f'q{i + 1}' for i in range(n))}{',' if n == 1 else ''} = " \
                  f"labs.load({nb!r})"


def _answer_cell(ex, expression: str, *, solution: bool) -> nbformat.NotebookNode:
    body = f"answer = {expression}"
    source = f"### BEGIN SOLUTION\n{body}\n### END SOLUTION" if solution else body
    cell = nbformat.v4.new_code_cell(f"{source}\nq{ex.number}.check(answer)")
    cell.metadata["nbgrader"] = answer_meta(grade_id(ex.key))
    return cell


def _notebook(nb: str, entry: int | None) -> nbformat.NotebookNode:
    """The instructor's notebook (``entry`` None: the setup cell, and each exercise's first right answer as its
    solution), or submission ``entry``: the answer cell of each exercise that has that many entries, handing it
    in (an exercise with fewer has no answer cell: missing, and not judged)."""
    cells = [nbformat.v4.new_code_cell(_setup(nb))] if entry is None else []
    for ex in labs.load(nb):
        entries = _entries(ex.key)
        if entry is None or entry < len(entries):
            cells.append(_answer_cell(ex, entries[0 if entry is None else entry][2], solution=entry is None))
    return nbformat.v4.new_notebook(cells=cells)


def _disagreements(ex, kind, i, answer, expected, graded) -> list[str]:
    """What is off between the learner's q.check and the grade of one entry (empty: they agree, as the corpus
    asks)."""
    ex.check(answer)
    live = (ex.last_status, ex.last_message)
    off = []
    for where, (status, message) in (("q.check", live), ("the grade", (graded.status, graded.message))):
        fixed = where == "the grade" and names_a_fixed_case(expected or "")  # then only its failing is compared
        if not as_the_corpus_asks(kind, "" if fixed else expected or "", status, message):
            off.append(f"{where}: {status}, {message!r}" + (f"; expected {expected!r} in it" if expected else ""))
        for unsaid in (u for a, u in MISBLAMED.get(ex.key, []) if a is answer):
            if unsaid in message:
                off.append(f"{where}: says {unsaid!r}: {message!r}")
    return [f"{ex.key} {kind} {i}: {line}" for line in off]


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_q_check_and_the_grade_agree_on_every_corpus_entry(nb, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(STRICT_ENV, raising=False)  # q.check prints its verdict, as in a learner's kernel
    source = tmp_path / "source" / f"{nb}_corpus.ipynb"
    source.parent.mkdir()
    nbformat.write(_notebook(nb, None), source)
    exercises = labs.load(nb)
    submissions = max(len(_entries(ex.key)) for ex in exercises)
    start, off, judged = time.perf_counter(), [], 0
    prepared = prepare(nb, source=source, timeout=300)
    try:
        assert prepared.usable and not prepared.errors, prepared.errors
        for entry in range(submissions):
            path = tmp_path / f"{nb}_submission_{entry}.ipynb"
            nbformat.write(_notebook(nb, entry), path)
            report = grade(path, source=source, timeout=300, seed=SEED + int(nb), prepared=prepared)
            assert not report.kernel_died and not report.errors, report.format()
            for ex, graded in zip(exercises, report.exercises):
                entries = _entries(ex.key)
                if entry < len(entries):
                    kind, i, _, answer, expected = entries[entry]
                    off += _disagreements(ex, kind, i, answer, expected, graded)
                    judged += 1
    finally:
        prepared.close()
    capsys.readouterr()
    print(f"notebook {nb}: {judged} entries in {submissions} graded submissions, {time.perf_counter() - start:.0f} s")
    assert judged == sum(len(_entries(ex.key)) for ex in exercises)
    assert not off, "\n".join(off)


# --------------------------------------------------------------------------- the transport's hard cases are there

#: (exercise, the name of a right answer, the type it returns): what the grader's transport turns into plain data
#: (an np.int64 into an int, a 0-d tensor into a tensor), which q.check must accept as the grade does.
RETURNS = [
    ("12.1", "qk_circuit_numpy", np.int64),       # np.linalg.matrix_rank's rank
    ("11.1", "floor_numpy", np.float64),
    ("11.1", "floor_float32", np.float32),
    ("06.1", "enough_numpy_ints", np.int64),      # a list of them
    ("06.2", "trade_numpy", np.str_),
    ("12.2", "copying_numpy_float32", np.float32),
    ("06.1", "enough_tensor_items", torch.Tensor),  # a list of 0-d torch integers
    ("12.1", "qk_circuit_tensor_rank", torch.Tensor),  # a 0-d torch integer
    ("08.1", "p_as_tensor", torch.Tensor),         # a 0-d torch float
    ("08.1", "p_numpy", np.float64),
]


@pytest.mark.parametrize(("key", "name", "kind"), RETURNS, ids=[f"{k}-{n}" for k, n, _ in RETURNS])
def test_the_corpus_holds_answers_returning_numpy_scalars_and_0d_tensors(key, name, kind, monkeypatch, capsys):
    monkeypatch.delenv(STRICT_ENV, raising=False)
    answer = next(a for a in CORPUS[key]["right"] if getattr(a, "__name__", "") == name)
    returned = []

    def watched(*args):  # the answer, its results kept (q.check sees what it returns)
        out = answer(*args)
        returned.append(out)
        return out

    ex = labs.exercise(*key.split("."))
    ex.check(watched)
    assert ex.last_status == PASSED, ex.last_message
    parts = returned + [x for r in returned if isinstance(r, (tuple, list)) for x in r]
    assert [x for x in parts if isinstance(x, kind) and (not isinstance(x, torch.Tensor) or x.dim() == 0)], returned
