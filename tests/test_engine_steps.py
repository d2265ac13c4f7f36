"""The decoder runs as explicit steps, each emitting a plain record that converts to a DataFrame."""

import json

import pandas as pd
import pytest

from dartree import TREE_METHODS
from dartree.engine import Decoder, DecodeSettings, generate
from dartree.trace import rounds_frame
from tiny import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def models():
    t = tiny_target()
    return t, tiny_drafter(t)


@pytest.mark.parametrize("method", TREE_METHODS)
def test_a_round_is_draft_depths_prune_verify_commit(models, method):
    target, drafter = models
    dec = Decoder(target, drafter, [3, 4, 5, 6], DecodeSettings(method=method, width=3, budget=10, candidates=6,
                                                                depth=4, max_new_tokens=30))
    stages = [dec.prefill().stage]
    while True:
        rec = dec.step()
        stages.append(rec.stage)
        frame = rec.to_frame()
        assert isinstance(frame, pd.DataFrame) and len(frame) > 0
        json.dumps(rec.to_dict())  # JSON-ready
        if rec.stage == "commit":
            break
    depth_steps = 1 if method == "ddtree" else 4
    assert stages == ["prefill", "draft"] + ["depth"] * depth_steps + ["prune", "verify", "commit"]


def test_depth_records_carry_every_candidate_and_the_cut(models):
    target, drafter = models
    dec = Decoder(target, drafter, [3, 4, 5], DecodeSettings(method="dartree", width=3, budget=6, candidates=5, depth=3))
    dec.prefill()
    dec.draft()
    d1, d2 = dec.step(), dec.step()
    assert len(d1.to_frame()) == 5 and len(d2.to_frame()) == 3 * 5
    assert int(d2.survived.sum()) == 3
    prune = (dec.step(), dec.step())[1]
    assert prune.stage == "prune" and prune.num_nodes == 6
    verify = dec.step()
    assert verify.visible.shape == (7, 7)
    assert verify.to_frame()["accepted"].iloc[0]


def test_a_settled_round_has_fewer_depth_steps_and_its_last_one_says_so(models):
    """dartree with a fixed B stops growing once no deeper node could make the cut (dartree.tree)."""
    target, drafter = models
    dec = Decoder(target, drafter, [3, 4, 5], DecodeSettings(method="dartree", width=2, budget=2, candidates=5,
                                                             depth=5, max_new_tokens=40))
    dec.prefill()
    per_round, depths = [], []
    while dec.next_stage != "done":
        rec = dec.step()
        if rec.stage == "depth":
            depths.append(rec)
        elif rec.stage == "commit":
            per_round.append(depths)
            depths = []
    assert any(len(r) < 5 for r in per_round)
    for r in per_round:
        assert [d.settled for d in r] == [False] * (len(r) - 1) + [len(r) < 5]


def test_generate_reports_timings_per_stage(models):
    target, drafter = models
    res = generate(target, drafter, [3, 4, 5], DecodeSettings(method="dartree", width=2, budget=4, candidates=4,
                                                              max_new_tokens=12))
    assert set(res.stage_seconds) == {"draft", "tree", "verify", "commit"}
    assert all(v >= 0 for v in res.stage_seconds.values()) and res.decode_seconds > 0
    frame = rounds_frame(res.round_records)
    assert list(frame.columns[:3]) == ["round", "tree_nodes", "committed"]
    assert frame["committed"].sum() == res.new_tokens - 1  # the first token comes from prefill


def test_a_finished_decoder_refuses_more_steps(models):
    target, drafter = models
    dec = Decoder(target, drafter, [3, 4], DecodeSettings(method="chain", max_new_tokens=2))
    dec.run()
    from dartree.errors import UserError
    with pytest.raises(UserError, match="finished"):
        dec.step()
