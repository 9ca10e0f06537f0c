"""Tests for the sequence-to-sequence task in mhalab.tasks (Seq2SeqTask, Seq2SeqBatch), used by notebook 03."""

import pytest
import torch

from mhalab.encoder_decoder import EncoderDecoder
from mhalab.models import ModelConfig
from mhalab.tasks import IGNORE, Seq2SeqBatch, Seq2SeqTask


def _sample(task, n=5, seed=0):
    return task.sample(n, generator=torch.Generator().manual_seed(seed), device="cpu")


@pytest.mark.parametrize("mode", ["reverse", "copy"])
def test_targets_decoder_inputs_and_sources_agree(mode):
    task = Seq2SeqTask(mode, n_symbols=7, seq_len=6)
    b = _sample(task)
    assert isinstance(b, Seq2SeqBatch)
    assert b.inputs.shape == b.targets.shape == b.decoder_inputs.shape == (5, 6)
    want = b.inputs.flip(1) if mode == "reverse" else b.inputs
    assert torch.equal(b.targets, want)
    assert (b.decoder_inputs[:, 0] == task.bos_id).all() and torch.equal(b.decoder_inputs[:, 1:], b.targets[:, :-1])
    assert (b.inputs < 7).all() and (b.targets != IGNORE).all() and task.vocab_size == 8
    where = b.sources[task.target_relation]  # the source position each decoder position outputs
    assert torch.equal(b.inputs.gather(1, where), b.targets)
    assert task.relations == (task.target_relation,) == (("mirror",) if mode == "reverse" else ("same",))


def test_same_seed_same_batch_and_to_keeps_decoder_inputs():
    task = Seq2SeqTask()
    a, b = _sample(task, seed=3), _sample(task, seed=3)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.decoder_inputs, b.decoder_inputs)
    moved = a.to("cpu")
    assert isinstance(moved, Seq2SeqBatch) and torch.equal(moved.decoder_inputs, a.decoder_inputs)


def test_loss_and_metrics_with_an_encoder_decoder():
    task = Seq2SeqTask(seq_len=5)
    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig.for_task(task, d_model=16, n_heads=2, n_layers=1))
    b = _sample(task)
    logits = model.forward_batch(b)
    assert logits.shape == (5, 5, task.vocab_size)
    assert task.loss(logits, b).item() > 0
    assert set(task.metrics(logits, b)) == {"loss", "accuracy", "accuracy/mirror"}


def test_token_labels_name_bos():
    task = Seq2SeqTask(n_symbols=3)
    assert task.token_labels(torch.tensor([0, 2, 3])) == ["a", "c", "<s>"]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(mode="sort"), ValueError, "mode must be one of"),
        (dict(n_symbols=1), ValueError, "n_symbols"),
        (dict(seq_len=1), ValueError, "seq_len"),
        (dict(seq_len=4.0), TypeError, "seq_len must be an int"),
    ],
)
def test_bad_settings_say_what_is_wrong(kwargs, error, message):
    with pytest.raises(error, match=message):
        Seq2SeqTask(**kwargs)
