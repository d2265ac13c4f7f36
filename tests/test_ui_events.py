"""The explorer's event functions on the real engine and the real default target (no browser)."""

import copy
import html
import json
import re
import statistics
import time
from dataclasses import asdict, fields, replace

import plotly.graph_objects as go
import pytest

from dartree.defaults import CPU_DEFAULTS, RETRIEVAL_DEFAULT
from dartree.engine import DecodeSettings, generate
from dartree.errors import UserError
from dartree.ui import compare, figures, layout, panels
from dartree.ui.adapter import NodeView
from dartree.ui.session import WARNING, Controls, canonical_session, default_controls, event, export_trace

pytestmark = [pytest.mark.real, pytest.mark.filterwarnings("ignore::UserWarning")]

PROMPT = "What is the capital of France?"
# without the n-gram term, which settles the cut before depth 7 here: the stepping tests grow all seven depths
SMALL = dict(prompt=PROMPT, width=4, budget=12, depth=7, candidates=32, max_new_tokens=12, continuity=0.0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on this shared 2-core machine that is several times faster than two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models():
    from dartree.models.loading import load_models

    return load_models()


@pytest.fixture(scope="module")
def canonical(models):
    return canonical_session(models, Controls(max_new_tokens=12))


@pytest.fixture(scope="module")
def plain(models):
    """Plain decoding of PROMPT (T = 0): what every method must commit."""
    target = models.target
    return generate(target, None, target.chat_ids(PROMPT), DecodeSettings(method="ar", max_new_tokens=12)).token_ids


def is_placeholder(fig: go.Figure) -> bool:
    return len(fig.data) == 0


def shown_text(panel: str) -> str:
    """The text panel's words without its markup."""
    return html.unescape(re.sub(r"<[^>]+>", "", panel))


def test_first_load_has_every_panel_filled(canonical, models):
    first = panels.full_render(canonical)
    assert set(first) == set(panels.OUTPUTS)
    for name in panels.PANELS:
        if name.endswith("_fig"):
            assert isinstance(first[name], go.Figure), name
            assert not is_placeholder(first[name]), f"{name} is empty on first load"
            assert first[name].layout.height, f"{name} has no explicit height"
    committed = first["summary"]["text"]
    assert committed.strip() and committed.replace("\n", "") in shown_text(first["text"])  # the round's words
    assert first["summary"]["rounds"] == 1 and first["summary"]["next_stage"] == "draft"
    assert "Whole runs" in first["speed_md"] and "no ratio" in first["speed_md"]  # timed at start-up; 11 tokens
    assert "reference" in first["speed_md"]  # the machine's bench result for the default shape
    assert models.drafter_description.startswith("trained on")  # the shipped drafter is the default
    banner = layout.drafter_banner(models)
    assert "UNTRAINED" not in banner and "trained on" in banner


def test_stepping_a_round_stage_by_stage(canonical, plain):
    session = copy.deepcopy(canonical)
    out = event(session, "draft", **SMALL)
    assert "started again" in out["status"] and "Round 0" in out["status"]
    assert set(out) == set(panels.OUTPUTS)  # new settings: every panel redrawn
    assert not is_placeholder(out["draft_fig"]) and is_placeholder(out["verify_fig"])
    timings = []
    for d in range(1, 8):
        t0 = time.perf_counter()
        out = event(session, "depth", **SMALL)
        timings.append(time.perf_counter() - t0)
        assert f"Depth {d}:" in out["status"]
        assert out["summary"]["depths_built"] == d
        assert not is_placeholder(out["supertree_fig"]) and not is_placeholder(out["correction_fig"])
        # a depth redraws the tree and the correction only: the pruning panels keep what they show
        assert set(out) == {"status", "summary", "supertree_fig", "correction_fig"}, sorted(out)
    print(f"depth step: median {statistics.median(timings):.3f} s, max {max(timings):.3f} s")
    assert statistics.median(timings) < 0.5
    assert out["summary"]["supertree_nodes"] == 4 * 7  # W per depth
    out = event(session, "prune", **SMALL)
    assert out["summary"]["tree_nodes"] == 12 and "12 best" in out["status"]
    # the pruning panels; with retrieval (the default) the supertree too: the retrieved chains join it here
    retrieved = session.decoder.settings.retrieval != "none"
    assert retrieved == (SMALL.get("retrieval", RETRIEVAL_DEFAULT) != "none")
    assert set(out) == {"status", "summary", "prune_fig", "rank_fig", "mask_fig"} | (
        panels.RETRIEVED_JOIN if retrieved else set())
    merged = out["summary"]["supertree_nodes"]  # drafted nodes plus the retrieved ones that are new paths
    assert merged >= 4 * 7
    bars = out["rank_fig"].data[0].marker.color  # ranked by path score: the best B are the kept ones
    assert len(bars) == merged and set(bars[:12]) == {"#3b75af"} and "#3b75af" not in bars[12:]
    out = event(session, "verify", **SMALL)
    assert out["summary"]["accepted"] is not None and "bonus" in out["status"]
    out = event(session, "commit", **SMALL)
    committed = out["summary"]["output_ids"]
    assert committed == plain[: len(committed)] and len(committed) >= 2
    assert out["summary"]["next_stage"] == "draft"


def test_sessions_are_independent(canonical, models):
    a, b = copy.deepcopy(canonical), copy.deepcopy(canonical)
    assert a.decoder is not canonical.decoder and a.decoder.target is models.target
    before = panels.summary(b)
    event(a, "depth", **asdict(canonical.controls))
    assert panels.summary(a)["next_stage"] == "depth" and panels.summary(b) == before
    assert panels.summary(canonical)["next_stage"] == "draft"


@pytest.mark.parametrize("method", ["ddtree", "chain", "dartree-fixed"])
def test_other_methods_round(canonical, plain, method):
    session = copy.deepcopy(canonical)
    out = event(session, "round", **dict(SMALL, method=method))
    s = out["summary"]
    assert s["rounds"] == 1 and s["output_ids"] == plain[: len(s["output_ids"])]
    nodes = s["tree_nodes"]
    assert nodes == (7 if method == "chain" else 12)
    assert not is_placeholder(out["verify_fig"]) and not is_placeholder(out["mask_fig"])
    if method == "ddtree":
        assert "no correction" in out["correction_fig"].layout.annotations[0].text


def test_errors_are_messages_not_tracebacks(canonical):
    session = copy.deepcopy(canonical)
    cases = [
        (dict(SMALL, prompt="   "), "prompt is empty"),
        (dict(SMALL, prompt="word " * 9000), "context"),
        (dict(SMALL, budget=0), "budget B"),
        (dict(SMALL, depth=9), "depth D"),
        (dict(SMALL, temperature=5.0), "temperature"),
        (dict(SMALL, depth_bonus=-2.0), "depth bonus"),
        (dict(SMALL, continuity=5.0), "continuity weight"),
        (dict(SMALL, width="wide"), "width must be a number"),
    ]
    for controls, message in cases:
        out = event(session, "draft", **controls)
        assert out["status"].startswith("⚠️") and message in out["status"], out["status"]
        assert message in out[WARNING] and "Traceback" not in out["status"]
        assert set(out) == {"status", WARNING}  # the panels keep what they showed
    event(session, "depth", **SMALL)
    out = event(session, "draft", **SMALL)
    assert out["status"].startswith("⚠️") and "still being built" in out["status"]
    event(session, "prune", **SMALL)
    out = event(session, "depth", **SMALL)
    assert "already passed" in out["status"]
    with pytest.raises(TypeError, match="unknown controls"):  # a misspelt control is a bug, not a message
        Controls.of(widht=4)


def test_run_to_end_trace_and_speed(canonical, plain):
    session = copy.deepcopy(canonical)
    out = event(session, "end", **dict(SMALL, max_new_tokens=6))
    s = out["summary"]
    assert s["next_stage"] == "done" and s["output_ids"] == plain[:6]
    assert "Whole runs" in out["speed_md"] and len(out["speed_fig"].data[0].x) == 2
    assert "no ratio: 5 decoded tokens" in out["speed_md"]  # too few tokens for a ratio
    assert len(out["timeline_fig"].data) == 4
    out = event(session, "depth", **dict(SMALL, max_new_tokens=6))
    assert "finished" in out["status"]
    data = json.loads(open(export_trace(session, "json")).read())
    assert data["records"][0]["stage"] == "draft" and data["records"][-1]["stage"] == "commit"
    assert "stage" in open(export_trace(session, "csv")).readline()


def test_play_ticks_one_step_each(canonical):
    session = copy.deepcopy(canonical)
    play = layout.toggle_play(False)
    assert play["playing"] is True and play["play"].value.endswith("Pause")
    values = asdict(canonical.controls)
    for stage in ("draft", "depth"):
        result = layout.tick(session, True, **values)
        assert panels.summary(session)["last_stage"] == stage and result["playing"] is True
    stopped = layout.tick(session, True, **dict(values, budget=0))  # an error stops the timer
    assert stopped["playing"] is False and stopped["play"].value.endswith("Play") and WARNING in stopped


def test_race_streams_and_is_lossless(models, plain):
    controls = Controls(**dict(SMALL, budget=8, max_new_tokens=5))
    snapshots = list(compare.race(models, controls, pace=False))
    assert len(snapshots) >= 2 and all(len(s) == 4 for s in snapshots)
    assert not any(lane["text"] for lane in snapshots[0])  # timing first, then the replay
    final = snapshots[-1]
    assert all(lane["finished"] for lane in final)
    assert len({lane["text"] for lane in final}) == 1  # T = 0: every method says the same
    assert "dartree" in figures.race_html(final)


def test_sweep_grid(canonical):
    session = copy.deepcopy(canonical)
    result = compare.sweep(session, "2", "4,8", PROMPT, 4, progress=lambda *a, **k: None)
    assert result["widths"] == [2] and result["budgets"] == [4, 8]
    assert all(v is not None and v > 0 for v in result["tau"][0] + result["speedup"][0])
    tau_fig, speed_fig, rows = compare.sweep_outputs(result, session.models.drafter_description)
    assert len(rows) == 2 and tau_fig.data and speed_fig.data
    with pytest.raises(UserError):
        compare.sweep(session, "2,x", "4", PROMPT, 6)


def test_figures_from_plain_values_only():
    for fig in (figures.supertree_figure(None), figures.mask_figure(None), figures.verify_figure(None, 7)):
        assert is_placeholder(fig) and fig.layout.annotations
    tree = {"texts": ["a", "b", "c"], "parents": [-1, 0, 1], "prefix_len": 5}
    fig = figures.mask_figure(tree)
    assert list(fig.data[0].z[2]) == [2, 1, 1, 1]  # prefix column (2) + ancestors + itself (1)
    def node(i, parent, depth, order=0, survived=True):
        return NodeView(id=i, parent=parent, depth=depth, token=i, text=str(i), score=0.0, order=order,
                        survived=survived)

    pos = figures.layered_layout([node(0, None, 0), node(1, 0, 1, order=1), node(2, 0, 1, order=0)])
    assert pos[2][1] > pos[1][1] and pos[0] == (0, 0.5)
    # children follow their parents' order (no crossing edges); a cut candidate gets less room
    pos = figures.layered_layout([node(0, None, 0), node(1, 0, 1, order=0), node(2, 0, 1, order=1),
                                  node(3, 2, 2, order=0), node(4, 1, 2, order=1), node(5, 1, 2, order=2, survived=False)])
    assert [pos[i][0] for i in range(6)] == [0, 1, 1, 2, 2, 2]
    assert pos[4][1] > pos[5][1] > pos[3][1]  # node 1's children (4, then the cut 5) above node 2's child 3
    assert pos[4][1] == pytest.approx(1 - 1.25 / 6) and pos[5][1] == pytest.approx(0.5)  # weights 2.5, 1, 2.5


RETRIEVAL_PROMPT = "Write the days of the week in order, then write them again in order."  # it repeats itself


def test_retrieval_round_marks_retrieved_nodes_and_counts_them(canonical, models):
    """Retrieval on: the prune adds the retrieved chains to the supertree (own markers), the captions count
    what each source proposed and how many were accepted, and the output stays plain decoding's. The prompt's
    answer repeats itself, so the context's n-grams and the successor table propose chains the drafter did not
    (a chain the drafter also proposed merges into the drafted nodes and keeps their marker)."""
    session = copy.deepcopy(canonical)
    values = dict(SMALL, prompt=RETRIEVAL_PROMPT, retrieval="both", max_new_tokens=24)
    for _ in range(8):  # rounds until one has retrieved nodes of its own in its supertree
        out = event(session, "round", **values)
        retrieved = [n for n in session.round.alive if n.source != "draft"]
        if retrieved or session.decoder.next_stage == "done":
            break
    assert retrieved, "no round proposed a retrieved node"
    assert {"supertree_fig", "prune_fig", "verify_fig"} <= set(out)
    title = out["prune_fig"].layout.title.text
    assert "ngram proposed" in title and "table proposed" in title
    symbols = list(out["supertree_fig"].data[-1].marker.symbol)
    assert sum(s != "circle" for s in symbols) == len(retrieved)
    assert "ngram:" in out["verify_fig"].layout.title.text and "accepted" in out["verify_fig"].layout.title.text
    out = event(session, "end", **values)
    target = models.target
    plain = generate(target, None, target.chat_ids(RETRIEVAL_PROMPT), DecodeSettings(method="ar", max_new_tokens=24))
    assert out["summary"]["output_ids"] == plain.token_ids and out["summary"]["settings"]["retrieval"] == "both"
    assert Controls.of(**values).settings().retrieval == "both"


def test_auto_budget_round_is_lossless_and_explains_its_choice(canonical, plain):
    """The checkbox runs dartree with the shipped calibration: B varies per round, capped by the slider."""
    session = copy.deepcopy(canonical)
    values = dict(SMALL, budget=40, auto_budget=True)
    out = event(session, "draft", **values)
    for _ in range(7):
        out = event(session, "depth", **values)
    out = event(session, "prune", **values)
    assert "auto budget chose B =" in out["status"] and 1 <= out["summary"]["tree_nodes"] <= 28
    out = event(session, "end", **values)
    assert out["summary"]["output_ids"] == plain
    assert Controls.of(**dict(values, auto_budget="true")).auto_budget
    assert not Controls.of(**dict(values, auto_budget="false")).auto_budget


def test_default_controls_are_the_measured_shape_and_auto_only_where_calibrated(models, monkeypatch):
    c = default_controls(models, max_new_tokens=12)
    assert (c.width, c.budget, c.auto_budget, c.max_new_tokens) == (CPU_DEFAULTS["width"], CPU_DEFAULTS["budget"],
                                                                    bool(CPU_DEFAULTS.get("auto_budget")), 12)
    # a device default with the auto budget keeps it only where a shipped calibration fits the models
    monkeypatch.setitem(CPU_DEFAULTS, "auto_budget", True)
    auto = default_controls(models, max_new_tokens=12)
    assert auto.auto_budget is True
    other = replace(models, drafter_name="some/other-drafter")  # no shipped calibration fits it
    assert default_controls(other).auto_budget is False
    session = canonical_session(models, auto)  # the shipped policy drives the first round
    assert session.decoder.settings.auto_budget and len(session.decoder.rounds) >= 1


def test_depth_bonus_control_reaches_the_settings_and_reads_the_device_default(canonical, models, plain, monkeypatch):
    assert Controls.of(depth_bonus="-0.5").settings().depth_bonus == -0.5
    assert default_controls(models).depth_bonus == CPU_DEFAULTS.get("depth_bonus", 0.0)
    monkeypatch.setitem(CPU_DEFAULTS, "depth_bonus", -0.25)
    assert default_controls(models).depth_bonus == -0.25
    session = copy.deepcopy(canonical)
    out = event(session, "prune", **dict(SMALL, depth_bonus=-0.5))
    assert out["summary"]["settings"]["depth_bonus"] == -0.5
    assert "depth bonus" in out["status"] and "-0.50 × depth" in out["rank_fig"].layout.yaxis.title.text
    out = event(session, "end", **dict(SMALL, depth_bonus=-0.5))
    assert out["summary"]["output_ids"] == plain  # T = 0: any ranking commits plain decoding's tokens


def test_continuity_control_reaches_the_settings_and_its_term_the_tree_hover(canonical, models, plain):
    assert Controls.of(continuity="0.3").settings().continuity == 0.3
    assert default_controls(models).continuity == CPU_DEFAULTS.get("continuity", 0.0)
    session = copy.deepcopy(canonical)
    out = event(session, "depth", **dict(SMALL, continuity=0.3))
    assert out["summary"]["settings"]["continuity"] == 0.3
    hovers = [h for trace in out["supertree_fig"].data for h in (trace.hovertext or ()) if h]
    assert any("n-gram continuity term" in h for h in hovers)
    out = event(session, "end", **dict(SMALL, continuity=0.3))
    assert out["summary"]["output_ids"] == plain  # T = 0: any ranking commits plain decoding's tokens


def test_layout_binds_controls_and_outputs_by_name(canonical, models):
    demo = layout.build_demo(models, initial=copy.deepcopy(canonical))
    endpoints = demo.get_api_info()["named_endpoints"]
    for api in ("/draft", "/depth", "/prune", "/verify", "/commit", "/step", "/next_round", "/run_to_end",
                "/reset", "/measure", "/race"):
        names = [p["parameter_name"] for p in endpoints[api]["parameters"]]
        assert sorted(names) == sorted(f.name for f in fields(Controls)), (api, names)
    draft = endpoints["/draft"]["parameters"]
    assert {p["parameter_name"]: p["parameter_default"] for p in draft}["prompt"] == canonical.controls.prompt
