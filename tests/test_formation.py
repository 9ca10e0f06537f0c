"""mhalab.formation: the recorder keeps the right numbers at the right steps, and changes no training."""

import math

import pytest
import torch

from mhalab.formation import FormationRecorder
from mhalab.head_roles import induction_score, previous_token_score
from mhalab.models import ModelConfig, Transformer
from mhalab.tasks import MultiRelationTask, RepeatedSegments
from mhalab.train import train

FAST = dict(batch_size=16, device="cpu", progress=False, eval_batches=1, eval_batch_size=16)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small(task, seed=0, n_layers=2):
    torch.manual_seed(seed)
    return Transformer(ModelConfig.for_task(task, d_model=16, n_heads=2, n_layers=n_layers, attn_only=True))


TASK = RepeatedSegments(vocab_size=12, seq_len=24, n_segments=2, segment_lengths=(3, 6))


def test_records_every_step_it_is_called_with_what_it_promises():
    recorder = FormationRecorder(TASK, every=4, batch_size=8)
    model = small(TASK)
    train(model, TASK, steps=10, lr=1e-2, callback=recorder, **FAST)
    K = len(recorder.steps)
    assert recorder.steps == [0, 4, 8, 10]
    for name in ("loss", "repeated", "fresh", "icl"):
        assert recorder.loss(name).shape == (K,) and torch.isfinite(recorder.loss(name)).all()
    for name in ("induction", "previous-token"):
        values = recorder.score(name)
        assert values.shape == (K, 2, 2) and ((values >= 0) & (values <= 1 + 1e-6)).all()
    assert recorder.patterns.shape == (K, 2, 2, 24, 24)
    torch.testing.assert_close(recorder.patterns.sum(-1), torch.ones(K, 2, 2, 24))  # each query's weights sum to 1
    assert "4 steps recorded (0..10)" in repr(recorder)


def test_the_numbers_are_those_of_the_model_at_that_step():
    recorder = FormationRecorder(TASK, batch_size=8, icl_window=3)
    model = small(TASK)
    recorder(7, model)
    from mhalab.head_roles import stack_attention

    batch = recorder.batch
    with torch.no_grad():
        logits, cache = model.eval().run_with_cache(batch.inputs,
                                                    names_filter=lambda name: name.endswith("hook_pattern"))
    A = stack_attention(cache)
    torch.testing.assert_close(recorder.score("induction")[0], induction_score(A, batch.inputs))
    torch.testing.assert_close(recorder.score("previous-token")[0], previous_token_score(A))
    torch.testing.assert_close(recorder.patterns[0], A[:, 0])
    torch.testing.assert_close(recorder.example, batch.inputs[0])
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch.inputs[:, 1:].flatten(),
                                            reduction="none").view(8, 23)  # [B, T - 1]: target t + 1 at query t
    repeated = batch.sources["induction"][:, :-1] >= 0
    assert math.isclose(recorder.loss("loss")[0], float(nll.mean()), rel_tol=1e-5)
    assert math.isclose(recorder.loss("repeated")[0], float(nll[repeated].mean()), rel_tol=1e-5)
    assert math.isclose(recorder.loss("fresh")[0], float(nll[~repeated].mean()), rel_tol=1e-5)
    icl = float(nll[:, -3:].mean() - nll[:, :3].mean())  # late (queries 20..22) minus early (0..2)
    assert math.isclose(recorder.loss("icl")[0], icl, rel_tol=1e-5)
    assert recorder.steps == [7]


def test_a_recorded_run_trains_as_an_unrecorded_one():
    plain, watched = small(TASK), small(TASK)
    expected = train(plain, TASK, steps=8, lr=1e-2, **FAST)
    history = train(watched, TASK, steps=8, lr=1e-2, callback=FormationRecorder(TASK, every=3, batch_size=4), **FAST)
    assert history.train_loss == expected.train_loss


def test_reading_helpers():
    recorder = FormationRecorder(TASK, batch_size=4)
    with pytest.raises(ValueError, match="nothing recorded yet"):
        recorder.score("induction")
    model = small(TASK)
    for step in (0, 10, 20, 30):
        recorder(step, model)
    assert recorder.first_step(torch.tensor([0.1, 0.6, 0.4, 0.7]), 0.5) == 30  # reached and stays: only at 30
    assert recorder.first_step(torch.tensor([0.1, 0.6, 0.6, 0.7]), 0.5) == 10
    assert recorder.first_step(torch.tensor([4.0, 3.0, 1.0, 0.5]), 1.0, below=True) == 20
    assert recorder.first_step(torch.tensor([0.1, 0.2, 0.3, 0.4]), 0.5) is None
    with pytest.raises(ValueError, match=r"one number per recorded step, \[4\]"):
        recorder.first_step(torch.zeros(3), 0.5)
    final = recorder.score("induction")[-1]
    layer, head = recorder.best_head("induction")
    assert float(final[layer, head]) == float(final.max())
    assert recorder.best_head("previous-token", layers=[1])[0] == 1
    with pytest.raises(KeyError, match="no score 'copy'"):
        recorder.score("copy")
    with pytest.raises(KeyError, match="no loss 'accuracy'"):
        recorder.loss("accuracy")


def test_a_task_without_repeats_is_refused():
    with pytest.raises(TypeError, match="RepeatedSegments"):
        FormationRecorder(MultiRelationTask())
    with pytest.raises(ValueError, match="icl_window must be between 1 and 11"):
        FormationRecorder(TASK, icl_window=12)
