"""Retrieval branches: n-gram matching against brute force, the successor table against a hand-computed
example, and the merged tree (prefix-closed, no duplicate siblings, every retrieved path present)."""

import random

import pytest
import torch

from dartree.retrieval import (DRAFT, NGRAM, TABLE, AcceptanceRates, Proposals, SuccessorTable, merge,
                               ngram_matches, ngram_proposals, slot_priors, source_label)
from dartree.defaults import RETRIEVAL_PRIORS
from dartree.tree import Tree, prune_top_b


def brute_force_matches(seq: list[int], max_n: int, branches: int):
    """Longest n <= max_n whose suffix recurs ending before the last token; its most recent `branches` ends."""
    L = len(seq)
    for n in range(min(max_n, L), 0, -1):
        suffix = seq[L - n:]
        ends = [j for j in range(n - 1, L - 1) if seq[j - n + 1:j + 1] == suffix]
        if ends:
            return n, sorted(ends, reverse=True)[:branches]
    return 0, []


@pytest.mark.parametrize("seed", range(200))
def test_ngram_matching_equals_brute_force(seed):
    rng = random.Random(seed)
    L = rng.randint(1, 40)
    seq = [rng.randint(0, rng.choice([2, 3, 6])) for _ in range(L)]
    ends, n, valid = ngram_matches(torch.tensor(seq), max_n=4, branches=3)
    want_n, want_ends = brute_force_matches(seq, 4, 3)
    assert ends[valid].tolist() == want_ends
    assert set(n[valid].tolist()) <= {want_n}


def test_ngram_proposals_continue_the_matches():
    seq = torch.tensor([5, 1, 2, 3, 9, 8, 1, 2, 3, 7, 1, 2, 3])  # suffix "1 2 3" seen twice before
    p = ngram_proposals(seq, depth=4, branches=3)
    assert p.tokens[0][p.valid[0]].tolist() == [7, 1, 2, 3]  # most recent match first
    assert p.tokens[1][p.valid[1]].tolist() == [9, 8, 1, 2]
    assert not p.valid[2].any()  # only two matches of length 3
    assert p.slots[0].tolist() == [2 * 4 + d for d in range(4)]  # n = 3: slots (n - 1) x D + d - 1


def test_successor_table_update_by_hand():
    t = SuccessorTable(vocab_size=6, k=2)
    # prompt 3 4 3 5: row 3 -> 5 (its latest occurrence), row 4 -> 3; last token 5 takes the logits' top-2
    t.seed(torch.tensor([3, 4, 3, 5]), torch.tensor([0.0, 5.0, 1.0, 0.0, 0.0, 4.0]))
    assert t.table[3].tolist() == [5, -1] and t.table[4].tolist() == [3, -1] and t.table[5].tolist() == [1, 5]
    # a verified tree: tokens 5 (root), 2, 2, 0; node 2 accepted, node 1 not: for token 2 the accepted node wins
    logits = torch.tensor([[0, 1, 9, 8, 0, 0],  # root (token 5): top-2 = 2, 3
                           [7, 6, 0, 0, 0, 0],  # node 1 (token 2, rejected): 0, 1
                           [0, 0, 0, 3, 4, 0],  # node 2 (token 2, accepted): 4, 3
                           [0, 0, 0, 0, 1, 2.]])  # node 3 (token 0): 5, 4
    t.update(torch.tensor([5, 2, 2, 0]), logits, torch.tensor([True, False, True, False]))
    assert t.table[5].tolist() == [2, 3] and t.table[2].tolist() == [4, 3] and t.table[0].tolist() == [5, 4]
    assert t.table[3].tolist() == [5, -1]  # untouched rows keep their entries
    p = t.proposals(torch.tensor(5), depth=3)  # the walk: M[5] = 2, 3; then each row's first entry
    assert p.tokens[0][p.valid[0]].tolist() == [2, 4, 3]  # M[2] = 4 (the accepted node's), M[4] = 3 (seed)
    assert p.tokens[1][p.valid[1]].tolist() == [3, 5, 2]
    assert p.slots.tolist() == [[0, 2, 3], [1, 2, 3]]
    p = t.proposals(torch.tensor(4), depth=2)  # M[4] = [3, unknown]: the second chain is empty
    assert p.valid.tolist() == [[True, True], [False, False]] and p.tokens[0].tolist() == [3, 5]


def random_tree(rng: random.Random, n: int, vocab: int) -> Tree:
    """A random draft tree with distinct sibling tokens and scores falling along paths."""
    tokens, parents, depths, scores = [0], [-1], [0], [0.0]
    for _ in range(1, n):
        p = rng.randrange(len(tokens))
        used = {t for t, q in zip(tokens, parents) if q == p}
        free = [t for t in range(vocab) if t not in used]
        if not free:
            continue
        tokens.append(rng.choice(free))
        parents.append(p)
        depths.append(depths[p] + 1)
        scores.append(scores[p] - rng.random() * 2)
    return Tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), torch.tensor(scores),
                max(depths))


def paths(tree: Tree) -> list[tuple]:
    out = []
    for i in range(tree.tokens.shape[0]):
        path, j = [], i
        while j >= 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        out.append(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_merged_tree_is_prefix_closed_without_duplicate_siblings(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    tree = random_tree(rng, rng.randint(1, 30), vocab)
    depth = rng.randint(1, 6)
    proposals, scores = [], []
    rates = AcceptanceRates(slot_priors(depth, RETRIEVAL_PRIORS), 4.0)
    for source in ("ngram", "table"):
        r = rng.randint(1, 4)
        lengths = torch.tensor([rng.randint(0, depth) for _ in range(r)])
        valid = torch.arange(depth)[None, :] < lengths[:, None]
        slots = torch.tensor([[rng.randrange(4 * depth if source == "ngram" else 3 + depth) for _ in range(depth)]
                              for _ in range(r)])
        p = Proposals(torch.randint(0, vocab, (r, depth)), valid, slots, source)
        proposals.append(p)
        scores.append(rates.scores(p))
    merged, nodes = merge(tree, proposals, scores)
    n = tree.tokens.shape[0]
    # tree nodes keep their place and token; topological order; no duplicate siblings (= no duplicate paths)
    assert torch.equal(merged.tokens[:n], tree.tokens) and torch.equal(merged.parents[:n], tree.parents)
    assert bool((merged.parents[1:] < torch.arange(1, merged.tokens.shape[0])).all())
    assert bool((merged.depths[1:] == merged.depths[merged.parents[1:]] + 1).all())
    all_paths = paths(merged)
    assert len(set(all_paths)) == len(all_paths)
    # scores never rise along a path, so every cut is prefix-closed
    assert bool((merged.scores[1:] <= merged.scores[merged.parents[1:]]).all())
    for budget in (1, 3, 8, 40):
        cut, kept = prune_top_b(merged, budget, -0.2)
        assert bool((cut.parents[1:] < torch.arange(1, cut.tokens.shape[0])).all())
        assert set(kept[cut.parents[1:]].tolist()) <= set(kept.tolist())
    # every valid retrieved chain is in the tree, its node carries the source's bit, the best score
    for p, s, node in zip(proposals, scores, nodes):
        bit = NGRAM if p.source == "ngram" else TABLE
        for r in range(p.tokens.shape[0]):
            for d in range(p.tokens.shape[1]):
                if not p.valid[r, d]:
                    assert node[r, d] == -1
                    continue
                i = int(node[r, d])
                assert all_paths[i] == (0,) + tuple(p.tokens[r, :d + 1].tolist())
                assert merged.sources[i] & bit and merged.scores[i] >= s[r, d]
    old = merged.sources[:n]
    assert bool((old & DRAFT).all()) and bool((merged.sources[n:] & DRAFT == 0).all())


def test_source_labels():
    assert [source_label(b) for b in (DRAFT, NGRAM, TABLE, DRAFT | NGRAM, NGRAM | TABLE)] == \
        ["draft", "ngram", "table", "both", "both"]


def test_acceptance_rates_learn_from_observed_nodes():
    rates = AcceptanceRates(slot_priors(2, RETRIEVAL_PRIORS), 4.0)
    p = Proposals(torch.tensor([[7, 8]]), torch.tensor([[True, True]]), torch.tensor([[0, 1]]), "ngram")
    before = rates.log_rate("ngram")[:2].exp()
    # a verified tree root -> 7 -> 8 where the target accepted 7 but not 8
    for _ in range(10):
        rates.observe(p, torch.tensor([[1, 2]]), torch.tensor([-1, 0, 1]), torch.tensor([True, True, False]))
    after = rates.log_rate("ngram")[:2].exp()
    assert after[0] > before[0] and after[1] < before[1]
    prior = RETRIEVAL_PRIORS["ngram"][0]  # slots 0, 1: match length 1, depths 1 and 2
    assert torch.allclose(after, torch.tensor([(10 + 4 * prior) / 14, (0 + 4 * prior) / 14], dtype=after.dtype))
