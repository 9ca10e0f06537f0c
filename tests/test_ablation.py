"""mhalab.ablation: switching heads off with hooks, head importance and pruning."""

import numpy as np
import pytest
import torch

from mhalab import ablation as A
from mhalab.head_interventions import gate_heads
from mhalab.hooks import hook_points
from mhalab.tasks import Batch


def no_hooks(model):
    """Nothing left attached: no hook point is active."""
    return not any(point.is_hooked for point in hook_points(model).values())


# ------------------------------------------------------------------------------ ablation
def test_bad_heads_get_clear_errors(model):
    with pytest.raises(IndexError, match=r"layer 2 is out of range: the model has layers 0..1"):
        A.validate_heads(model, [(2, 0)])
    with pytest.raises(IndexError, match=r"head 4 is out of range: layer 1 has heads 0..3"):
        A.validate_heads(model, (1, 4))
    with pytest.raises(TypeError, match="must be an int"):
        A.validate_heads(model, [(0, 1.0)])
    with pytest.raises(TypeError, match=r"\(layer, head\) pair"):
        A.validate_heads(model, [3])
    assert A.validate_heads(model, [(1, 2), (0, 3), (1, 2)]) == [(0, 3), (1, 2)]
    with pytest.raises(ValueError, match="method must be"):
        with A.ablate(model, [(0, 0)], method="random"):
            pass


def test_zero_ablation_is_a_zero_gate_and_is_undone_exactly(model, batch):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    intact = model(batch.inputs).detach()
    with A.ablate(model, [(0, 1), (1, 3)]) as m:
        assert m is model
        ablated = model(batch.inputs).detach()
    gates = torch.ones(2, 4)
    gates[0, 1] = gates[1, 3] = 0.0
    hooks = [(f"blocks.{i}.attn.hook_z", gate_heads(gates[i])) for i in range(2)]
    gated = model.run_with_hooks(batch.inputs, fwd_hooks=hooks)
    torch.testing.assert_close(ablated, gated.detach())
    assert not torch.allclose(ablated, intact)
    assert torch.equal(model(batch.inputs), intact) and no_hooks(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="boom"):  # restored after an exception too
        with A.ablate(model, [(0, 0)]):
            raise RuntimeError("boom")
    assert no_hooks(model) and torch.equal(model(batch.inputs), intact)


def test_mean_ablation(model, batch):
    one = batch.inputs[:1]
    intact = model(one).detach()
    # With a one-sequence reference, the mean of a head's output *is* its output: nothing changes.
    with A.ablate(model, [(0, 2)], method="mean", reference=one):
        torch.testing.assert_close(model(one).detach(), intact)
    with A.ablate(model, [(0, 2)], method="mean", reference=batch):
        assert not torch.allclose(model(one), intact)
    with pytest.raises(ValueError, match="needs a reference batch"):
        with A.ablate(model, [(0, 2)], method="mean"):
            pass
    with pytest.raises(ValueError, match="same length"):
        with A.ablate(model, [(0, 2)], method="mean", reference=batch.inputs[:, :5]):
            model(batch.inputs)
    assert no_hooks(model)


def test_ablate_each_head(model, task, batch):
    table = A.ablate_each_head(model, task, batch)
    assert table.baseline == A.evaluate_batch(model, task, batch)
    assert table.ablated["accuracy"].shape == (2, 4)
    with A.ablate(model, (1, 2)):
        manual = A.evaluate_batch(model, task, batch)
    assert table.ablated["loss"][1, 2].item() == pytest.approx(manual["loss"], rel=1e-5)
    assert table.drop("loss")[1, 2].item() == pytest.approx(table.baseline["loss"] - manual["loss"], rel=1e-4)
    with pytest.raises(KeyError, match="no metric"):
        table.drop("bleu")


# ---------------------------------------------------------------------------- importance
def gated(model, inputs, gates):
    """The model with every head's output multiplied by ``gates[layer, head]``."""
    hooks = [(f"blocks.{i}.attn.hook_z", gate_heads(g)) for i, g in enumerate(gates)]
    return model.run_with_hooks(inputs, fwd_hooks=hooks)


def test_importance_is_the_gate_gradient(model, task):
    """I_h = E_x |dL(x)/d xi_h|, checked against central finite differences on the gates."""
    model = model.double()
    batch = task.sample(3, generator=torch.Generator().manual_seed(2))
    ours = A.head_importance(model, batch, normalize=False)
    eps = 1e-5
    expected = torch.zeros(2, 4, dtype=torch.float64)
    for layer in range(2):
        for head in range(4):
            up, down = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
            up[layer, head] += eps
            down[layer, head] -= eps
            with torch.no_grad():
                l_up, l_down = (
                    A.per_example_loss(gated(model, batch.inputs, gates), batch.targets)  # [B]
                    for gates in (up, down)
                )
            expected[layer, head] = ((l_up - l_down) / (2 * eps)).abs().mean()  # |.| per example, then the mean
    torch.testing.assert_close(ours.double(), expected, rtol=1e-4, atol=1e-8)
    # The same examples split into two batches: the same expectation.
    halves = [Batch(batch.inputs[a:b], batch.targets[a:b], {k: v[a:b] for k, v in batch.sources.items()})
              for a, b in ((0, 1), (1, 3))]
    torch.testing.assert_close(A.head_importance(model, halves, normalize=False), ours)


def test_importance_of_a_dead_head_is_zero_and_layers_are_normalised(model, batch):
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 2 * 4 : 3 * 4] = 0.0  # head 2 of layer 1 writes nothing
    importance = A.head_importance(model, batch)
    assert importance[1, 2] == 0.0 and (importance[0] > 0).all()
    torch.testing.assert_close(importance.norm(dim=-1), torch.ones(2))
    mask = torch.ones(2, 4)
    mask[0, 0] = 0.0
    assert A.head_importance(model, batch, mask=mask)[0, 0] == 0.0
    with pytest.raises(ValueError, match="mask must be"):
        A.head_importance(model, batch, mask=torch.ones(4))


def test_per_example_loss_matches_cross_entropy(task, batch):
    logits = torch.randn(6, 8, 2, 8)
    per = A.per_example_loss(logits, batch.targets)
    assert per.shape == (6,)
    first = torch.nn.functional.cross_entropy(logits[0].reshape(-1, 8), batch.targets[0].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(per[0], first)


# ----------------------------------------------------------------------- additive control
def test_additive_control_adds_single_head_effects(model, batch):
    control = A.additive_control(model, batch)
    assert sorted(control.change) == [(l, h) for l in range(2) for h in range(4)] and no_hooks(model)
    with torch.no_grad():
        torch.testing.assert_close(control.intact, model(batch.inputs))
        torch.testing.assert_close(control.logits([]), control.intact)
        for heads in ([(1, 2)], [(0, 1), (1, 3)]):
            expected = control.intact + sum(control.change[lh] for lh in heads)   # intact plus the single effects
            torch.testing.assert_close(control.logits(heads), expected)
        with A.ablate(model, [(1, 2)]):
            torch.testing.assert_close(control.logits([(1, 2)]), model(batch.inputs), atol=1e-5, rtol=1e-5)
    only = A.additive_control(model, batch, heads=[(0, 3)])
    assert list(only.change) == [(0, 3)]
    with pytest.raises(IndexError):
        A.additive_control(model, batch, heads=[(2, 0)])


def test_per_sequence_metrics_average_to_the_task_metrics(task, model, batch):
    with torch.no_grad():
        logits = model(batch.inputs)                                      # [B, T, R, V]
    metrics = task.metrics(logits, batch)
    accuracy, loss = A.per_sequence_metrics(task, logits, batch)          # [B] each
    assert accuracy.shape == loss.shape == (6,) and accuracy.dtype == loss.dtype == torch.float64
    correct, valid = task.correct(logits, batch)                          # [B, T, R]
    weights = valid.flatten(1).sum(1).double()                            # [B]: targets per sequence
    assert abs(float((accuracy * weights).sum() / weights.sum()) - metrics["accuracy"]) < 1e-6
    torch.testing.assert_close(loss, A.per_example_loss(logits, batch.targets).double())
    for r, name in enumerate(task.relations):
        acc_r, loss_r = A.per_sequence_metrics(task, logits, batch, relation=r)
        weights = valid[..., r].sum(1).double()                           # [B]
        assert abs(float((acc_r * weights).sum() / weights.sum()) - metrics[f"accuracy/{name}"]) < 1e-6
        torch.testing.assert_close(loss_r, A.per_example_loss(logits[:, :, r], batch.targets[:, :, r]).double())


def test_standard_error_is_the_spread_over_root_n():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    assert A.standard_error(values) == pytest.approx(float(values.std()) / 2)


# ------------------------------------------------------------------------------- pruning
def test_pruning_curve(model, task, batch):
    curve = A.pruning_curve(model, task, batch, random_orders=2, seed=1)
    assert curve.removed.tolist() == list(range(9)) and curve.n_heads == 8
    assert curve.by_importance.shape == (9,) and curve.random.shape == (2, 9)
    assert curve.baseline == A.evaluate_batch(model, task, batch)["accuracy"] == curve.by_importance[0]
    assert sorted(curve.importance_order) == [(l, h) for l in range(2) for h in range(4)]
    assert all(sorted(o) == sorted(curve.importance_order) for o in curve.random_orders)
    everything = [(l, h) for l in range(2) for h in range(4)]
    with A.ablate(model, everything):  # the last point: no head left at all
        assert curve.by_importance[-1] == A.evaluate_batch(model, task, batch)["accuracy"]
    assert np.allclose(curve.random[:, -1], curve.by_importance[-1])
    importance = A.head_importance(model, batch)
    assert curve.importance_order[0] == min(everything, key=lambda lh: float(importance[lh]))
    again = A.pruning_curve(model, task, batch, random_orders=0, recompute=True, max_removed=2)
    assert again.by_importance.shape == (3,) and len(again.importance_order) == 2
    assert no_hooks(model)
    with pytest.raises(ValueError, match="max_removed"):
        A.pruning_curve(model, task, batch, max_removed=9)


def test_removable_counts_heads_before_the_first_drop():
    curve = A.PruningCurve(
        baseline=0.9, removed=np.arange(5),
        by_importance=np.array([0.9, 0.9, 0.895, 0.85, 0.91]),
        importance_order=[], random=np.array([[0.9, 0.7, 0.6, 0.5, 0.4]]), random_orders=[], n_heads=4,
    )
    assert curve.removable(0.01) == 2  # the fourth point is the first more than 1 point below
    assert curve.removable(0.1) == 4
    assert curve.removable(0.01, curve="random") == 0
    with pytest.raises(ValueError, match="curve must be"):
        curve.removable(curve="best")


def test_a_lone_attention_layer_is_layer_0():
    from mhalab import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, bias=False).eval()
    x = torch.randn(1, 3, 8)
    with A.ablate(attn, [(0, 0), (0, 1)]):
        assert (attn(x)[0] == 0).all()  # every head off and no bias: nothing comes out
    assert A.model_shape(attn) == (1, 2)
