"""Tree builders against slow node-by-node references on small random inputs."""

import itertools
import math

import pytest
import torch

from dartree.draft import BlockDraft, PathCorrector
from dartree.tree import (DepthwiseBuilder, Draft, NoCorrection, Tree, cut_scores, ddtree_heap, fixed_quota_schedule,
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


def reference_supertree(drafter, target, block, width, depth, log_probs=lambda logits: torch.log_softmax(logits, -1)):
    """Node by node: each node's GRU state is recomputed from its whole path, nothing is batched; `log_probs`
    turns a path's corrected logits over the C candidates into the log-probs its score adds."""
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
            lp = log_probs(draft.cand_base_logits[d - 1] + residual)
            for c in range(draft.num_candidates):
                cands.append((path + (int(columns[c]),), score + float(lp[c])))
        cands.sort(key=lambda x: -x[1])
        frontier = cands[:width]
        levels.append(frontier)
    return levels


def assert_levels_match(tree: Tree, levels, tol: float) -> None:
    """The tree holds, per depth, exactly the reference's paths, with its scores."""
    for d, level in enumerate(levels, start=1):
        nodes = (tree.depths == d).nonzero().squeeze(-1).tolist()
        got = {path_tokens(tree, n): float(tree.scores[n]) for n in nodes}
        want = dict(level)
        assert set(got) == set(want)
        for key in want:
            assert math.isclose(got[key], want[key], abs_tol=tol)


@pytest.mark.parametrize("width,seed", [(1, 0), (3, 1), (6, 2)])
def test_supertree_equals_node_by_node_reference(models, width, seed):
    target, drafter = models
    block = random_block(depth=4, cand=5, seed=seed)
    with torch.no_grad():
        builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(width))
        expansions = builder.run()
        tree = builder.tree()
        levels = reference_supertree(drafter, target, block, width, 4)
    assert_levels_match(tree, levels, 1e-4)
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


# ---------------------------------------------------------------------------------------------- pure-draft depths
def test_pure_draft_depths_score_with_full_vocabulary_marginals(models):
    """pure_draft_prefix_len = 2: depths 1 and 2 add the log-softmax of the base logits over the whole
    vocabulary (by hand: the hidden rows through the target's LM head), not over the C candidates."""
    from dartree.draft import DrafterContext, draft_block

    target, _ = models
    drafter = tiny_drafter(target, prefix=2)
    context = DrafterContext.from_prefill(drafter, torch.randn(6, 2 * target.hidden_size,
                                                               generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        block = draft_block(drafter, target, context, torch.tensor(3), 6, drafter.max_depth, 5)
        by_hand = torch.log_softmax(block.hidden @ target.model.get_output_embeddings().weight.T, dim=-1)  # [D, V]
        builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(3))
        exps = builder.run()
    tokens = block.draft.cand_tokens
    for d in (1, 2):
        want = by_hand[d - 1][tokens[d - 1]].expand(exps[d - 1].frontier.shape[0], -1).reshape(-1)
        torch.testing.assert_close(exps[d - 1].corrected_lp, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(exps[d - 1].marginal_lp, want, atol=1e-5, rtol=1e-5)
        over_c = torch.log_softmax(block.draft.cand_base_logits[d - 1], -1)
        assert not torch.allclose(exps[d - 1].corrected_lp[:5], over_c, atol=1e-3)  # what it used to be
    parent = exps[0].score[exps[0].survived]
    torch.testing.assert_close(exps[1].score.view(-1, 5), parent[:, None] + exps[1].corrected_lp.view(-1, 5))
    assert not torch.allclose(exps[2].corrected_lp, exps[2].marginal_lp, atol=1e-3)  # depth 3: the head corrects


# ---------------------------------------------------------------------------------------------- depth bonus
LOG_PROBS = (0.0, -0.25, -0.5, -0.75, -1.5)  # dyadic: every key below is exact, so ties are real ties
BONUSES = (0.0, -0.125, -0.25, -0.5, -1.0)


def random_tree(seed: int, n: int = 40) -> Tree:
    """A random tree in topological order whose child log-probs come from LOG_PROBS (many ties, zeros included)."""
    g = torch.Generator().manual_seed(seed)
    parents, depths, scores = [-1], [0], [0.0]
    for i in range(1, n):
        p = int(torch.randint(0, i, (1,), generator=g))
        parents.append(p)
        depths.append(depths[p] + 1)
        scores.append(scores[p] + LOG_PROBS[int(torch.randint(0, len(LOG_PROBS), (1,), generator=g))])
    return Tree(torch.arange(100, 100 + n), torch.tensor(parents), torch.tensor(depths), torch.tensor(scores),
                max(depths))


def brute_force_biased_top_b(tree: Tree, budget: int, bonus: float) -> list[int]:
    """Rank by path score + bonus x depth in exact Python arithmetic, parents first on ties (lower index)."""
    scores, depths = tree.scores.tolist(), tree.depths.tolist()
    nodes = sorted(range(1, len(scores)), key=lambda i: (-(scores[i] + bonus * depths[i]), i))
    return sorted([0] + nodes[:budget])


@pytest.mark.parametrize("seed", range(6))
def test_depth_bonus_cut_is_the_brute_force_top_b_and_prefix_closed(seed):
    tree = random_tree(seed)
    keys = {bonus: (tree.scores + bonus * tree.depths).tolist() for bonus in BONUSES}
    assert any(len(set(k[1:])) < len(k) - 1 for k in keys.values())  # ties do occur
    for bonus in BONUSES:
        for budget in range(1, tree.num_nodes + 1):
            pruned, kept = prune_top_b(tree, budget, bonus)
            assert kept.tolist() == brute_force_biased_top_b(tree, budget, bonus), (bonus, budget)
            kept_set = set(kept.tolist())
            assert all(int(tree.parents[i]) in kept_set for i in kept.tolist()[1:])  # closed under parents
            assert is_prefix_closed(pruned)


def test_a_depth_bonus_prefers_shallow_nodes_and_a_positive_one_is_refused():
    tree = random_tree(3)
    deep = {b: float(tree.depths[prune_top_b(tree, 10, b)[1]].float().mean()) for b in (0.0, -1.0)}
    assert deep[-1.0] < deep[0.0]
    with pytest.raises(ValueError, match="above 0"):
        prune_top_b(tree, 5, 0.1)
    assert torch.equal(cut_scores(tree, 0.0), tree.scores)


@pytest.mark.parametrize("seed", range(4))
def test_a_settled_builder_stops_early_and_cuts_exactly_the_whole_supertree(models, seed):
    """With its budget known, the builder stops once no deeper node could make the cut, and the cut of what it
    grew is the cut of the whole supertree: the same nodes (paths), scores and order. Coarse scores make ties."""
    target, drafter = models
    block = random_block(depth=6, cand=4, seed=10 + seed)
    draft = block.draft
    coarse = Draft(draft.anchor, draft.cand_tokens, (draft.cand_base_logits * 2).round() / 2,
                   (draft.cand_marginal_lp * 2).round() / 2)
    stopped_early = 0
    for corrector in (PathCorrector(drafter, target, block), NoCorrection()):
        for d, width, budget, bonus in itertools.product((draft, coarse), (2, 4), (1, 3, 8), (0.0, -0.2, -1.0)):
            builders = [DepthwiseBuilder(d, corrector, width_schedule(width), cut_bonus=bonus, cut_budget=b)
                        for b in (None, budget)]
            with torch.no_grad():
                steps = [len(b.run()) for b in builders]
            (_, whole, _), (grown, cut, _) = (b.finish(budget) for b in builders)
            assert [path_tokens(whole, i) for i in range(whole.num_nodes + 1)] == \
                   [path_tokens(cut, i) for i in range(cut.num_nodes + 1)]
            assert torch.equal(whole.scores, cut.scores)
            assert steps[1] <= steps[0] and builders[1].settled == (steps[1] < steps[0])
            stopped_early += steps[1] < steps[0]
            if builders[1].settled:  # and it really was settled: nothing deeper beats the B-th best key
                keys = cut_scores(builders[0].tree(), bonus)[1:]
                bar = keys.topk(budget).values[-1]
                assert bool((keys[builders[0].tree().depths[1:] > steps[1]] < bar).all())
    assert stopped_early > 0


# ---------------------------------------------------------------------------------------------- DDTree, B > C
def full_vocabulary_top_b(lp: torch.Tensor, budget: int):
    """Every path of depth <= D over the whole vocabulary [D, V], by summed log-prob: (scores, paths) best first."""
    depth, vocab = lp.shape
    scores, paths = [], []
    level = torch.zeros(1, dtype=torch.float64)
    prefixes = [()]
    for d in range(depth):
        level = (level[:, None] + lp[d][None, :]).reshape(-1)  # [V ** (d + 1)], row-major over the path
        prefixes = [p + (t,) for p in prefixes for t in range(vocab)]
        scores.append(level)
        paths += prefixes
    scores = torch.cat(scores)
    order = torch.sort(-scores, stable=True).indices[:budget]  # shallower first on ties: they come first
    return scores[order], [paths[i] for i in order.tolist()]


@pytest.mark.parametrize("draft_vocab,budget", [(0, 20), (0, 60), (16, 40)])
def test_ddtree_heap_takes_siblings_from_the_whole_vocabulary(draft_vocab, budget):
    """B > C: the heap's tree is the exact top-B over every path of the tiny model's vocabulary (or of the
    drafter's draft vocabulary, where min(B, V) = V caps the siblings), by hand from the LM head."""
    from dartree.draft import DrafterContext, draft_block
    from dartree.engine import DecodeSettings, sibling_count

    target = tiny_target()
    drafter = tiny_drafter(target, block_size=4, draft_vocab_size=draft_vocab)
    if draft_vocab:
        drafter.set_draft_vocab(torch.randperm(64, generator=torch.Generator().manual_seed(2))[:draft_vocab])
    settings = DecodeSettings(method="ddtree", budget=budget, candidates=4)
    assert sibling_count(settings) == budget
    context = DrafterContext.from_prefill(drafter, torch.randn(5, 2 * target.hidden_size,
                                                               generator=torch.Generator().manual_seed(3)))
    with torch.no_grad():
        block = draft_block(drafter, target, context, torch.tensor(3), 5, 3, 4, sibling_count(settings))
        logits = block.hidden @ target.model.get_output_embeddings().weight.T  # [3, 64]
    columns = drafter.draft_vocab if draft_vocab else torch.arange(64)
    lp = torch.log_softmax(logits[:, columns].double(), dim=-1)  # [3, V]
    want_scores, want_paths = full_vocabulary_top_b(lp, budget)
    tree = ddtree_heap(block.draft, budget)
    assert tree.num_nodes == budget and is_prefix_closed(tree)
    got = {path_tokens(tree, i): float(tree.scores[i]) for i in range(1, budget + 1)}
    want = {tuple(int(columns[t]) for t in p): float(s) for s, p in zip(want_scores, want_paths)}
    boundary = float(want_scores[-1])
    for path, score in got.items():  # the same set, up to float noise exactly at the B-th score
        assert path in want or abs(score - boundary) < 1e-5, path
        assert math.isclose(score, sum(float(lp[d, columns.tolist().index(t)]) for d, t in enumerate(path)),
                            abs_tol=1e-4)
    cand = block.draft.cand_tokens.tolist()
    assert any(t not in cand[len(p) - 1] for p in got for t in p[-1:])  # some sibling lies beyond the top C


# ---------------------------------------------------------------------------------------- scores at T > 0
def processed_log_probs_by_the_sampler(temperature, top_p):
    """The sampler's own rule (dartree.sampling.processed_probs) over the C candidates, as logs: a path score is
    then the log of the product of the processed probabilities along the path (0 counts as OUTSIDE_NUCLEUS)."""
    from dartree.sampling import processed_probs
    from dartree.sampling import OUTSIDE_NUCLEUS

    def log_probs(logits):
        probs = processed_probs(logits[None], temperature, top_p)[0]
        return torch.where(probs > 0, probs.log(), torch.tensor(OUTSIDE_NUCLEUS))

    return log_probs


@pytest.mark.parametrize("temperature,top_p", [(0.8, 1.0), (0.5, 0.9), (1.3, 0.7)])
def test_processed_scores_equal_the_product_of_processed_probabilities(models, temperature, top_p):
    target, drafter = models
    block = random_block(depth=4, cand=5, seed=5)
    with torch.no_grad():
        builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(3),
                                   score_temperature=temperature, top_p=top_p)
        builder.run()
        tree = builder.tree()
        by_the_sampler = processed_log_probs_by_the_sampler(temperature, top_p)
        levels = reference_supertree(drafter, target, block, 3, 4, by_the_sampler)
    assert_levels_match(tree, levels, 1e-3)


def test_scores_at_temperature_zero_are_bit_identical_to_the_drafted_ones(models):
    """T = 0 (greedy) leaves the scores exactly as drafted: the same bits as before scores knew T."""
    from dartree.engine import DecodeSettings
    from dartree.tree import child_log_probs

    target, drafter = models
    block = random_block(depth=4, cand=5, seed=6)
    draft = block.draft
    residual = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(child_log_probs(draft, 2, residual, 0.0, 0.5),
                       torch.log_softmax(draft.cand_base_logits[1] + residual, dim=-1))
    assert torch.equal(child_log_probs(draft, 2, None, 0.0, 0.5), draft.cand_marginal_lp[1])
    for top_p in (1.0, 0.8):  # greedy settings resolve to unprocessed scores whatever the top-p
        assert DecodeSettings(temperature=0.0, top_p=top_p).resolved("cpu").score_temperature == 0.0
    assert DecodeSettings(temperature=0.8).resolved("cpu").score_temperature > 0
    with torch.no_grad():
        trees = []
        for kwargs in ({}, {"score_temperature": 0.0, "top_p": 0.8}):
            b = DepthwiseBuilder(draft, PathCorrector(drafter, target, block), width_schedule(4), cut_bonus=-0.2,
                                 **kwargs)
            b.run()
            trees.append(b.finish(6)[1])
    for field in ("tokens", "parents", "depths", "scores"):
        assert torch.equal(getattr(trees[0], field), getattr(trees[1], field))
    assert torch.equal(ddtree_heap(draft, 9).scores, ddtree_heap(draft, 9, None, 0.0, 0.8).scores)


@pytest.mark.parametrize("temperature", [0.5, 0.8, 1.0])
def test_processed_marginals_against_the_whole_vocabulary(temperature):
    """Full-vocabulary marginals: exact at T = 1; below it the tail estimate (every token beyond the C
    candidates as likely as the last one) over-counts the partition, so each log-prob is at most the exact
    one, and the candidates keep their order."""
    from dartree.sampling import processed_log_probs

    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 64, generator=g) * 2
    logits, _ = base.topk(8, dim=-1)
    lp = logits - torch.logsumexp(base, -1, keepdim=True)
    got = processed_log_probs(lp, temperature)
    exact = logits / temperature - torch.logsumexp(base / temperature, -1, keepdim=True)
    if temperature == 1.0:
        assert torch.allclose(got, exact, atol=1e-5)
    assert (got <= exact + 1e-5).all()
    assert (got.diff(dim=-1) <= 0).all()
    assert (exact - got).max() < 0.5  # an estimate, not a bound only


def test_top_p_scores_match_the_sampler_on_the_candidates():
    """With the candidates holding all the mass, processed log-probs are the logs of the sampler's
    processed_probs, the tokens it never draws marked OUTSIDE_NUCLEUS."""
    from dartree.sampling import processed_probs
    from dartree.sampling import OUTSIDE_NUCLEUS, processed_log_probs

    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(2)) * 2
    for temperature, top_p in ((0.7, 0.8), (1.2, 0.5), (0.9, 1.0)):
        probs = processed_probs(logits, temperature, top_p)
        got = processed_log_probs(torch.log_softmax(logits, -1), temperature, top_p)
        want = torch.where(probs > 0, probs.log(), torch.tensor(OUTSIDE_NUCLEUS))
        assert torch.allclose(got, want, atol=1e-5)


def test_continuity_scores_equal_a_node_by_node_reference_and_never_rise_along_a_path(models):
    """The builder carries each path's last tokens: its scores are the head's log-probs plus w log P_ngram of the
    whole path's tail, recomputed here node by node from the path."""
    import numpy as np

    from dartree.continuity import ContinuityTerm, NgramTable

    target, drafter = models
    block = random_block(depth=4, cand=5, seed=3)
    cand = block.draft.cand_tokens
    # a corpus that knows some of the candidates' continuations and not others
    rng = np.random.default_rng(0)
    seqs = [cand.flatten()[rng.integers(0, cand.numel(), 40)].numpy().astype(np.int64) for _ in range(20)]
    term = ContinuityTerm(NgramTable.build(seqs, 3, eps=1e-6), weight=0.4)
    committed = [5, 7]  # ... the anchor (7) last
    with torch.no_grad():
        builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(3),
                                   continuity=term, root_tails=term.root_tails("cpu", committed))
        builder.run()
        tree = builder.tree()
        plain = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(3))
        plain.run()
    assert not torch.equal(tree.tokens, plain.tree().tokens)  # the term changed which paths survive

    @torch.no_grad()
    def head_log_prob(path, depth, token):
        state_tokens = torch.tensor([7, *path], dtype=torch.long)
        state = drafter.gru_scan(target.embed(state_tokens)[None])[0, -1:]
        columns = cand[depth - 1]
        residual = drafter.correction(block.hidden[depth - 1][None], state, columns)[0]
        lp = torch.log_softmax(block.draft.cand_base_logits[depth - 1] + residual, -1)
        return float(lp[(columns == token).nonzero()[0, 0]])

    for node in range(1, tree.num_nodes + 1):
        path = path_tokens(tree, node)
        want = 0.0
        for d in range(1, len(path) + 1):
            tail = torch.tensor([(committed + list(path[:d - 1]))[-2:]])
            want += head_log_prob(path[:d - 1], d, path[d - 1]) + float(term(tail, torch.tensor([[path[d - 1]]]))[0, 0])
        assert math.isclose(float(tree.scores[node]), want, abs_tol=1e-4)
        assert float(tree.scores[node]) <= float(tree.scores[int(tree.parents[node])])  # the cut stays prefix-closed
