"""sweep_heads on a tiny task: one row per (heads, seed), equal parameter counts, determinism, clear errors."""

import matplotlib

matplotlib.use("Agg")

import sys
from dataclasses import replace

import pytest
import torch

from mhalab.models import ModelConfig
from mhalab.sweep import SweepResults, SweepRow, sweep_heads
from mhalab.tasks import MultiRelationTask, TableLookup
from mhalab.train import TrainConfig


def one_layer(task, **fields) -> ModelConfig:
    return ModelConfig.for_task(task, d_model=8, n_layers=1, **fields)


@pytest.fixture(scope="module")
def tiny():
    task = MultiRelationTask((-1, 1), vocab_size=5, seq_len=6)
    return task, sweep_heads(task, model=one_layer(task), heads=(1, 2, 8), seeds=(0, 1), steps=3, device="cpu",
                             eval_batches=1, eval_batch_size=16, progress=False)


def test_one_row_per_run_with_equal_parameters(tiny):
    _, results = tiny
    assert [(r.heads, r.seed) for r in results.rows] == [(1, 0), (1, 1), (2, 0), (2, 1), (8, 0), (8, 1)]
    assert [r.d_head for r in results.rows] == [8, 8, 4, 4, 1, 1]
    assert len({r.parameters for r in results.rows}) == 1
    for r in results.rows:
        assert set(r.relations) == {"left1", "right1"}
        assert 0.0 <= r.accuracy <= 1.0 and r.loss > 0 and r.seconds > 0
        # overall accuracy is the mean of the two relations (both have the same number of targets here)
        assert r.accuracy == pytest.approx(sum(r.relations.values()) / 2, abs=1e-6)


def test_summaries_gaps_and_printing(tiny):
    _, results = tiny
    assert results.heads == [1, 2, 8] and results.seeds == [0, 1]
    by_seed = results.by_seed()
    for seed, gap in results.gaps(8).items():
        assert gap == pytest.approx(max(by_seed[seed].values()) - by_seed[seed][8])
        assert gap >= 0
    assert results.best_heads() in (1, 2, 8)
    text = str(results)
    assert "heads" in text and "left1" in text and len(text.splitlines()) == 1 + 1 + 6
    assert len(results.summary().splitlines()) == 1 + 3
    assert results.config.steps == 3 and results.config.batch_size == 32 and not results.config.progress
    with pytest.raises(KeyError, match="not swept"):
        results.gaps(4)
    with pytest.raises(KeyError, match="unknown metric"):
        results.by_heads("speed")
    ax = results.plot()
    assert len(ax.get_xticks()) == 3


def test_same_seed_same_result(tiny):
    task, results = tiny
    again = sweep_heads(task, model=one_layer(task), heads=(2,), seeds=(1,), steps=3, device="cpu", eval_batches=1,
                        eval_batch_size=16, progress=False)
    first = next(r for r in results.rows if (r.heads, r.seed) == (2, 1))
    assert again.rows[0].loss == first.loss and again.rows[0].relations == first.relations
    config = TrainConfig(steps=3, batch_size=32, lr=5e-3, device="cpu", eval_batches=1, eval_batch_size=16)
    from_config = sweep_heads(task, model=one_layer(task), heads=(2,), seeds=(1,), config=config, progress=False)
    assert from_config.rows[0].loss == first.loss and from_config.config == replace(config, progress=False)


def test_the_callers_random_state_is_untouched(tiny):
    task, _ = tiny
    torch.manual_seed(123)
    expected = torch.rand(3)
    for workers in (1, 2):  # two: the kept models are rebuilt here from the workers' weights
        torch.manual_seed(123)
        sweep_heads(task, model=one_layer(task), heads=(1, 2), seeds=(0,), steps=1, device="cpu", eval_batches=1,
                    eval_batch_size=4, progress=False, workers=workers, keep_models=True)
        assert torch.equal(torch.rand(3), expected), workers


def test_bad_settings_fail_before_training():
    task = MultiRelationTask((-1, 1), vocab_size=5, seq_len=6)
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        sweep_heads(task, model=one_layer(task), heads=(1, 3), steps=1, progress=False)
    with pytest.raises(ValueError, match="seeds has repeats"):
        sweep_heads(task, model=one_layer(task), heads=(1,), seeds=(0, 0), steps=1, progress=False)
    with pytest.raises(TypeError, match=r"model must be a ModelConfig .*got dict.*ModelConfig.for_task"):
        sweep_heads(task, model={"d_model": 8}, heads=(1,), steps=1, progress=False)
    with pytest.raises(ValueError, match="d_vocab 9 != task's vocab_size 5.*for_task"):
        sweep_heads(task, model=ModelConfig(d_vocab=9, d_model=8), heads=(1,), steps=1, progress=False)
    with pytest.raises(ValueError, match="sets seed itself"):
        sweep_heads(task, model=one_layer(task), heads=(1,), steps=1, seed=3, progress=False)
    with pytest.raises(TypeError, match=r"unknown training setting\(s\) \['learning_rate'\]"):
        sweep_heads(task, model=one_layer(task), heads=(1,), steps=1, learning_rate=0.1, progress=False)


def test_results_can_be_built_by_hand():
    runs = [(1, 0, 0.2), (4, 0, 0.9), (1, 1, 0.4), (4, 1, 0.5)]
    rows = [SweepRow(h, 4 // h, s, 10, 1.0, acc, {}, 0.1) for h, s, acc in runs]
    results = SweepResults(rows, d_model=4, steps=1)
    assert results.by_heads() == {1: [0.2, 0.4], 4: [0.9, 0.5]}
    assert results.gaps(1) == pytest.approx({0: 0.7, 1: 0.1})
    assert results.best_heads() == 4


def test_eval_every_keeps_a_held_out_curve_per_run():
    task = MultiRelationTask((-1, 1), vocab_size=5, seq_len=6)
    results = sweep_heads(task, model=one_layer(task), heads=(1, 2), seeds=(0,), steps=4, eval_every=2, device="cpu",
                          eval_batches=1, eval_batch_size=16, progress=False)
    assert results.eval_steps == [2, 4]
    for r in results.rows:
        assert [s for s, _ in r.evals] == [2, 4] and r.evals[-1][1]["accuracy"] == pytest.approx(r.accuracy)
    assert results.by_heads(step=4) == results.by_heads()
    assert results.by_seed("left1", step=2)[0][1] == results.rows[0].evals[0][1]["accuracy/left1"]
    with pytest.raises(KeyError, match=r"no evaluation at step 3; the runs were evaluated at \[2, 4\]"):
        results.by_heads(step=3)


def test_threads_are_restored_after_the_sweep():
    task = MultiRelationTask((-1, 1), vocab_size=5, seq_len=6)
    before = torch.get_num_threads()
    sweep_heads(task, model=one_layer(task), heads=(1,), seeds=(0,), steps=1, device="cpu", eval_batches=1,
                eval_batch_size=4, threads=1, progress=False)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be at least 1"):
        sweep_heads(task, model=one_layer(task), heads=(1,), steps=1, threads=0, progress=False)


def test_initial_weights_do_not_share_bits_with_the_batches(monkeypatch):
    """The initialisation was seeded with torch.manual_seed(seed) and the batches with
    torch.Generator().manual_seed(seed): the same stream. Each now has its own (mhalab.train.stream_seed)."""
    import mhalab.sweep as sweep_module

    n, seen = 16, {}
    real_transformer = sweep_module.Transformer

    def recording_transformer(config):
        seen["init"] = torch.rand(n, generator=torch.Generator().set_state(torch.get_rng_state()))
        return real_transformer(config)

    class Recording(MultiRelationTask):
        def sample(self, batch_size, *, generator, device=None):
            if torch.is_grad_enabled() and "data" not in seen:
                seen["data"] = torch.rand(n, generator=torch.Generator().set_state(generator.get_state()))
            return super().sample(batch_size, generator=generator, device=device)

    monkeypatch.setattr(sweep_module, "Transformer", recording_transformer)
    task = Recording((-1, 1), vocab_size=5, seq_len=6)
    sweep_heads(task, model=one_layer(task), heads=(2,), seeds=(4,), steps=1, device="cpu", eval_batches=1,
                eval_batch_size=4, progress=False)
    assert not torch.equal(seen["init"], seen["data"])


def test_two_workers_give_the_results_of_one(tiny):
    """workers=2 trains in forked processes; every row, and every kept model, is what one process gives."""
    task, results = tiny
    if not sys.platform.startswith("linux"):
        pytest.skip("workers=2 forks processes on Linux only; elsewhere it runs one at a time")
    parallel = sweep_heads(task, model=one_layer(task), heads=(1, 2, 8), seeds=(0, 1), steps=3, device="cpu",
                           eval_batches=1, eval_batch_size=16, progress=False, workers=2, keep_models=True)
    assert [(r.heads, r.seed) for r in parallel.rows] == [(r.heads, r.seed) for r in results.rows]
    for mine, theirs in zip(parallel.rows, results.rows):
        assert (mine.loss, mine.accuracy, mine.relations) == (theirs.loss, theirs.accuracy, theirs.relations)
    one = sweep_heads(task, model=one_layer(task), heads=(2,), seeds=(1,), steps=3, device="cpu", eval_batches=1,
                      eval_batch_size=16, progress=False, keep_models=True)
    kept, expected = parallel.models[(2, 1)], one.models[(2, 1)]
    assert not kept.training
    for (name, a), (_, b) in zip(kept.state_dict().items(), expected.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="workers must be at least 1"):
        sweep_heads(task, model=one_layer(task), heads=(1,), steps=1, workers=0, progress=False)


def test_off_linux_workers_train_in_this_process(tiny, monkeypatch):
    import mhalab.sweep as sweep_module

    def no_pool(*args, **kwargs):
        raise AssertionError("off Linux, sweep_heads must not fork worker processes")

    task, results = tiny
    monkeypatch.setattr(sweep_module.sys, "platform", "darwin")
    monkeypatch.setattr(sweep_module, "ProcessPoolExecutor", no_pool)
    serial = sweep_heads(task, model=one_layer(task), heads=(2,), seeds=(1,), steps=3, device="cpu", eval_batches=1,
                         eval_batch_size=16, progress=False, workers=2)
    first = next(r for r in results.rows if (r.heads, r.seed) == (2, 1))
    assert serial.rows[0].loss == first.loss and serial.rows[0].relations == first.relations


@pytest.mark.gpu
def test_with_a_gpu_two_workers_train_in_this_process_and_kept_models_are_on_the_cpu(tiny):
    """Where torch sees a GPU, the first backward pass (the `tiny` fixture's, on the CPU) starts autograd's device
    threads, and a forked child can no longer run autograd ("Unable to handle autograd's threading in combination
    with fork-based multiprocessing"): workers=2 then trains here, with the same results."""
    task, results = tiny
    on_gpu = sweep_heads(task, model=one_layer(task), heads=(2,), seeds=(0,), steps=3, device="cuda",
                         eval_batches=1, eval_batch_size=16, progress=False, keep_models=True)
    assert all(p.device.type == "cpu" for p in on_gpu.models[(2, 0)].parameters())  # handed back where built
    again = sweep_heads(task, model=one_layer(task), heads=(1, 2, 8), seeds=(0, 1), steps=3, device="cpu",
                        eval_batches=1, eval_batch_size=16, progress=False, workers=2)
    assert [(r.heads, r.seed, r.loss, r.accuracy) for r in again.rows] == \
        [(r.heads, r.seed, r.loss, r.accuracy) for r in results.rows]


def test_a_given_embedding_reaches_every_model_and_stays_fixed():
    """embedding= gives every model the same fixed rows, in this process and in forked workers alike."""
    from mhalab.train import train

    task = TableLookup(n_tables=2, n_entries=3, n_keys=5, n_values=3, n_queries=4, shift=1)
    code = task.factored_code(12)
    settings = dict(model=ModelConfig.for_task(task, d_model=12, n_layers=1), heads=(1, 2), seeds=(0,), steps=3,
                    device="cpu", eval_batches=1, eval_batch_size=8, progress=False, keep_models=True)
    state = torch.random.get_rng_state()
    results = {w: sweep_heads(task, embedding=code, workers=w, **settings) for w in (1, 2)}
    assert torch.equal(torch.random.get_rng_state(), state)  # checking the embedding drew nothing from the caller's
    for (heads, seed), model in results[1].models.items():
        assert torch.equal(model.embed.tokens.weight, code[0])
        assert torch.equal(model.embed.positions.weight[: task.seq_len], code[1])
        for (name, a), (_, b) in zip(model.state_dict().items(), results[2].models[heads, seed].state_dict().items()):
            assert torch.equal(a, b), name  # forked workers train what this process does
    kept = results[2].models[2, 0]  # rebuilt in this process from a worker's weights: still given, still fixed
    train(kept, task, steps=2, lr=1e-1, batch_size=4, progress=False, device="cpu")
    assert torch.equal(kept.embed.tokens.weight, code[0])
    as_list = sweep_heads(task, embedding=list(code), **settings)
    assert [r.loss for r in as_list.rows] == [r.loss for r in results[1].rows]
    with pytest.raises(TypeError, match=r"embedding must be two things, \(tokens, positions\).*got Tensor"):
        sweep_heads(task, embedding=code[0], **settings)
    with pytest.raises(TypeError, match="got tuple of length 3"):
        sweep_heads(task, embedding=(*code, None), **settings)
    with pytest.raises(ValueError, match="tokens must be a tensor of d_vocab=20 rows of width d_model=12"):
        sweep_heads(task, embedding=(code[0][:, :8], None), **settings)


def test_an_attention_only_sweep_with_the_code_given():
    """Notebook 06's sweep: attention-only models take the given rows too, in forked workers alike, and what
    trains is the heads and the readout (no MLP to train)."""
    task = TableLookup(n_tables=2, n_entries=3, n_keys=5, n_values=3, n_queries=4, shift=1)
    code = task.factored_code(12)
    config = ModelConfig.for_task(task, d_model=12, n_layers=1, attn_only=True)
    settings = dict(model=config, heads=(1, 4), seeds=(0,), steps=3, device="cpu", eval_batches=1,
                    eval_batch_size=8, progress=False, keep_models=True, embedding=code)
    results = {w: sweep_heads(task, workers=w, **settings) for w in (1, 2)}
    assert [r.loss for r in results[1].rows] == [r.loss for r in results[2].rows]
    for (heads, seed), model in results[2].models.items():
        assert model.config.attn_only and model.config.n_heads == heads
        assert torch.equal(model.embed.tokens.weight, code[0])
        trains = {name.split(".")[0] for name, p in model.named_parameters() if p.requires_grad}
        assert "embed" not in trains and "blocks" in trains
        assert not any("mlp" in name for name, _ in model.named_parameters())


def test_snapshots_keep_each_run_part_way_and_train_as_without():
    """snapshots= keeps every run's model at the steps asked for (here and in forked workers alike), without
    changing the run: each snapshot scores what the run's own held-out evaluation at that step recorded."""
    from mhalab.train import evaluate

    task = TableLookup(n_tables=2, n_entries=3, n_keys=5, n_values=3, n_queries=4, shift=1)
    settings = dict(model=ModelConfig.for_task(task, d_model=12, n_layers=1), heads=(1, 4), seeds=(0, 1), steps=4,
                    eval_every=2, device="cpu", eval_batches=1, eval_batch_size=8, progress=False)
    plain = sweep_heads(task, **settings)
    assert plain.snapshots == {}
    for workers in (1, 2):
        results = sweep_heads(task, workers=workers, snapshots=(2,), keep_models=workers == 1, **settings)
        assert [(r.loss, r.evals) for r in results.rows] == [(r.loss, r.evals) for r in plain.rows]
        assert sorted(results.snapshots) == [(1, 0, 2), (1, 1, 2), (4, 0, 2), (4, 1, 2)]
        assert (workers == 1) == bool(results.models)   # final models only where asked for
        for (heads, seed, step), model in results.snapshots.items():
            assert not model.training and model.config.n_heads == heads
            recorded = dict(next(r for r in results.rows if (r.heads, r.seed) == (heads, seed)).evals)[step]
            assert evaluate(model, task, batches=1, batch_size=8)["accuracy"] == recorded["accuracy"]
    with pytest.raises(ValueError, match=r"each step of snapshots must be between 1 and 4 \(the runs train 4 steps\)"):
        sweep_heads(task, snapshots=(5,), **settings)
    with pytest.raises(ValueError, match="snapshots has repeats"):
        sweep_heads(task, snapshots=(2, 2), **settings)


def test_held_out_change_is_the_recorded_change_with_the_spread_between_sequences():
    """held_out_change: the difference of the two recorded held-out accuracies, and its standard error from the
    change of each held-out sequence, computed here one sequence at a time with the task's own metrics."""
    from mhalab.sweep import held_out_change
    from mhalab.tasks import Batch
    from mhalab.train import EVAL_SEED, stream_seed

    task = TableLookup(n_tables=2, n_entries=3, n_keys=5, n_values=3, n_queries=4, shift=1)
    results = sweep_heads(task, model=ModelConfig.for_task(task, d_model=12, n_layers=1), heads=(2,), seeds=(0,),
                          steps=30, lr=3e-2, eval_every=10, device="cpu", eval_batches=2, eval_batch_size=16,
                          progress=False, keep_models=True, snapshots=(10,))
    before, after = results.snapshots[2, 0, 10], results.models[2, 0]
    change, error = held_out_change(before, after, task, results.config)
    curve = dict(results.rows[0].evals)
    assert change == pytest.approx(curve[30]["accuracy"] - curve[10]["accuracy"], abs=1e-6)
    generator = torch.Generator().manual_seed(stream_seed(EVAL_SEED, "eval"))
    batches = [task.sample(16, generator=generator) for _ in range(2)]
    singles = [Batch(b.inputs[i:i + 1], b.targets[i:i + 1], {k: v[i:i + 1] for k, v in b.sources.items()})
               for b in batches for i in range(16)]
    with torch.no_grad():
        per_sequence = torch.tensor([task.metrics(after(s.inputs), s)["accuracy"]
                                     - task.metrics(before(s.inputs), s)["accuracy"] for s in singles])
    assert change == pytest.approx(float(per_sequence.mean()), abs=1e-6)
    assert error == pytest.approx(float(per_sequence.std() / 32 ** 0.5), rel=1e-5) and error > 0
    assert held_out_change(after, after, task, results.config) == (0.0, 0.0)
    with pytest.raises(TypeError, match="config must be the sweep's TrainConfig"):
        held_out_change(before, after, task, None)
