"""DART's n-gram continuity term (dartree.continuity): its counts against brute force, and where it applies."""

import math

import numpy as np
import pytest
import torch

from dartree.continuity import PAD, ContinuityTerm, NgramTable, continuity_term, corpus_folders
from dartree.shards import folder_responses
from dartree.engine import DecodeSettings
from dartree.errors import UserError


def brute_log_prob(seqs, order, tail, token, eps):
    """DART's rule by counting in Python: the longest context suffix seen decides, with its raw frequency."""
    grams = [tuple(s[i:i + k]) for s in seqs for k in range(1, order + 1) for i in range(len(s) - k + 1)]
    for k in range(order, 0, -1):
        context = tuple(tail[len(tail) - (k - 1):]) if k > 1 else ()
        total = sum(1 for g in grams if len(g) == k and g[:-1] == context)
        if total:
            count = sum(1 for g in grams if g == context + (token,))
            return min(math.log(count / total + eps), 0.0)
    raise AssertionError("the unigram context is always seen")


@pytest.mark.parametrize("order,vocab,seed", [(3, 6, 0), (3, 5, 1), (2, 40, 2), (1, 9, 3), (3, 30, 4)])
def test_log_probs_match_brute_force_counts(order, vocab, seed):
    rng = np.random.default_rng(seed)
    # ids near 2^16 too: every bit of a token's 16 is used
    ids = np.array(list(range(vocab - 2)) + [65000, 65533], dtype=np.int64)
    seqs = [ids[rng.integers(0, vocab, rng.integers(1, 30))] for _ in range(12)]
    table = NgramTable.build(seqs, order, eps=1e-10)
    tails = torch.from_numpy(ids[rng.integers(0, vocab, (7, order - 1))])
    if order > 1:
        tails[0, 0] = PAD  # a tail shorter than the order
    cand = torch.from_numpy(ids[rng.integers(0, vocab, (7, 5))])
    got = table.log_probs(tails, cand)
    assert got.shape == (7, 5) and bool((got <= 0).all())
    for f in range(7):
        for c in range(5):
            want = brute_log_prob([s.tolist() for s in seqs], order, tails[f].tolist(), int(cand[f, c]), 1e-10)
            assert math.isclose(float(got[f, c]), want, rel_tol=1e-5, abs_tol=1e-6), (f, c)


def test_the_term_is_weighted_and_tails_shift_by_the_survivors_tokens():
    seqs = [np.array([1, 2, 3, 1, 2, 4], dtype=np.int64)]
    term = ContinuityTerm(NgramTable.build(seqs, 3, eps=1e-10), weight=0.5)
    root = term.root_tails("cpu", [9, 1, 2])
    assert root.tolist() == [[1, 2]]
    assert term.root_tails("cpu", [2]).tolist() == [[PAD, 2]]
    assert term.root_tails("cpu", [7, 9, 1], [2]).tolist() == [[1, 2]]  # a prompt and an output
    assert term.root_tails("cpu", [7, 9], [1, 2, 3]).tolist() == [[2, 3]]
    assert term.root_tails("cpu", [], []).tolist() == [[PAD, PAD]]
    scores = term(root, torch.tensor([[3, 4, 1]]))
    assert torch.allclose(scores, 0.5 * torch.log(torch.tensor([[0.5, 0.5, 0.0]]) + 1e-10))
    tails = ContinuityTerm.advance(torch.tensor([[1, 2], [5, 6]]), torch.tensor([1, 0, 1]), torch.tensor([7, 8, 9]))
    assert tails.tolist() == [[6, 7], [2, 8], [6, 9]]
    empty = torch.zeros(2, 0, dtype=torch.long)  # a unigram table keeps no tail
    assert ContinuityTerm.advance(empty, torch.tensor([1, 0, 1]), torch.tensor([7, 8, 9])).shape == (3, 0)


def test_a_too_wide_token_id_an_empty_corpus_and_a_too_high_order_are_refused():
    for seqs, order in (([np.array([1, 70000], dtype=np.int64)], 2), ([np.zeros(0, dtype=np.int64)], 2),
                        ([np.array([1, 2], dtype=np.int64)], 4)):
        with pytest.raises(UserError):
            NgramTable.build(seqs, order)


def test_the_corpus_is_the_targets_greedy_answers_only():
    folders = corpus_folders("smollm2-135m")
    assert folders and all("t08" not in f.name for f in folders)  # sampled answers are not T = 0's
    assert corpus_folders("no-such-target") == []
    seqs = folder_responses(folders[:1])
    assert len(seqs) > 1000 and all(len(s) > 0 for s in seqs[:100])


def test_a_target_without_a_corpus_runs_the_default_weight_as_zero():
    from tiny import tiny_target

    target = tiny_target()
    s = DecodeSettings(continuity=0.3).validated(7, target.vocab_size)
    resolved, term = continuity_term(s, target)
    assert term is None and resolved.continuity == 0.0
    assert DecodeSettings(method="ddtree", continuity=0.3).resolved().continuity == 0.0  # not a method that takes it
    with pytest.raises(UserError, match="continuity"):
        DecodeSettings(continuity=-0.1).validated(7, target.vocab_size)
