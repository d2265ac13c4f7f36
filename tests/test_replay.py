"""The replay sweep, the sequential corrected heap and the cost-aware budget, on tiny random models.

The replay claims to reproduce the decoder's rounds exactly at T = 0; these tests hold it to that by
decoding for real with the same settings and comparing every round's committed count.
"""

import itertools
import math

import pytest
import torch

from dartree.bench import BenchConfig, parse_configs
from dartree.budget import AutoBudget, calibrate
from dartree.draft import PathCorrector
from dartree.engine import DecodeSettings, Decoder, generate
from dartree.errors import UserError
from dartree.replay import accepted_depth, interpolate_verify, make_continuation, matched_nodes, replay
from dartree.tree import DepthwiseBuilder, Tree, prune_top_b, sequential_corrected_heap, width_schedule
from test_tree import is_prefix_closed, path_tokens, random_block
from tiny import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def models():
    target = tiny_target(seed=3)
    return target, tiny_drafter(target, seed=4)


CONFIGS = [("chain", 1, 1, 0.0), ("ddtree", 1, 10, 0.0), ("ddtree", 1, 20, 0.0), ("dartree-fixed", 1, 12, 0.0),
           ("dartree", 3, 8, 0.0), ("dartree", 6, 20, 0.0), ("dartree", 6, 12, -0.5)]  # ddtree B=20 > C: siblings


@pytest.mark.parametrize("prompt_seed", [0, 1])
@pytest.mark.parametrize("method,width,budget,bonus", CONFIGS)
def test_replay_reproduces_every_round_of_real_decoding(models, prompt_seed, method, width, budget, bonus):
    target, drafter = models
    g = torch.Generator().manual_seed(prompt_seed)
    prompt = torch.randint(2, 60, (9,), generator=g).tolist()
    ar = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=40))
    settings = DecodeSettings(method=method, width=width, budget=budget, candidates=8, max_new_tokens=40,
                              depth_bonus=bonus)
    real = generate(target, drafter, prompt, settings)
    assert real.token_ids == ar.token_ids
    cont = make_continuation(target, drafter, prompt, ar.token_ids)
    rounds = replay(target, drafter, cont, settings)
    assert rounds.committed == [r.committed for r in real.round_records]
    assert rounds.nodes == [r.tree_nodes for r in real.round_records]
    assert sum(rounds.committed) + 1 == len(ar.token_ids)  # the prefill makes the first token


def test_matched_nodes_is_the_accepted_path():
    # root 5 -> {1 -> {3, 4}, 2 -> {3}}; continuation after the anchor: 2, 3, 9
    tree = Tree(torch.tensor([5, 1, 2, 3, 4, 3]), torch.tensor([-1, 0, 0, 1, 1, 2]), torch.tensor([0, 1, 1, 2, 2, 2]),
                torch.zeros(6), 2)
    seq = [7, 5, 2, 3, 9]
    assert matched_nodes(tree, seq, 1).tolist() == [True, False, True, False, False, True]
    assert accepted_depth(tree, seq, 1) == 2
    assert accepted_depth(tree, [7, 5], 1) == 0  # nothing left to match at the end of the text
    assert accepted_depth(tree, [7, 5, 1], 1) == 1


def brute_force_corrected(drafter, target, block, budget, depth):
    """Every path up to `depth` scored through its own GRU scan; the best `budget` (parents first on ties)."""
    draft = block.draft
    corrector = PathCorrector(drafter, target, block)
    paths = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(draft.num_candidates), repeat=d):
            toks = [int(draft.cand_tokens[i, r]) for i, r in enumerate(ranks)]
            score, state = 0.0, corrector.root_state()
            for i, (r, tok) in enumerate(zip(ranks, toks)):
                res = corrector.residual(i + 1, state)
                base = draft.cand_base_logits[i]
                lp = torch.log_softmax(base if res is None else base + res[0], -1)
                score += float(lp[r].detach())
                state = corrector.advance(torch.tensor([tok]), state)
            paths.append((score, d, tuple(toks)))
    paths.sort(key=lambda p: (-p[0], p[1]))
    return paths[:budget]


@pytest.mark.parametrize("budget", [1, 5, 17, 39])
def test_sequential_corrected_heap_is_the_exact_corrected_top_b(models, budget):
    target, drafter = models
    block = random_block(depth=3, cand=3, seed=2, hidden=drafter.cfg.hidden_size)
    tree = sequential_corrected_heap(block.draft, PathCorrector(drafter, target, block), budget, 3)
    want = brute_force_corrected(drafter, target, block, budget, 3)
    assert tree.num_nodes == len(want)
    assert sorted(path_tokens(tree, i) for i in range(1, tree.num_nodes + 1)) == sorted(p[2] for p in want)
    assert is_prefix_closed(tree)
    got_scores = sorted((float(s) for s in tree.scores[1:]), reverse=True)
    assert all(math.isclose(a, b[0], abs_tol=1e-4) for a, b in zip(got_scores, want))


@pytest.mark.parametrize("budget", [4, 12, 30])
def test_supertree_of_width_b_pruned_to_b_equals_the_sequential_heap(models, budget):
    """With W = B the supertree holds the global best B, so deferred pruning finds the heap's tree."""
    target, drafter = models
    block = random_block(depth=4, cand=4, seed=7, hidden=drafter.cfg.hidden_size)
    builder = DepthwiseBuilder(block.draft, PathCorrector(drafter, target, block), width_schedule(budget), 4)
    builder.run()
    pruned, _ = prune_top_b(builder.tree(), budget)
    heap = sequential_corrected_heap(block.draft, PathCorrector(drafter, target, block), budget, 4)
    as_set = lambda t: sorted(path_tokens(t, i) for i in range(1, t.num_nodes + 1))  # noqa: E731
    assert as_set(pruned) == as_set(heap)


def test_calibration_counts_on_path_nodes_per_score_bin():
    scores = torch.tensor([-0.1, -0.2, -3.0, -9.0])
    on = torch.tensor([True, False, True, False])
    cal = calibrate([(scores, on)], edges=(-5.0, -1.0))
    assert cal["counts"] == [1, 1, 2]
    assert cal["rates"] == pytest.approx([0.0, 2 / 3, 2 / 3])  # top bin (1 of 2) sat below the middle (1 of 1): pooled


def test_auto_budget_maximises_expected_tokens_per_second():
    policy = AutoBudget(edges=[-3.0, -1.0], rates=[0.0, 0.3, 0.9], fixed_seconds=0.05,
                        verify_seconds={1: 0.1, 8: 0.12, 64: 0.5}, max_nodes=64)
    scores = torch.tensor([-0.1, -0.5, -2.0, -2.5, -4.0, -0.2, -5.0, -6.0])
    n = policy.choose(scores)
    top = sorted(scores.tolist(), reverse=True)

    def p(s):
        return 0.0 if s <= -3.0 else (0.3 if s <= -1.0 else 0.9)

    measured = {1, 7, 8}  # n + 1 on the cost curve, one node, or the whole supertree
    assert n in measured
    best = max(measured, key=lambda k: (1 + sum(p(s) for s in top[:k])) /
               (0.05 + interpolate_verify({"verify_seconds": {1: 0.1, 8: 0.12, 64: 0.5}}, k + 1)))
    assert n == best
    # with verification free, take everything the calibration says can be accepted
    cheap = AutoBudget([-3.0, -1.0], [0.0, 0.3, 0.9], 0.05, {1: 0.1, 64: 0.1}, 64)
    assert cheap.choose(scores) == 8  # the whole supertree: 63 (n + 1 = 64) is beyond it
    assert AutoBudget([-3.0, -1.0], [0.0, 0.3, 0.9], 0.05, {1: 0.1, 4: 0.1, 64: 0.1}, 64).node_grid == [1, 3, 63]


def test_auto_budget_in_the_decoder_is_lossless_and_varies(models):
    target, drafter = models
    prompt = list(range(3, 12))
    ar = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=30))
    policy = AutoBudget([-3.0, -1.5, -0.5], [0.0, 0.1, 0.4, 0.8], 0.02, {1: 0.05, 4: 0.06, 16: 0.1, 64: 0.4}, 64)
    settings = DecodeSettings(method="dartree", width=6, budget=64, candidates=8, max_new_tokens=30, auto_budget=True)
    got = generate(target, drafter, prompt, settings, policy)
    assert got.token_ids == ar.token_ids
    sizes = {r.tree_nodes for r in got.round_records}
    assert len(sizes) > 1 and max(sizes) <= 64  # the policy chose different budgets in different rounds
    cont = make_continuation(target, drafter, prompt, ar.token_ids)
    rounds = replay(target, drafter, cont, settings, budget_policy=policy)
    assert rounds.nodes == [r.tree_nodes for r in got.round_records]
    with pytest.raises(UserError, match="calibrated policy"):
        Decoder(target, drafter, prompt, settings)
    with pytest.raises(UserError, match="dartree"):
        DecodeSettings(method="ddtree", auto_budget=True).validated(5, 64)


def test_parse_configs():
    got = parse_configs("chain,ddtree:B=32,dartree:W=8:B=auto,dartree-fixed:B=16,dartree:W=4:B=8:bonus=-0.2")
    assert got == [BenchConfig("ar", None, None), BenchConfig("chain", None, None), BenchConfig("ddtree", None, 32),
                   BenchConfig("dartree", 8, "auto"), BenchConfig("dartree-fixed", None, 16),
                   BenchConfig("dartree", 4, 8, -0.2)]
    assert got[3].settings(DecodeSettings()).auto_budget
    assert got[5].settings(DecodeSettings(depth_bonus=0.0)).depth_bonus == -0.2
    assert got[2].settings(DecodeSettings(depth_bonus=-0.1)).depth_bonus == -0.1  # no knob: the base's
    assert got[5].label == "dartree W=4 B=8 bonus=-0.2"
    for bad in ("dartre:W=8", "dartree:W=x", "dartree:Q=3", "dartree:bonus=x"):
        with pytest.raises(UserError):
            parse_configs(bad)


def test_retrieval_knob_and_setting():
    """`retrieval=` in --configs; DecodeSettings resolves the default and refuses unknown modes; methods
    that take no retrieval resolve it to none."""
    from dartree.defaults import RETRIEVAL_DEFAULT

    got = parse_configs("dartree:retrieval=ngram,dartree-fixed:B=16:retrieval=both,dartree")
    assert got[1] == BenchConfig("dartree", None, None, None, "ngram") and got[1].label == "dartree retrieval=ngram"
    assert got[2].settings(DecodeSettings()).retrieval == "both"
    assert got[3].settings(DecodeSettings(retrieval="table")).retrieval == "table"  # no knob: the base's
    assert DecodeSettings().resolved("cpu").retrieval == RETRIEVAL_DEFAULT
    assert DecodeSettings(method="chain", retrieval="ngram").resolved("cpu").retrieval == "none"
    with pytest.raises(UserError, match="unknown retrieval"):
        DecodeSettings(retrieval="bigram").resolved("cpu")
    for bad in ("dartree:retrieval=bigram", "dartree:retrieval="):
        with pytest.raises(UserError):
            parse_configs(bad)


def test_continuity_knob_and_setting():
    """`continuity=` in --configs sets the n-gram term's weight; unset, the base's."""
    got = parse_configs("dartree:W=4:B=8:continuity=0.05,dartree")
    assert got[1] == BenchConfig("dartree", 4, 8, None, None, 0.05) and got[1].label == "dartree W=4 B=8 continuity=0.05"
    assert got[1].settings(DecodeSettings()).continuity == 0.05
    assert got[2].settings(DecodeSettings(continuity=0.2)).continuity == 0.2
    for bad in ("dartree:continuity=x", "dartree:continuity="):
        with pytest.raises(UserError):
            parse_configs(bad)


def test_spread_prompts_sample_the_whole_file(tmp_path):
    from dartree.prompts import read_prompt_file

    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(10)))
    assert read_prompt_file(f, 4, spread=True) == ["p0", "p3", "p6", "p9"]
    assert read_prompt_file(f, 4) == ["p0", "p1", "p2", "p3"]
    assert len(read_prompt_file(f, 40, spread=True)) == 10


def test_best_configs_pick_each_methods_fastest_row_and_keep_auto_apart():
    from dartree.sweep import best_configs

    def row(method, w, b, speed):
        return {"method": method, "width": w, "budget": b, "predicted_tokens_per_second": speed}

    rows = [row("ar", None, None, 10.0), row("chain", None, None, 11.0), row("ddtree", None, 8, 12.0),
            row("ddtree", None, 16, 13.0), row("dartree-fixed", None, 16, 9.0), row("dartree", 2, 16, 14.0),
            row("dartree", 4, 16, 15.0), row("dartree", 4, 32, 14.5), row("dartree", 4, "auto", 12.0),
            row("dartree", 8, "auto", 16.0), {**row("dartree", 4, 16, 15.5), "depth_bonus": -0.2}]
    assert best_configs(rows) == [BenchConfig("ar", None, None), BenchConfig("chain", None, None),
                                  BenchConfig("ddtree", None, 16), BenchConfig("dartree-fixed", None, 16),
                                  BenchConfig("dartree", 4, 16, -0.2), BenchConfig("dartree", 8, "auto")]


def test_committed_costs_carry_the_cost_curve_and_tree_times_by_shape(tmp_path):
    """`sweep --costs FILE`: speeds from a committed quiet-machine curve; tree times by (method, W, B)."""
    import json

    from dartree.replay import config_key
    from dartree.sweep import committed_costs

    curve = {"verify_seconds": {"1": 0.02, "16": 0.05}, "t_ar": 0.02, "draft_seconds": 0.01, "commit_seconds": 0.001}
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"cost_curve": curve, "rows": [
        {"method": "dartree", "width": 4, "budget": 8, "tree_ms": 3.0}, {"method": "ar", "width": None, "budget": None}]}))
    costs = committed_costs(f)
    assert costs["verify_seconds"] == curve["verify_seconds"] and costs["source"] == str(f)
    assert costs["tree_seconds"] == {config_key("dartree", 4, 8): 0.003}
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="--costs"):
        committed_costs(tmp_path / "bad.json")


def test_bench_best_of_takes_extra_configs_into_the_same_run(tmp_path):
    """`bench --best-of SWEEP --configs ...`: the sweep's best per method, then the extra ones (no repeats)."""
    import json
    from types import SimpleNamespace

    from dartree.cli import _grid

    rows = [{"method": "ar", "width": None, "budget": None, "predicted_tokens_per_second": 10.0},
            {"method": "ddtree", "width": None, "budget": 8, "predicted_tokens_per_second": 12.0},
            {"method": "dartree", "width": 4, "budget": 8, "predicted_tokens_per_second": 13.0}]
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps({"rows": rows}))
    models = SimpleNamespace(target=SimpleNamespace(vocab_size=100, device=torch.device("cpu")),
                             drafter=SimpleNamespace(max_depth=7))
    args = SimpleNamespace(best_of=str(sweep_file), configs="ddtree:B=32,dartree:W=4:B=8,dartree:W=12:B=32",
                           methods="", widths=None, budgets=None, depth=None, candidates=64, temperature=0.0,
                           top_p=1.0, seed=0, max_new_tokens=16)
    configs, _ = _grid(args, models)
    assert configs == [BenchConfig("ar", None, None), BenchConfig("ddtree", None, 8), BenchConfig("dartree", 4, 8),
                       BenchConfig("ddtree", None, 32), BenchConfig("dartree", 12, 32)]


def test_replay_refuses_the_successor_table_rather_than_replay_another_mode(models):
    """The table reads the target's logits at every verified node: the sweep decodes it (decoded_rounds)."""
    target, drafter = models
    for retrieval in ("table", "both"):
        with pytest.raises(ValueError, match="decode it"):
            replay(target, drafter, None, DecodeSettings(method="dartree", retrieval=retrieval))
