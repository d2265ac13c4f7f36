"""Tree builders against slow node-by-node references on small random inputs."""

import itertools
import math

import pytest
import torch

from dartree.draft import BlockDraft, PathCorrector
from dartree.tree import (DepthwiseBuilder, Draft, NoCorrection, Tree, ddtree_heap, fixed_quota_schedule,
                          prune_top_b, width_schedule)
from tiny import tiny_drafter, tiny_target


def random_block(depth=4, cand=5, hidden=64, seed=0, vocab=64):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(depth, vocab, generator=g) * 2
    logits, tokens = base.topk(cand, dim=-1)
    marginal = logits - torch.logsumexp(base, -1, keepdim=True)
    draft = Draft(torch.tensor(7), tokens, logits, marginal)
    return BlockDraft(draft, torch.randn(depth, hidden, generator=g))


@pytest.fixture(scope="module")
def models():
    target = tiny_target()
    return target, tiny_drafter(target)


def path_tokens(tree: Tree, node: int) -> tuple:
    out = []
    while node > 0:
        out.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return tuple(reversed(out))


def reference_supertree(drafter, target, block, width, depth):
    """Node by node: each node's GRU state is recomputed from its whole path, nothing is batched."""
    draft = block.draft
    anchor_embed = target.embed(draft.anchor.reshape(1))

    def state_of(path):
        tokens = torch.cat([draft.anchor.reshape(1), torch.tensor(path, dtype=torch.long)]).long()
        out = drafter.gru_scan(target.embed(tokens)[None])
        return out[0, -1:]

    frontier = [((), 0.0)]
    levels = []
    for d in range(1, depth + 1):
        cands = []
        for path, score in frontier:
            z = block.hidden[d - 1]
            columns = draft.cand_tokens[d - 1]
            residual = drafter.correction(z[None], state_of(path), columns)[0]
            lp = torch.log_softmax(draft.cand_base_logits[d - 1] + residual, -1)
            for c in range(draft.num_candidates):
                cands.append((path + (int(columns[c]),), score + float(lp[c])))
        cands.sort(key=lambda x: -x[1])
        frontier = cands[:width]
        levels.append(frontier)
    return levels


@pytest.mark.parametrize("width,seed", [(1, 0), (3, 1), (6, 2)])
def test_supertree_equals_node_by_node_reference(models, width, seed):
    target, drafter = models
    block = random_block(depth=4, cand=5, seed=seed)
    with torch.no_grad():
        builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(width))
        expansions = builder.run()
        tree = builder.tree()
        levels = reference_supertree(drafter, target, block, width, 4)
    for d, level in enumerate(levels, start=1):
        nodes = (tree.depths == d).nonzero().squeeze(-1).tolist()
        got = {path_tokens(tree, n): float(tree.scores[n]) for n in nodes}
        want = dict(level)
        assert set(got) == set(want)
        for key in want:
            assert math.isclose(got[key], want[key], abs_tol=1e-4)
    # every expanded candidate is recorded, and exactly W survive per depth
    for exp in expansions:
        assert exp.token.shape[0] == exp.frontier.shape[0] * block.draft.num_candidates
        assert int(exp.survived.sum()) == exp.keep == min(width, exp.token.shape[0])
        assert sorted(exp.rank.tolist()) == list(range(exp.token.shape[0]))


def test_correction_changes_scores_but_no_correction_gives_marginals(models):
    target, drafter = models
    block = random_block(depth=3, cand=4, seed=3)
    plain = DepthwiseBuilder(block.draft, NoCorrection(), width_schedule(4))
    exps = plain.run()
    assert torch.allclose(exps[1].corrected_lp, exps[1].marginal_lp)
    corrected = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(4)).run()
    assert not torch.allclose(corrected[1].corrected_lp, corrected[1].marginal_lp)


def brute_force_top_b(tree: Tree, budget: int):
    nodes = list(range(1, tree.num_nodes + 1))
    nodes.sort(key=lambda n: (-float(tree.scores[n]), int(tree.depths[n]), n))
    return sorted([0] + nodes[:budget])


def is_prefix_closed(tree: Tree) -> bool:
    n = tree.tokens.shape[0]
    return all(0 <= int(tree.parents[i]) < i for i in range(1, n)) and int(tree.parents[0]) == -1


@pytest.mark.parametrize("budget", [1, 5, 12, 40])
def test_prune_top_b_matches_brute_force_and_is_prefix_closed(models, budget):
    target, drafter = models
    block = random_block(depth=4, cand=5, seed=4)
    builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(5))
    with torch.no_grad():
        builder.run()
    supertree = builder.tree()
    pruned, kept = prune_top_b(supertree, budget)
    assert kept.tolist() == brute_force_top_b(supertree, budget)
    assert pruned.num_nodes == min(budget, supertree.num_nodes)
    assert is_prefix_closed(pruned)
    for i in range(1, pruned.num_nodes + 1):  # parents really are the same nodes
        assert path_tokens(pruned, i) == path_tokens(supertree, int(kept[i]))


def test_prune_breaks_ties_parent_first():
    # a chain where every child has log-prob exactly 0: all scores tie
    tree = Tree(torch.tensor([5, 1, 2, 3, 4]), torch.tensor([-1, 0, 1, 2, 0]), torch.tensor([0, 1, 2, 3, 1]),
                torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0]), 3)
    pruned, kept = prune_top_b(tree, 2)
    assert kept.tolist() == [0, 1, 2]
    assert is_prefix_closed(pruned)


def brute_force_ddtree(draft: Draft, budget: int, depth: int):
    """All paths of the marginal tree, ranked by summed marginal log-prob (parents first on ties)."""
    lp, toks = draft.cand_marginal_lp.tolist(), draft.cand_tokens.tolist()
    paths = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(draft.num_candidates), repeat=d):
            score = sum(lp[i][r] for i, r in enumerate(ranks))
            paths.append((score, d, tuple(toks[i][r] for i, r in enumerate(ranks))))
    paths.sort(key=lambda p: (-p[0], p[1]))
    return paths[:budget]


@pytest.mark.parametrize("budget", [1, 7, 20, 60])
def test_ddtree_heap_is_exact_top_b(budget):
    block = random_block(depth=3, cand=4, seed=5)
    tree = ddtree_heap(block.draft, budget)
    want = brute_force_ddtree(block.draft, budget, 3)
    got = sorted(path_tokens(tree, i) for i in range(1, tree.num_nodes + 1))
    assert got == sorted(p[2] for p in want)
    assert is_prefix_closed(tree)
    for i in range(1, tree.num_nodes + 1):
        assert math.isclose(float(tree.scores[i]), sum(
            float(block.draft.cand_marginal_lp[d, block.draft.cand_tokens[d].tolist().index(t)])
            for d, t in enumerate(path_tokens(tree, i))), abs_tol=1e-5)


@pytest.mark.parametrize("budget,depth", [(16, 4), (7, 3), (3, 5), (100, 4)])
def test_fixed_quota_spends_the_budget_by_ceil_remaining(models, budget, depth):
    target, drafter = models
    block = random_block(depth=depth, cand=5, seed=6)
    schedule = fixed_quota_schedule(budget, depth)
    builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), schedule)
    with torch.no_grad():
        exps = builder.run()
    remaining, frontier = budget, 1
    for d, exp in enumerate(exps, start=1):
        want = min(math.ceil(remaining / (depth - d + 1)), frontier * 5)
        assert exp.keep == want
        remaining -= want
        frontier = want
    tree = builder.tree()
    assert tree.num_nodes == sum(e.keep for e in exps) <= budget
    assert is_prefix_closed(tree)
