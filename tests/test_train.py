"""Tests for mhalab.train: learning, exact resume, divergence, validation, checkpoints.

The tasks here are tiny ones defined in this file (the Task protocol of mhalab.tasks), so that
these tests do not depend on the course's tasks and run in a few seconds.
"""

from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F

from mhalab.checkpoint import load_checkpoint, save_checkpoint
from mhalab.encoder_decoder import EncoderDecoder
from mhalab.models import ModelConfig, Transformer
from mhalab.train import (
    CallbackFailed,
    History,
    TrainConfig,
    TrainingDiverged,
    evaluate,
    make_config,
    stream_seed,
    train,
)


@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor
    sources: dict
    decoder_inputs: torch.Tensor | None = None

    def to(self, device):  # what training calls on a GPU (it draws every batch on the CPU)
        moved = {k: v.to(device) for k, v in vars(self).items() if torch.is_tensor(v)}
        return Batch(**{**vars(self), **moved, "sources": {k: v.to(device) for k, v in self.sources.items()}})


class PreviousToken:
    """Predict the token one to the left (a task one attention head solves)."""

    name = "previous-token"
    vocab_size = 8
    seq_len = 8
    n_targets = 1
    relations = ("previous",)
    causal = True

    def __init__(self):
        self.samples = 0  # how many batches were drawn (tests use it to see if training started)

    def sample(self, batch_size, *, generator, device=None):
        self.samples += 1
        device = generator.device if device is None else device
        x = torch.randint(0, self.vocab_size, (batch_size, self.seq_len), generator=generator, device=device)
        y = torch.full_like(x, -100)
        y[:, 1:] = x[:, :-1]
        pos = torch.arange(self.seq_len, device=device).expand(batch_size, -1)
        return Batch(x, y, {"previous": pos - 1})

    def loss(self, logits, batch):
        flat = logits.reshape(-1, self.vocab_size).float()
        return F.cross_entropy(flat, batch.targets.reshape(-1), ignore_index=-100)

    def metrics(self, logits, batch):
        valid = batch.targets != -100
        correct = (logits.argmax(-1) == batch.targets) & valid
        return {"loss": float(self.loss(logits, batch)), "accuracy": float(correct.sum() / valid.sum())}

    def token_labels(self, tokens_1d):
        return [str(int(t)) for t in tokens_1d]


class InterruptAt(PreviousToken):
    """Raises KeyboardInterrupt when drawing the batch of training step ``at`` (like Ctrl-C mid-run)."""

    def __init__(self, at):
        super().__init__()
        self.at = at
        self.training_samples = 0

    def sample(self, batch_size, *, generator, device=None):
        if torch.is_grad_enabled():  # evaluation draws its batches under no_grad
            self.training_samples += 1
            if self.training_samples == self.at:
                raise KeyboardInterrupt
        return super().sample(batch_size, generator=generator, device=device)


class NaNAt(PreviousToken):
    """The loss of training step ``at`` is NaN (as when the weights blow up)."""

    def __init__(self, at):
        super().__init__()
        self.at = at
        self.losses = 0

    def loss(self, logits, batch):
        loss = super().loss(logits, batch)
        if torch.is_grad_enabled():
            self.losses += 1
            if self.losses == self.at:
                return loss * float("nan")
        return loss


def model_for(task, seed=0, **overrides):
    torch.manual_seed(seed)
    return Transformer(ModelConfig.for_task(task, **{**dict(d_model=16, n_heads=2, n_layers=1), **overrides}))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: one thread is faster, and on a shared or xdist-split CPU, several
    threads per process oversubscribe the cores and make every step many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# A CUDA generator's state, as a checkpoint written on a GPU holds it: Philox seed 5, offset 32 (16 bytes).
PHILOX = torch.tensor([5, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)
FAST = dict(batch_size=32, device="cpu", progress=False, eval_batches=1, eval_batch_size=64)
# the resume-across-devices runs: saved at step 6, interrupted at step 9
_RESUMED = dict(steps=12, checkpoint_every=6, lr=1e-2, **FAST)


# ------------------------------------------------------------------ learning
def test_loss_falls_and_accuracy_rises():
    task = PreviousToken()
    model = model_for(task)
    before = evaluate(model, task, batches=2, batch_size=64)
    history = train(model, task, steps=150, lr=1e-2, eval_every=50, **FAST)
    assert len(history.steps) == len(history.train_loss) == len(history.lr) == 150
    assert history.steps == list(range(1, 151))
    first, last = sum(history.train_loss[:10]) / 10, sum(history.train_loss[-10:]) / 10
    assert last < 0.5 * first, (first, last)
    assert [s for s, _ in history.evals] == [50, 100, 150]
    assert history.final["accuracy"] > before["accuracy"] + 0.3
    assert max(history.lr) == pytest.approx(1e-2, rel=0.05)  # warm-up reaches the peak, cosine decays it
    assert history.lr[-1] < 0.2e-2 and history.lr[0] < 0.5e-2
    assert history.device == "cpu" and history.precision == "fp32" and history.elapsed > 0


def test_encoder_decoder_trains_on_batches_with_decoder_inputs():
    class Reverse(PreviousToken):
        name = "reverse"
        causal = False

        def sample(self, batch_size, *, generator, device=None):
            src = torch.randint(1, self.vocab_size, (batch_size, self.seq_len), generator=generator, device=device)
            tgt = src.flip(1)
            bos = torch.zeros(batch_size, 1, dtype=torch.long, device=src.device)
            return Batch(src, tgt, {}, decoder_inputs=torch.cat([bos, tgt[:, :-1]], dim=1))

    task = Reverse()
    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig.for_task(task, d_model=16, n_heads=2, n_layers=1))
    history = train(model, task, steps=40, lr=1e-2, **FAST)
    assert sum(history.train_loss[-5:]) < sum(history.train_loss[:5])


# -------------------------------------------------------------------- resume
def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    kwargs = dict(steps=24, lr=1e-2, checkpoint_every=5, eval_every=8, seed=3, **FAST)
    overrides = dict(dropout=0.1)  # dropout draws random numbers too: their state must be restored

    reference = model_for(PreviousToken(), **overrides)
    expected = train(reference, PreviousToken(), checkpoint=tmp_path / "straight.pt", **kwargs)

    path = tmp_path / "interrupted.pt"
    with pytest.raises(KeyboardInterrupt):
        train(model_for(PreviousToken(), **overrides), InterruptAt(13), checkpoint=path, **kwargs)  # dies in step 13
    assert load_checkpoint(path)["step"] == 10

    resumed_model = model_for(PreviousToken(), seed=99, **overrides)  # other initial weights: all come from the file
    task = PreviousToken()
    resumed = train(resumed_model, task, checkpoint=path, **kwargs)
    assert task.samples == 14 + 2  # steps 11..24, and one held-out batch at steps 16 and 24 each
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs after resuming"
    assert resumed.train_loss == expected.train_loss
    assert resumed.evals == expected.evals


def test_resume_with_other_settings_is_refused(tmp_path):
    path = tmp_path / "run.pt"
    task = PreviousToken()
    train(model_for(task), task, steps=4, checkpoint=path, **FAST)
    with pytest.raises(ValueError, match=r"other settings.*'lr': \(0.003, 0.01\)"):
        train(model_for(task), task, steps=8, lr=0.01, checkpoint=path, **FAST)
    with pytest.raises(ValueError, match="another model configuration"):
        train(model_for(task, d_model=32), task, steps=4, checkpoint=path, **FAST)
    with pytest.warns(UserWarning, match="schedule is stretched"):  # more steps than planned: allowed, but said
        train(model_for(task), task, steps=5, checkpoint=path, **FAST)
    with pytest.raises(ValueError, match="already at step 5, beyond steps=2"):
        train(model_for(task), task, steps=2, checkpoint=path, **FAST)


def test_finished_checkpoint_just_loads(tmp_path):
    path = tmp_path / "run.pt"
    task = PreviousToken()
    trained = model_for(task)
    first = train(trained, task, steps=6, checkpoint=path, **FAST)
    again = model_for(task, seed=5)
    second = train(again, task, steps=6, checkpoint=path, **FAST)
    assert second.train_loss == first.train_loss
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), again.state_dict().values()))


def test_checkpoint_holds_only_plain_values_and_tensors(tmp_path):
    path = tmp_path / "run.pt"
    task = PreviousToken()
    model = model_for(task)
    history = train(model, task, steps=6, checkpoint=path, **FAST)
    state = torch.load(path, weights_only=True)  # would fail on pickled classes
    assert state["step"] == 6
    assert state["config"] == model.config.to_dict()
    assert {"model", "optimizer", "scheduler", "rng", "train_config", "history"} <= set(state)
    assert state["train_config"] == TrainConfig(steps=6, checkpoint=str(path), **FAST).to_dict()
    assert state["train_config"]["warmup_steps"] is None  # what was asked for, not the derived number
    assert {"torch", "data"} <= set(state["rng"]) and state["rng"]["device"] == "cpu"
    assert History(**state["history"]).train_loss == history.train_loss
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]  # no temporary files left behind


def test_a_file_of_another_format_is_refused_before_training(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"format": "mhalab-checkpoint-v1", "step": 3}, path)
    task = PreviousToken()
    with pytest.raises(ValueError, match="not a checkpoint this mhalab reads.*delete it"):
        train(model_for(task), task, steps=4, checkpoint=path, **FAST)
    assert task.samples == 0


def test_a_crash_while_saving_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "run.pt"
    task = PreviousToken()
    train(model_for(task), task, steps=4, checkpoint=path, **FAST)
    before = path.read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"), pytest.warns(UserWarning, match="stretched"):
        train(model_for(task), task, steps=8, checkpoint=path, checkpoint_every=2, **FAST)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]


# ----------------------------------------------------------------- divergence
def test_nan_loss_stops_training_naming_the_step_and_keeps_the_checkpoint(tmp_path):
    path = tmp_path / "run.pt"
    task = NaNAt(7)
    with pytest.raises(TrainingDiverged) as caught:
        train(model_for(task), task, steps=20, checkpoint=path, checkpoint_every=5, **FAST)
    err = caught.value
    assert isinstance(err, FloatingPointError)
    assert err.step == 7
    assert "step 7 " in str(err) and "lower learning rate" in str(err)
    assert "(step 5)" in str(err)  # points at the checkpoint that survived
    state = load_checkpoint(path)
    assert state["step"] == 5
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_nan_without_checkpoint_still_names_the_step():
    task = NaNAt(3)
    with pytest.raises(TrainingDiverged, match="at step 3 "):
        train(model_for(task), task, steps=40, **FAST)
    assert task.samples < 20  # caught within one read-back group, not at the end


# ----------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "overrides,error,message",
    [
        (dict(steps=0), ValueError, "steps must be at least 1"),
        (dict(steps=2.5), TypeError, "steps must be an int"),
        (dict(batch_size=0), ValueError, "batch_size must be at least 1"),
        (dict(lr=0), ValueError, "lr must be > 0"),
        (dict(lr=float("nan")), TypeError, "lr must be a finite number"),
        (dict(weight_decay=-1), ValueError, "weight_decay must be >= 0"),
        (dict(warmup_steps=50), ValueError, "warmup_steps=50 is longer than the whole run"),
        (dict(precision="fp8"), ValueError, "precision must be one of"),
        (dict(precision="bf16"), ValueError, "only used on CUDA"),
        (dict(precision="fp16"), ValueError, "only used on CUDA"),
        (dict(device="tpu"), ValueError, "unknown device 'tpu'"),
        (dict(eval_every=0), ValueError, "eval_every must be at least 1"),
        (dict(grad_clip=0), ValueError, "grad_clip must be > 0"),
        (dict(seed=-1), ValueError, "seed must be at least 0"),
        (dict(checkpoint=3), TypeError, "checkpoint must be a file path"),
        (dict(progress="yes"), TypeError, "progress must be True or False"),
    ],
)
def test_bad_arguments_fail_before_training(overrides, error, message):
    task = PreviousToken()
    kwargs = {**FAST, "steps": 10, **overrides}
    with pytest.raises(error, match=message):
        train(model_for(task), task, **kwargs)
    assert task.samples == 0


def test_model_for_another_task_fails_before_training():
    task = PreviousToken()
    wrong = Transformer(ModelConfig(d_vocab=9, d_model=16, n_heads=2, n_ctx=4))
    with pytest.raises(ValueError, match=r"d_vocab 9 != task's vocab_size 8; n_ctx 4 < task's seq_len 8.*for_task"):
        train(wrong, task, steps=5, **FAST)
    assert task.samples == 0


def test_settings_are_one_checked_config():
    config = TrainConfig(steps=10, lr=1e-2, **FAST)
    with pytest.raises(ValueError, match="warmup_steps=20 is longer than the whole run"):
        replace(config, warmup_steps=20)  # an edited config is checked too
    with pytest.raises(TypeError, match=r"unknown training setting\(s\) \['step'\].*'steps', 'batch_size'"):
        train(model_for(PreviousToken()), PreviousToken(), step=10)
    with pytest.raises(TypeError, match="say how long to train: steps="):
        train(model_for(PreviousToken()), PreviousToken(), lr=1e-2)
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        train(model_for(PreviousToken()), PreviousToken(), {"steps": 10})
    assert make_config(config, steps=20) == replace(config, steps=20)
    assert TrainConfig(steps=1).precision == "fp32"  # the same numbers on every device unless asked otherwise
    task = PreviousToken()
    from_config = train(model_for(task), task, config, seed=2)
    from_keywords = train(model_for(task), task, steps=10, lr=1e-2, seed=2, **FAST)
    assert from_config.train_loss == from_keywords.train_loss


def test_bad_head_count_fails_before_anything_is_built():
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        ModelConfig.for_task(PreviousToken(), d_model=16, n_heads=3)


# ------------------------------------------------------------ evaluate, RNG
def test_evaluate_is_repeatable_and_leaves_random_state_alone():
    task = PreviousToken()
    model = model_for(task).train()
    state = torch.get_rng_state()
    first = evaluate(model, task, batches=2, batch_size=16)
    assert evaluate(model, task, batches=2, batch_size=16) == first
    assert evaluate(model, task, batches=2, batch_size=16, seed=1) != first
    assert model.training
    assert torch.equal(torch.get_rng_state(), state)
    assert set(first) == {"loss", "accuracy"}


def test_train_leaves_the_global_random_state_alone():
    task = PreviousToken()
    model = model_for(task)
    state = torch.get_rng_state()
    train(model, task, steps=3, **FAST)
    assert torch.equal(torch.get_rng_state(), state)


def test_same_seed_same_run_other_seed_other_run():
    task = PreviousToken()
    a = train(model_for(task), task, steps=5, seed=1, **FAST)
    b = train(model_for(task), task, steps=5, seed=1, **FAST)
    c = train(model_for(task), task, steps=5, seed=2, **FAST)
    assert a.train_loss == b.train_loss != c.train_loss


def test_history_plots_itself():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = PreviousToken()
    history = train(model_for(task), task, steps=30, eval_every=10, **FAST)
    fig = history.plot(title="previous token")
    assert len(fig.axes) == 2 and fig.dpi <= 100  # small figures; the retina format doubles the pixels
    labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert labels == ["accuracy"]
    assert "accuracy=" in repr(history)
    plt.close(fig)


# --------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("precision", [None, "auto", "fp32", "fp16"])
def test_trains_on_cuda(precision, tmp_path):
    task = PreviousToken()
    model = model_for(task)
    path = tmp_path / "gpu.pt"
    chosen = {} if precision is None else {"precision": precision}
    history = train(model, task, steps=60, lr=1e-2, device="cuda", checkpoint=path, batch_size=32, progress=False,
                    eval_batches=1, **chosen)
    assert history.device.startswith("cuda") and history.train_loss[-1] < history.train_loss[0]
    assert next(model.parameters()).device.type == "cpu"  # trained on the GPU, handed back where it was built
    fastest = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert history.precision == {None: "fp32", "auto": fastest}.get(precision, precision)  # fp32 unless asked
    state = load_checkpoint(path)
    assert state["step"] == 60 and state["rng"]["cuda"] is not None


@pytest.mark.gpu
def test_a_model_comes_back_where_it_was_and_a_notebook_can_look_at_it():
    """Trained on the GPU, a model built on the CPU came back on the GPU, and the notebooks' next line (a CPU batch
    through it) failed with "Expected all tensors to be on the same device" (every training notebook on Colab)."""
    task = PreviousToken()
    model = model_for(task)
    train(model, task, steps=5, **{**FAST, "device": "cuda"})
    batch = task.sample(4, generator=torch.Generator().manual_seed(0))
    assert model(batch.inputs).device.type == "cpu"
    on_gpu = model_for(task).cuda()
    train(on_gpu, task, steps=5, **{**FAST, "device": "auto"})
    assert all(p.is_cuda for p in on_gpu.parameters())  # put on the GPU by the caller: stays there


@pytest.mark.gpu
def test_a_gpu_run_trains_on_the_batches_of_the_cpu_run():
    """The batches are drawn on the CPU: a CUDA generator draws other numbers from the same seed, so a run on a GPU
    trained on other data than the same run on a laptop. The first step's loss (same weights, same batch) now
    differs only by float32 rounding: a relative 1e-4 is hundreds of float32 epsilons (1.2e-7)."""
    task = PreviousToken()
    first = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        first[device] = train(model_for(task), task, steps=1, **{**FAST, "device": device}).train_loss[0]
    assert first["cuda"] == pytest.approx(first["cpu"], rel=1e-4)
    model = model_for(task)
    on_cpu = evaluate(model, task, batches=2)
    on_gpu = evaluate(model.cuda(), task, batches=2)
    assert on_gpu["loss"] == pytest.approx(on_cpu["loss"], rel=1e-4)  # the same held-out batches


@pytest.mark.gpu
def test_a_run_saved_on_cuda_resumes_on_the_cpu_on_the_same_batches(tmp_path):
    """Colab, then a laptop: the weights, optimizer, schedule and batches continue; the losses follow the run that
    stayed on the CPU up to float rounding (a relative 1e-4: hundreds of float32 epsilons over a few steps)."""
    path, task, kwargs = tmp_path / "run.pt", PreviousToken(), _RESUMED
    expected = train(model_for(task), task, **kwargs)
    with pytest.raises(KeyboardInterrupt):
        train(model_for(task), InterruptAt(9), checkpoint=path, **{**kwargs, "device": "cuda"})
    with pytest.warns(UserWarning, match="written on cuda and is resumed on cpu.*so do the batches"):
        resumed = train(model_for(task, seed=1), task, checkpoint=path, **kwargs)
    assert resumed.train_loss == pytest.approx(expected.train_loss, rel=1e-4)


# ------------------------------------------------------------ bugs (each failed before its fix)
def test_resume_with_more_steps_when_the_warm_up_was_derived(tmp_path):
    """warmup_steps=None derives the warm-up from steps; resuming with more steps is still the same run."""
    path = tmp_path / "run.pt"
    task = PreviousToken()
    train(model_for(task), task, steps=40, checkpoint=path, **FAST)  # warm-up derived from 40 steps
    with pytest.warns(UserWarning, match="stretched"):
        history = train(model_for(task), task, steps=80, checkpoint=path, **FAST)  # ... and from 80 now
    assert history.steps == list(range(1, 81))
    assert load_checkpoint(path)["step"] == 80


def test_mps_random_state_is_captured_and_restored(monkeypatch):
    """Training reseeds the MPS generator (torch.manual_seed does), so its state is saved and restored too."""
    from mhalab.checkpoint import capture_rng, restore_rng

    mps_state = {"now": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda *a, **k: mps_state["now"].clone())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda state, *a, **k: mps_state.update(now=state.clone()))
    mps = torch.device("mps")
    saved = capture_rng(mps)
    assert torch.equal(saved["mps"], torch.tensor([1, 2, 3], dtype=torch.uint8)) and "cuda" not in saved
    cpu_before = torch.get_rng_state()
    mps_state["now"] = torch.tensor([9], dtype=torch.uint8)
    torch.rand(3)
    restore_rng(saved, mps)
    assert torch.equal(mps_state["now"], saved["mps"])
    assert torch.equal(torch.get_rng_state(), cpu_before)


def test_torch_floor_is_the_release_the_code_needs():
    """train restores the caller's MPS random state with fork_rng(device_type="mps"), which calls
    torch.mps.get_rng_state(device): that argument arrived in torch 2.4 (2.3 raises TypeError). The fused
    attention's zeros for a query that may see no key need scaled_dot_product_attention's safe softmax,
    and grouped-query attention its enable_gqa: torch 2.5. CI's floor run installs exactly this floor."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=(\d+)\.(\d+)', text)
    assert floor and (int(floor[1]), int(floor[2])) >= (2, 5), floor


def test_a_device_without_foreach_kernels_trains(monkeypatch):
    """MPS has no foreach kernels: torch's own check (_device_has_foreach_support, which clip_grad_norm_
    asks) says no, and clip_grad_norm_(foreach=True) raises there. Simulated on the CPU by making that
    check exclude it; train used to pass foreach=True regardless and failed at its first step."""
    import torch.nn.utils.clip_grad as clip_grad
    import torch.utils._foreach_utils as foreach_utils

    real = foreach_utils._device_has_foreach_support
    def without_cpu(device):  # the check as it answers for MPS
        return device.type != "cpu" and real(device)
    task = PreviousToken()
    expected = train(model_for(task), task, steps=8, **FAST)
    monkeypatch.setattr(foreach_utils, "_device_has_foreach_support", without_cpu)
    monkeypatch.setattr(clip_grad, "_device_has_foreach_support", without_cpu)
    weight = torch.ones(2, requires_grad=True)
    weight.grad = torch.ones(2)
    with pytest.raises(RuntimeError, match="foreach=True was passed, but can't use the foreach API on cpu"):
        torch.nn.utils.clip_grad_norm_([weight], 1.0, foreach=True)  # what torch does there with foreach=True
    history = train(model_for(task), task, steps=8, **FAST)
    # the per-tensor updates are the same arithmetic as the multi-tensor ones
    torch.testing.assert_close(history.train_loss, expected.train_loss, rtol=1e-6, atol=0)


def test_data_dropout_and_initialisation_draw_from_distinct_streams():
    """torch.manual_seed(s) and torch.Generator().manual_seed(s) give the same numbers: seeding the batches
    and dropout with `seed` itself gave them the same bits as each other and as a learner's
    torch.manual_seed(seed) before building the model. Each stream is now seeded by a hash of (seed, purpose)."""
    seed, n = 3, 16

    class Recording(PreviousToken):
        def sample(self, batch_size, *, generator, device=None):
            if torch.is_grad_enabled() and not hasattr(self, "data"):  # the first training batch's stream
                state = generator.get_state()
                self.data = torch.rand(n, generator=generator)
                generator.set_state(state)
                self.dropout = torch.rand(n, generator=torch.Generator().set_state(torch.get_rng_state()))
            return super().sample(batch_size, generator=generator, device=device)

    task = Recording()
    train(model_for(task), task, steps=1, seed=seed, **FAST)
    init = torch.rand(n, generator=torch.Generator().manual_seed(seed))  # torch.manual_seed(seed); build model
    assert not torch.equal(task.data, init) and not torch.equal(task.dropout, init)
    assert not torch.equal(task.data, task.dropout)
    assert len({stream_seed(seed, p) for p in ("data", "dropout", "init", "eval")} | {seed}) == 5
    assert stream_seed(seed, "data") == stream_seed(seed, "data")  # deterministic
    again = Recording()
    train(model_for(again), again, steps=1, seed=seed, **FAST)
    assert torch.equal(again.data, task.data)


def _saved_as_if_on_cuda(path, task, **rng) -> dict:
    """A run of ``task`` with ``_RESUMED`` interrupted at step 9, its step-6 checkpoint at ``path`` relabelled as
    written on CUDA (CUDA's global state; ``rng`` replaces more random states). Returns the checkpoint saved."""
    with pytest.raises(KeyboardInterrupt):
        train(model_for(task), InterruptAt(9), checkpoint=path, **_RESUMED)
    state = load_checkpoint(path)
    assert state["step"] == 6
    state["rng"] = {**state["rng"], "cuda": PHILOX, "device": "cuda", **rng}
    save_checkpoint(state, path)
    return state


def test_resuming_on_another_kind_of_device_continues_with_a_warning(tmp_path):
    """A run saved on CUDA and resumed on the CPU (Colab, then a laptop): the CPU generator cannot take the
    CUDA generator's state (16 bytes of Philox seed and offset, not 5056 of Mersenne Twister) and resuming
    raised an unhandled RuntimeError. Simulated with a checkpoint whose random states are CUDA's."""
    path, task, kwargs = tmp_path / "run.pt", PreviousToken(), _RESUMED
    state = _saved_as_if_on_cuda(path, task, data=PHILOX.clone())
    with pytest.warns(UserWarning, match="written on cuda and is resumed on cpu.*new streams"):
        moved = train(model_for(task), task, checkpoint=path, **kwargs)
    assert moved.steps == list(range(1, 13))
    del state["rng"]["device"]  # a checkpoint from before the key: told apart by its generator state
    save_checkpoint(state, path)
    with pytest.warns(UserWarning, match="written on another kind of device"):
        again = train(model_for(task), task, checkpoint=path, **kwargs)
    assert again.train_loss == moved.train_loss  # deterministic all the same


def test_a_run_saved_on_a_gpu_continues_on_the_cpu_with_the_same_batches(tmp_path):
    """The batches are drawn on the CPU, so their stream continues on any device; only the global (dropout)
    streams are the device's own. Simulated: a CPU checkpoint relabelled as written on CUDA. Without dropout the
    resumed run is the run that never stopped, step for step."""
    path, task, kwargs = tmp_path / "run.pt", PreviousToken(), _RESUMED
    expected = train(model_for(task), task, **kwargs)
    _saved_as_if_on_cuda(path, task)  # the data state stays the CPU generator's
    with pytest.warns(UserWarning, match=r"continue, and so do the batches .* dropout after step 6") as caught:
        resumed = train(model_for(task, seed=1), task, checkpoint=path, **kwargs)
    assert "the batches and" not in str(caught[0].message)
    assert resumed.train_loss == expected.train_loss


# ------------------------------------------------------------------ callback
def test_a_callback_sees_the_chosen_steps_and_changes_nothing():
    kwargs = dict(steps=20, lr=1e-2, seed=2, **FAST)
    plain = model_for(PreviousToken(), dropout=0.1)
    expected = train(plain, PreviousToken(), **kwargs)

    seen = []

    def meddle(step, model):  # draws random numbers and switches to eval mode, as a recorder might
        seen.append((step, model.training))
        torch.rand(3)
        model.eval()

    watched = model_for(PreviousToken(), dropout=0.1)
    history = train(watched, PreviousToken(), callback=meddle, callback_every=6, **kwargs)
    assert [s for s, _ in seen] == [0, 6, 12, 18, 20]  # before training, every 6th step and the last
    assert all(training for _, training in seen)
    assert history.train_loss == expected.train_loss
    for (name, a), (_, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs with a callback"


def test_a_callback_takes_its_own_every_and_must_be_callable():
    class Every5:
        every = 5
        steps = []

        def __call__(self, step, model):
            self.steps.append(step)

    recorder = Every5()
    train(model_for(PreviousToken()), PreviousToken(), steps=12, callback=recorder, **FAST)
    assert recorder.steps == [0, 5, 10, 12]
    with pytest.raises(TypeError, match=r"callback must be a function callback\(step, model\)"):
        train(model_for(PreviousToken()), PreviousToken(), steps=4, callback="record", **FAST)
    with pytest.raises(ValueError, match="callback_every must be at least 1"):
        train(model_for(PreviousToken()), PreviousToken(), steps=4, callback=print, callback_every=0, **FAST)


def test_a_failing_callback_keeps_the_finished_work(tmp_path):
    kwargs = dict(steps=16, lr=1e-2, seed=1, checkpoint_every=100, **FAST)
    reference = model_for(PreviousToken())
    expected = train(reference, PreviousToken(), checkpoint=tmp_path / "straight.pt", **kwargs)

    def fails_at_8(step, model):
        if step == 8:
            raise ZeroDivisionError("bad score")

    path = tmp_path / "run.pt"
    model = model_for(PreviousToken())
    with pytest.raises(CallbackFailed, match=r"fails_at_8 raised at step 8: ZeroDivisionError: bad score") as failed:
        train(model, PreviousToken(), checkpoint=path, callback=fails_at_8, callback_every=4, **kwargs)
    assert failed.value.step == 8 and failed.value.history.steps == list(range(1, 9))
    assert failed.value.history.train_loss == expected.train_loss[:8]
    assert load_checkpoint(path)["step"] == 8  # written by the failure, not by the schedule (every 100)
    resumed = train(model_for(PreviousToken(), seed=5), PreviousToken(), checkpoint=path, **kwargs)
    assert resumed.train_loss == expected.train_loss
