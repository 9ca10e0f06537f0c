"""The tasks' relations are what they claim, sampling is seeded and on-device, bad arguments fail clearly."""

import math

import pytest
import torch

from mhalab.tasks import IGNORE, Batch, KeyValueRecall, MultiRelationTask, TableLookup, Task


def _sample(task, n=8, seed=0, device="cpu"):
    return task.sample(n, generator=torch.Generator(device=device).manual_seed(seed), device=device)


# ---------------------------------------------------------------- multi-relation
@pytest.mark.parametrize("offsets", [(-2, -1, 1, 2), (-1, -2, -4), (3,)])
def test_multi_relation_targets_are_the_tokens_at_their_offsets(offsets):
    task = MultiRelationTask(offsets, vocab_size=11, seq_len=9, causal=all(o < 0 for o in offsets))
    batch = _sample(task)
    B, T = batch.inputs.shape
    assert (B, T) == (8, 9) and batch.targets.shape == (B, T, len(offsets))
    assert task.relations == tuple(("left" if o < 0 else "right") + str(abs(o)) for o in offsets)
    for r, (name, o) in enumerate(zip(task.relations, offsets)):
        src = batch.sources[name]
        for i in range(T):
            j = i + o
            if 0 <= j < T:
                assert (src[:, i] == j).all()
                assert torch.equal(batch.targets[:, i, r], batch.inputs[:, j])
            else:
                assert (src[:, i] == -1).all() and (batch.targets[:, i, r] == IGNORE).all()
        # the source tensor itself points at the target token wherever it points anywhere
        inside = src >= 0
        gathered = batch.inputs.gather(1, src.clamp(min=0))
        assert torch.equal(gathered[inside], batch.targets[..., r][inside])


def test_multi_relation_tokens_cover_the_vocabulary():
    batch = _sample(MultiRelationTask(vocab_size=7, seq_len=32), n=64)
    assert batch.inputs.dtype == torch.long
    assert set(batch.inputs.unique().tolist()) == set(range(7))


def test_sampling_is_deterministic_from_the_seed():
    for task in (MultiRelationTask(), KeyValueRecall()):
        a, b, c = _sample(task, seed=3), _sample(task, seed=3), _sample(task, seed=4)
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
        assert all(torch.equal(a.sources[k], b.sources[k]) for k in a.sources)
        assert not torch.equal(a.inputs, c.inputs)


# ---------------------------------------------------------------- key-value recall
def test_key_value_recall_answers_are_the_stored_values():
    task = KeyValueRecall(n_pairs=5, n_keys=9, n_values=6, n_queries=3)
    batch = _sample(task, n=32)
    x, y = batch.inputs, batch.targets
    assert x.shape == (32, task.seq_len) == (32, 13) and y.shape == (32, 13)
    keys, values = x[:, 0:10:2], x[:, 1:10:2]
    assert (keys < 9).all() and (values >= 9).all() and (values < 15).all()
    # keys within a sequence are distinct
    assert all(len(set(row.tolist())) == 5 for row in keys)
    assert (y[:, :10] == IGNORE).all() and (batch.sources["key"][:, :10] == -1).all()
    for b in range(32):
        stored = dict(zip(keys[b].tolist(), values[b].tolist()))
        for i in range(10, 13):
            q = int(x[b, i])
            assert q in stored and int(y[b, i]) == stored[q]
            kpos, vpos = int(batch.sources["key"][b, i]), int(batch.sources["value"][b, i])
            assert int(x[b, kpos]) == q and vpos == kpos + 1 and int(x[b, vpos]) == int(y[b, i])
    assert task.token_labels(x[0])[:2] == [f"K{int(x[0, 0])}", f"v{int(x[0, 1]) - 9}"]


def test_key_value_recall_with_slots_stores_only_the_keys_and_answers_their_slot():
    task = KeyValueRecall(n_pairs=4, n_keys=10, n_queries=5, causal=False, slots=True)
    assert (task.seq_len, task.n_values, task.vocab_size) == (9, 4, 14)
    batch = _sample(task, n=32)
    x, y = batch.inputs, batch.targets
    assert (x < 10).all() and all(len(set(row.tolist())) == 4 for row in x[:, :4])
    assert (y[:, :4] == IGNORE).all()
    for b in range(32):
        for i in range(4, 9):
            slot = int(y[b, i]) - 10
            assert int(x[b, slot]) == int(x[b, i])  # the query's key stands in the slot the target names
            assert int(batch.sources["key"][b, i]) == int(batch.sources["value"][b, i]) == slot
    assert task.token_labels(torch.tensor([3, 12])) == ["K3", "slot2"]
    assert "slots=True" in repr(task)


# ---------------------------------------------------------------- loss and metrics
def test_table_lookup_answers_are_the_asked_keys_values_in_every_table():
    task = TableLookup(n_tables=3, n_entries=5, n_keys=7, n_values=4, n_queries=6)
    assert (task.seq_len, task.vocab_size, task.n_targets) == (3 * 5 + 6, 7 * 4 + 7, 3)
    assert task.relations == ("table0", "table1", "table2")
    b = task.sample(64, generator=torch.Generator().manual_seed(1))
    entries, queries = b.inputs[:, :15].reshape(64, 3, 5), b.inputs[:, 15:] - 7 * 4  # [B, D, P], [B, Q]
    assert bool((entries < 28).all()) and bool(((queries >= 0) & (queries < 7)).all())
    keys = entries // 4
    assert bool((keys.sort(-1).values == keys[:, :1].sort(-1).values).all())  # every table holds the same keys
    assert bool((keys[:, 0].sort(-1).values.diff(dim=-1) > 0).all())  # distinct within a table
    assert bool((b.targets[:, :15] == IGNORE).all())
    for r, name in enumerate(task.relations):
        where = b.sources[name]  # [B, T]
        assert bool((where[:, :15] == -1).all())
        found = b.inputs.gather(1, where[:, 15:])  # [B, Q]: the entry each query's table-r relation points at
        assert bool((where[:, 15:] // 5 == r).all())  # inside table r
        assert torch.equal(found // 4, queries) and torch.equal(found % 4, b.targets[:, 15:, r])


def test_shifted_table_lookup_asks_each_table_for_a_different_key():
    plain = TableLookup(n_tables=3, n_entries=5, n_keys=7, n_values=4, n_queries=6)
    task = TableLookup(n_tables=3, n_entries=5, n_keys=7, n_values=4, n_queries=6, shift=2)
    assert "shift=2" in repr(task)
    b = task.sample(64, generator=torch.Generator().manual_seed(1))
    p = plain.sample(64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(b.inputs[:, 15:], p.inputs[:, 15:]) and torch.equal(b.targets, p.targets)  # same draws
    keys, queries = b.inputs[:, :15].reshape(64, 3, 5) // 4, b.inputs[:, 15:] - 7 * 4  # [B, D, P], [B, Q]
    for r, name in enumerate(task.relations):
        assert bool((keys[:, r].sort(-1).values == ((keys[:, 0] + 2 * r) % 7).sort(-1).values).all())  # moved by 2r
        found = b.inputs.gather(1, b.sources[name][:, 15:])  # [B, Q]: the entry table r's relation points at
        assert bool((b.sources[name][:, 15:] // 5 == r).all())
        assert torch.equal(found // 4, (queries + 2 * r) % 7) and torch.equal(found % 4, b.targets[:, 15:, r])


def test_table_lookup_factored_code_gives_key_value_and_table_dimensions_of_their_own():
    task = TableLookup(n_tables=3, n_entries=5, n_keys=7, n_values=4, n_queries=6, shift=2)
    tokens, positions = task.factored_code(16)
    assert tokens.shape == (task.vocab_size, 16) and positions.shape == (task.seq_len, 16)
    b = task.sample(8, generator=torch.Generator().manual_seed(2))
    x = tokens[b.inputs] + positions  # [B, T, 16]: what the model's embedding would give
    entries, queries = b.inputs[:, :15], b.inputs[:, 15:] - 7 * 4  # [B, 15], [B, 6]
    assert torch.equal(x[:, :15, :7].argmax(-1), entries // 4)  # the key
    assert torch.equal(x[:, :15, 7:11].argmax(-1), entries % 4)  # the value
    assert torch.equal(x[:, :15, 11:14].argmax(-1), (torch.arange(15) // 5).expand(8, 15))  # the table
    assert torch.equal(x[:, 15:, :7].argmax(-1), queries)
    assert bool((x[:, 15:, 7:] == 0).all()) and bool((x[..., 14:] == 0).all())  # queries: key only; spare: zero
    assert torch.equal(x.sum(-1)[:, :15], torch.full((8, 15), 3.0)) and bool((x.sum(-1)[:, 15:] == 1).all())
    with pytest.raises(ValueError, match=r"7 keys, 4 values and 3 tables a dimension each: 14.*d_model=13"):
        task.factored_code(13)


def test_table_lookup_circle_code_puts_keys_on_a_circle_where_the_shift_is_a_rotation():
    task = TableLookup(n_tables=3, n_entries=4, n_keys=12, n_values=4, n_queries=6, shift=2)
    tokens, positions = task.circle_code(12)
    assert tokens.shape == (task.vocab_size, 12) and positions.shape == (task.seq_len, 12)
    b = task.sample(8, generator=torch.Generator().manual_seed(2))
    x = tokens[b.inputs] + positions  # [B, T, 12]: what the model's embedding would give
    entries, queries = b.inputs[:, :12], b.inputs[:, 12:] - 12 * 4  # [B, 12], [B, 6]
    angle = torch.atan2(x[..., 1], x[..., 0])  # [B, T]: every token's key as an angle
    assert torch.allclose(x[..., :2].norm(dim=-1), torch.ones(8, 18))  # on the unit circle
    step = 2 * torch.pi / 12
    assert torch.equal(torch.round(angle[:, :12] / step).long() % 12, entries // 4)  # the entry's key
    assert torch.equal(torch.round(angle[:, 12:] / step).long() % 12, queries)  # the asked key
    assert torch.equal(x[:, :12, 2:6].argmax(-1), entries % 4)  # the value
    assert torch.equal(x[:, :12, 6:9].argmax(-1), (torch.arange(12) // 4).expand(8, 12))  # the table
    assert bool((x[:, 12:, 2:9] == 0).all()) and bool((x[:, 12:, 9] == 1).all()) and bool((x[:, :12, 9] == 0).all())
    assert bool((x[..., 10:] == 0).all())  # spare dimensions stay zero
    # Table r's answer is the asked key turned r * shift steps on: one rotation per table, the same for every key.
    q = x[:, 12:, :2]  # [B, 6, 2]
    for r in range(3):
        turn = torch.tensor(r * 2 * step)
        rot = torch.stack([torch.stack([turn.cos(), -turn.sin()]), torch.stack([turn.sin(), turn.cos()])])  # [2, 2]
        found = x[:, :12, :2].unsqueeze(1) @ (q @ rot.T).unsqueeze(-1)  # [B, 6, 12, 1]: rotated query . entry key
        in_table = torch.arange(12) // 4 == r  # [12]
        best = found.squeeze(-1).masked_fill(~in_table, -2).argmax(-1)  # [B, 6]: nearest entry of table r
        assert torch.equal(entries.gather(1, best) % 4, b.targets[:, 12:, r])
    with pytest.raises(ValueError, match=r"keys 2 dimensions, 4 values and 3 tables a dimension each, and query "
                                         r"positions one: 10.*d_model=9"):
        task.circle_code(9)


def test_table_lookup_bad_arguments():
    with pytest.raises(ValueError, match="n_keys >= n_entries"):
        TableLookup(n_entries=5, n_keys=4)
    with pytest.raises(ValueError, match="n_tables"):
        TableLookup(n_tables=0)
    with pytest.raises(ValueError, match="shift"):
        TableLookup(shift=-1)


def test_metrics_score_perfect_and_wrong_logits():
    task = MultiRelationTask((-1, 1), vocab_size=5, seq_len=6)
    batch = _sample(task)
    perfect = torch.full((8, 6, 2, 5), -10.0)
    perfect.scatter_(-1, batch.targets.clamp(min=0).unsqueeze(-1), 10.0)
    m = task.metrics(perfect, batch)
    assert m["accuracy"] == 1.0 and m["accuracy/left1"] == 1.0 and m["accuracy/right1"] == 1.0
    assert m["loss"] < 1e-3 and float(task.loss(perfect, batch)) < 1e-3
    # right for relation left1 only: half the targets
    half = perfect.clone()
    half[:, :, 1] = perfect[:, :, 1].roll(1, dims=-1)
    m = task.metrics(half, batch)
    assert m["accuracy/left1"] == 1.0 and m["accuracy/right1"] == 0.0 and m["accuracy"] == pytest.approx(0.5)

    kv = KeyValueRecall(n_pairs=3, n_keys=4, n_values=4, n_queries=2)
    kb = _sample(kv)
    logits = torch.zeros(8, kv.seq_len, kv.vocab_size)
    logits.scatter_(-1, kb.targets.clamp(min=0).unsqueeze(-1), 1.0)
    assert kv.metrics(logits, kb)["accuracy/value"] == 1.0


def test_loss_rejects_logits_of_the_wrong_shape():
    task = MultiRelationTask((-1, 1), vocab_size=5, seq_len=6)
    batch = _sample(task)
    with pytest.raises(ValueError, match=r"n_targets=2"):
        task.loss(torch.zeros(8, 6, 5), batch)


# ---------------------------------------------------------------- devices and arguments
def test_generator_must_live_on_the_requested_device():
    task = MultiRelationTask()
    with pytest.raises(ValueError, match="Generator\\(device='meta'\\)|generator lives on cpu"):
        task.sample(2, generator=torch.Generator().manual_seed(0), device="meta")
    with pytest.raises(TypeError, match="torch.Generator"):
        task.sample(2, generator=0, device="cpu")
    batch = task.sample(2, generator=torch.Generator().manual_seed(0))  # device defaults to the generator's
    assert batch.inputs.device.type == "cpu" and isinstance(batch, Batch)


@pytest.mark.gpu
def test_batches_are_generated_on_the_gpu():
    for task in (MultiRelationTask(), KeyValueRecall()):
        batch = _sample(task, device="cuda")
        assert batch.inputs.is_cuda and batch.targets.is_cuda and all(s.is_cuda for s in batch.sources.values())
        cpu = _sample(task, device="cpu")
        assert batch.inputs.shape == cpu.inputs.shape


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(offsets=()), ValueError, "at least one"),
        (dict(offsets=(0, 1)), ValueError, "offset 0"),
        (dict(offsets=(-1, -1)), ValueError, "distinct"),
        (dict(offsets=(-20,), seq_len=16), ValueError, r"\|offset\| < seq_len"),
        (dict(offsets=(-1, 2), causal=True), ValueError, "causal"),
        (dict(offsets=(1.5,)), TypeError, "int"),
        (dict(vocab_size=1), ValueError, "vocab_size must be at least 2"),
        (dict(seq_len="16"), TypeError, "seq_len must be an int"),
    ],
)
def test_multi_relation_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiRelationTask(**kwargs)


def test_key_value_recall_bad_arguments():
    with pytest.raises(ValueError, match="n_keys >= n_pairs"):
        KeyValueRecall(n_pairs=8, n_keys=4)
    with pytest.raises(ValueError, match="n_queries must be at least 1"):
        KeyValueRecall(n_queries=0)
    with pytest.raises(ValueError, match="n_values is n_pairs"):
        KeyValueRecall(n_pairs=4, n_values=8, slots=True)
    with pytest.raises(TypeError, match="slots must be True or False"):
        KeyValueRecall(slots=1)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        KeyValueRecall().sample(0, generator=torch.Generator())


def test_base_task_is_abstract():
    with pytest.raises(NotImplementedError):
        Task().sample(1, generator=torch.Generator())


# ---------------------------------------------------------------- repeated segments
def test_repeated_segments_repeat_and_point_at_the_earlier_follower():
    from mhalab.tasks import RepeatedSegments

    task = RepeatedSegments(vocab_size=16, seq_len=40, n_segments=2, segment_lengths=(3, 8))
    batch = _sample(task, n=64)
    x, y, src = batch.inputs, batch.targets, batch.sources["induction"]
    assert x.shape == y.shape == src.shape == (64, 40) and task.causal and task.relations == ("induction",)
    assert torch.equal(y[:, :-1], x[:, 1:]) and (y[:, -1] == IGNORE).all()  # next-token prediction
    pointed = src >= 0
    i = torch.arange(40).expand(64, 40)
    assert (src[pointed] <= i[pointed]).all()  # causal: the answer lies in the past
    # the follower of the earlier copy is the answer, and the token before it is the query's own token
    assert torch.equal(x.gather(1, src.clamp(min=0))[pointed], y[pointed])
    assert torch.equal(x.gather(1, (src - 1).clamp(min=0))[pointed], x[pointed])
    lengths = (i - src + 1)[pointed]  # how far back the copy is: a segment length
    assert lengths.min() >= 3 and lengths.max() <= 8
    for b in range(64):  # each row: n_segments runs of pointed queries, a segment of length L giving L - 1
        runs = [[]]
        for k in range(40):
            if pointed[b, k]:
                runs[-1].append(int(k - src[b, k] + 1))
            elif runs[-1]:
                runs.append([])
        runs = [r for r in runs if r]
        assert len(runs) == 2 and all(len(set(r)) == 1 and len(r) == r[0] - 1 for r in runs)
    assert lengths.unique().numel() == 6  # every length 3..8 occurs in 64 rows


def test_repeated_segments_metrics_split_repeated_from_fresh_targets():
    from mhalab.tasks import RepeatedSegments

    task = RepeatedSegments(vocab_size=10, seq_len=24, n_segments=1, segment_lengths=(4, 8))
    batch = _sample(task, n=16)
    repeated = batch.sources["induction"] >= 0
    # logits that know the repeats exactly and guess uniformly elsewhere
    logits = torch.zeros(16, 24, 10)
    logits[repeated] = torch.nn.functional.one_hot(batch.targets[repeated], 10).float() * 50.0
    m = task.metrics(logits, batch)
    assert m["loss/repeated"] < 1e-6
    assert abs(m["loss/fresh"] - math.log(10)) < 1e-5  # a uniform guess over 10 tokens
    n_repeated, n_fresh = int(repeated.sum()), int((batch.targets != IGNORE).sum() - repeated.sum())
    assert abs(m["loss"] - n_fresh * math.log(10) / (n_repeated + n_fresh)) < 1e-5


def test_repeated_segments_refuse_segments_that_do_not_fit():
    from mhalab.tasks import RepeatedSegments

    with pytest.raises(ValueError, match="need 48 positions but seq_len=40"):
        RepeatedSegments(seq_len=40, n_segments=2, segment_lengths=(6, 12))
    with pytest.raises(ValueError, match="shortest segment length must be at least 2"):
        RepeatedSegments(segment_lengths=(1, 4))
    with pytest.raises(TypeError, match=r"segment_lengths must be \(shortest, longest\)"):
        RepeatedSegments(segment_lengths=8)
    a = _sample(RepeatedSegments(), seed=1)
    b = _sample(RepeatedSegments(), seed=1)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.sources["induction"], b.sources["induction"])
