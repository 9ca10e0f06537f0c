"""mhalab.head_roles: one number per head from attention patterns, on hand-made patterns and on a model's cache."""

import math

import pytest
import torch

from mhalab import head_roles as S


def patterns(model, batch):
    """Every layer's pattern for the batch, as the notebooks get it."""
    return model.eval().run_with_cache(batch.inputs, names_filter=lambda name: name.endswith("hook_pattern"))[1]


def test_stack_takes_a_cache_a_list_or_a_stack(model, batch):
    cache = patterns(model, batch)
    stacked = S.stack_attention(cache)
    assert stacked.shape == (2, 6, 4, 8, 8)  # [layer, batch, head, query, key]
    assert torch.equal(S.stack_attention(list(cache.values())), stacked)
    assert S.stack_attention(stacked) is stacked
    with pytest.raises(ValueError, match="different shapes"):
        S.stack_attention([torch.rand(1, 2, 3, 3), torch.rand(1, 2, 3, 4)])


# ------------------------------------------------------------------------------- scores
def hand_made(T=6):
    """One layer, one example, three heads: previous-token, uniform, first-token."""
    prev = torch.zeros(T, T)
    prev[0, 0] = 1.0
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    uniform = torch.full((T, T), 1.0 / T)
    first = torch.zeros(T, T)
    first[:, 0] = 1.0
    return torch.stack([prev, uniform, first])[None, None]  # [N=1, B=1, H=3, T, T]


def test_generic_scores_on_hand_made_patterns():
    T = 6
    s = S.head_scores(hand_made(T))
    assert list(s) == list(S.GENERIC_SCORES)
    torch.testing.assert_close(s["previous-token"][0], torch.tensor([1.0, 1 / T, 1 / (T - 1)]))  # query 1 looks at 0
    torch.testing.assert_close(s["next-token"][0], torch.tensor([0.0, 1 / T, 0.0]))
    torch.testing.assert_close(s["self"][0], torch.tensor([1 / T, 1 / T, 1 / T]))  # prev's query 0 looks at itself
    torch.testing.assert_close(s["first-token"][0], torch.tensor([1 / (T - 1), 1 / T, 1.0]))
    torch.testing.assert_close(s["entropy"][0], torch.tensor([0.0, math.log(T), 0.0]))
    mean_distance_uniform = sum(abs(q - k) for q in range(T) for k in range(T)) / T / T
    torch.testing.assert_close(s["distance"][0], torch.tensor([(T - 1) / T, mean_distance_uniform, (T - 1) / 2]))


def test_relation_score_uses_the_sources():
    T = 6
    sources = torch.arange(T)[None] - 1  # [B=1, T]: the relation "one to the left"
    sources[0, 0] = -1  # points nowhere from query 0: left out
    score = S.relation_score(hand_made(T), sources)
    torch.testing.assert_close(score[0], torch.tensor([1.0, 1 / T, 1 / (T - 1)]))
    with pytest.raises(ValueError, match=r"must be \[batch, query\]"):
        S.relation_score(hand_made(T), sources[:, :3])
    with pytest.raises(ValueError, match="points nowhere"):
        S.relation_score(hand_made(T), torch.full((1, T), -1))


def test_head_scores_on_a_task_batch(model, batch):
    s = S.head_scores(patterns(model, batch), batch)
    assert list(s)[:2] == ["left1", "right1"] and all(v.shape == (2, 4) for v in s.values())
    # For this task "left1" is the previous token (queries 1..T-1), so the two scores agree.
    torch.testing.assert_close(s["left1"], s["previous-token"])
    text = S.format_scores(s, names=["left1", "entropy"])
    assert text.splitlines()[1].startswith("L0H0") and len(text.splitlines()) == 9


def test_best_heads_and_matching():
    s = {"a": torch.tensor([[0.9, 0.1], [0.2, 0.3]]), "b": torch.tensor([[0.1, 0.2], [0.85, 0.4]])}
    assert S.best_heads(s, ["a", "b"]) == {"a": ((0, 0), pytest.approx(0.9)), "b": ((1, 0), pytest.approx(0.85))}
    assert S.heads_matching(s, ["a", "b"], 0.8) == {(0, 0): "a", (0, 1): None, (1, 0): "b", (1, 1): None}


def test_role_of_is_the_one_vocabulary():
    # head (0,0): the relation "left1" and the generic previous-token score coincide -> the relation's name;
    # head (0,1): only a generic score passes -> its name; head (1,0): nothing passes -> NO_ROLE ("none").
    s = {"left1": torch.tensor([[0.9, 0.1], [0.2, 0.3]]), "previous-token": torch.tensor([[0.9, 0.1], [0.2, 0.3]]),
         "self": torch.tensor([[0.0, 0.7], [0.4, 0.1]]), "entropy": torch.tensor([[9.0, 9.0], [9.0, 9.0]])}
    assert S.role_of(s, 0, 0, ["left1"]) == "left1"
    assert S.role_of(s, 0, 0, []) == "previous-token"
    assert S.role_of(s, 0, 1, ["left1"]) == "self"
    assert S.role_of(s, 1, 0, ["left1"]) == S.NO_ROLE == "none"  # entropy (nats) is never a role
    assert S.role_of(s, 1, 0, ["left1"], threshold=0.35) == "self"


# ------------------------------------------------------------------------------- induction
def test_induction_score_on_hand_made_patterns():
    # tokens a b c a b c: queries 3, 4, 5 repeat tokens first seen at 0, 1, 2; their followers are at 1, 2, 3
    tokens = torch.tensor([[0, 1, 2, 0, 1, 2]])
    T = 6
    induction = torch.zeros(T, T)
    induction[torch.arange(T), torch.arange(T)] = 1.0  # queries 0..2 (no earlier occurrence) look at themselves
    induction[[3, 4, 5], [1, 2, 3]] = 1.0
    induction[[3, 4, 5], [3, 4, 5]] = 0.0
    half = induction.clone()
    half[[3, 4, 5], [1, 2, 3]] = 0.5  # half on the follower, half on the repeated token itself
    half[[3, 4, 5], [0, 1, 2]] = 0.5
    prev = hand_made(T)[0, 0, 0]
    A = torch.stack([induction, half, prev])[None, None]  # [N=1, B=1, H=3, T, T]
    torch.testing.assert_close(S.induction_score(A, tokens), torch.tensor([[1.0, 0.5, 0.0]]))
    # a previous-token head scores 0 here, and the induction head 0 as a previous-token head
    torch.testing.assert_close(S.previous_token_score(A)[0, 0], torch.tensor(0.0))


def test_induction_score_counts_every_earlier_follower_and_only_queries_with_one():
    # a x a y a: query 4 (a) has followers at 1 (x) and 3 (y); query 2 (a) has the follower at 1
    tokens = torch.tensor([[0, 5, 0, 6, 0]])
    A = torch.zeros(1, 1, 1, 5, 5)
    A[..., 2, 1] = 1.0
    A[..., 4, 1] = 0.25
    A[..., 4, 3] = 0.25
    A[..., 4, 4] = 0.5  # on itself: j = i is not a follower
    for q in (0, 1, 3):  # queries without an earlier occurrence: their weights must not count
        A[..., q, 0] = 1.0
    torch.testing.assert_close(S.induction_score(A, tokens), torch.tensor([[(1.0 + 0.5) / 2]]))


def test_induction_score_refuses_what_it_cannot_score():
    A = torch.full((1, 1, 1, 4, 4), 0.25)
    with pytest.raises(ValueError, match="nothing to induce"):
        S.induction_score(A, torch.tensor([[0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="nothing to induce"):  # a a: the only "follower" of a is the query itself
        S.induction_score(A, torch.tensor([[0, 0, 1, 2]]))
    with pytest.raises(ValueError, match=r"tokens \[batch, pos\] = \[1, 4\]"):
        S.induction_score(A, torch.tensor([[0, 1, 0]]))
