"""The explorer's event functions on the real engine and the real default target (no browser)."""

import copy
import json
import statistics
import time

import plotly.graph_objects as go
import pytest

from dartree.engine import DecodeSettings, generate
from dartree.ui import app as ui
from dartree.ui import figures

pytestmark = [pytest.mark.real, pytest.mark.filterwarnings("ignore::UserWarning")]

PROMPT = "What is the capital of France?"
SMALL = dict(prompt=PROMPT, width=4, budget=12, depth=7, candidates=32, max_new_tokens=12)


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
    return ui.canonical_session(models, ui.Controls(max_new_tokens=12))


@pytest.fixture(scope="module")
def plain(models):
    """Plain decoding of PROMPT (T = 0): what every method must commit."""
    target = models.target
    return generate(target, None, target.chat_ids(PROMPT), DecodeSettings(method="ar", max_new_tokens=12)).token_ids


def outputs(result):
    """event() returns (state, *OUTPUTS): name them."""
    return dict(zip(ui.OUTPUTS, result[1:]))


def is_placeholder(fig: go.Figure) -> bool:
    return len(fig.data) == 0


def test_first_load_has_every_panel_filled(canonical, models):
    first = ui.full_render(canonical)
    assert set(ui.PANELS) <= set(first)
    for name in ui.PANELS:
        if name.endswith("_fig"):
            assert isinstance(first[name], go.Figure), name
            assert not is_placeholder(first[name]), f"{name} is empty on first load"
            assert first[name].layout.height, f"{name} has no explicit height"
    assert "ocean" in first["text"] or first["summary"]["output_ids"]
    assert first["summary"]["rounds"] == 1 and first["summary"]["next_stage"] == "draft"
    assert "ratio" in first["speed_md"]  # plain decoding was timed at start-up
    assert models.drafter_description.startswith("trained on")  # the shipped drafter is the default
    assert "UNTRAINED" not in ui._drafter_banner(models) and "trained on" in ui._drafter_banner(models)


def test_stepping_a_round_stage_by_stage(canonical, plain):
    session = copy.deepcopy(canonical)
    controls = ui.Controls(**SMALL)
    values = controls.values()
    out = outputs(ui.event(session, "draft", *values))
    assert "started again" in out["status"] and "Round 0" in out["status"]
    assert not is_placeholder(out["draft_fig"]) and is_placeholder(out["verify_fig"])
    timings = []
    for d in range(1, 8):
        t0 = time.perf_counter()
        out = outputs(ui.event(session, "depth", *values))
        timings.append(time.perf_counter() - t0)
        assert f"Depth {d}:" in out["status"]
        assert out["summary"]["depths_built"] == d
        assert not is_placeholder(out["supertree_fig"]) and not is_placeholder(out["correction_fig"])
        assert out["prune_fig"] is not None and "prune_fig" in out  # a skip marker, not a redraw
    print(f"depth step: median {statistics.median(timings):.3f} s, max {max(timings):.3f} s")
    assert statistics.median(timings) < 0.5
    assert out["summary"]["supertree_nodes"] == 4 * 7  # W per depth
    out = outputs(ui.event(session, "prune", *values))
    assert out["summary"]["tree_nodes"] == 12 and "12 best" in out["status"]
    out = outputs(ui.event(session, "verify", *values))
    assert out["summary"]["accepted"] is not None and "bonus" in out["status"]
    out = outputs(ui.event(session, "commit", *values))
    committed = out["summary"]["output_ids"]
    assert committed == plain[: len(committed)] and len(committed) >= 2
    assert out["summary"]["next_stage"] == "draft"


def test_sessions_are_independent(canonical, models):
    a, b = copy.deepcopy(canonical), copy.deepcopy(canonical)
    assert a.decoder is not canonical.decoder and a.decoder.target is models.target
    before = ui.summary(b)
    ui.event(a, "depth", *canonical.controls.values())
    assert ui.summary(a)["next_stage"] == "depth" and ui.summary(b) == before
    assert ui.summary(canonical)["next_stage"] == "draft"


@pytest.mark.parametrize("method", ["ddtree", "chain", "dartree-fixed"])
def test_other_methods_round(canonical, plain, method):
    session = copy.deepcopy(canonical)
    controls = ui.Controls(**dict(SMALL, method=method))
    out = outputs(ui.event(session, "round", *controls.values()))
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
    ]
    for controls, message in cases:
        out = outputs(ui.event(session, "draft", *ui.Controls(**controls).values()))
        assert out["status"].startswith("⚠️") and message in out["status"], out["status"]
        assert "Traceback" not in out["status"]
    values = ui.Controls(**SMALL).values()
    ui.event(session, "depth", *values)
    out = outputs(ui.event(session, "draft", *values))
    assert out["status"].startswith("⚠️") and "still being built" in out["status"]
    ui.event(session, "prune", *values)
    out = outputs(ui.event(session, "depth", *values))
    assert "already passed" in out["status"]


def test_run_to_end_trace_and_speed(canonical, plain):
    session = copy.deepcopy(canonical)
    controls = ui.Controls(**dict(SMALL, max_new_tokens=6))
    out = outputs(ui.event(session, "end", *controls.values()))
    s = out["summary"]
    assert s["next_stage"] == "done" and s["output_ids"] == plain[:6]
    assert "ratio" in out["speed_md"] and len(out["speed_fig"].data[0].x) == 2
    assert len(out["timeline_fig"].data) == 4
    out = outputs(ui.event(session, "depth", *controls.values()))
    assert "finished" in out["status"]
    data = json.loads(open(ui.export_trace(session, "json")).read())
    assert data["records"][0]["stage"] == "draft" and data["records"][-1]["stage"] == "commit"
    assert "stage" in open(ui.export_trace(session, "csv")).readline()


def test_play_ticks_one_step_each(canonical):
    session = copy.deepcopy(canonical)
    timer, button, playing = ui.toggle_play(False)
    assert playing is True and button.value.endswith("Pause")
    values = canonical.controls.values()
    for stage in ("draft", "depth"):
        result = ui.tick(session, True, *values)
        assert ui.summary(session)["last_stage"] == stage and result[-1] is True


def test_race_streams_and_is_lossless(models, plain):
    controls = ui.Controls(**dict(SMALL, budget=8, max_new_tokens=5))
    snapshots = list(ui.race(models, controls))
    assert len(snapshots) >= 2 and all(len(s) == 4 for s in snapshots)
    final = snapshots[-1]
    assert all(lane["finished"] for lane in final)
    assert len({lane["text"] for lane in final}) == 1  # T = 0: every method says the same
    assert "dartree" in figures.race_html(final)


def test_sweep_grid(canonical):
    session = copy.deepcopy(canonical)
    result = ui.sweep(session, "2", "4,8", PROMPT, 4, progress=lambda *a, **k: None)
    assert result["widths"] == [2] and result["budgets"] == [4, 8]
    assert all(v is not None and v > 0 for v in result["tau"][0] + result["speedup"][0])
    tau_fig, speed_fig, rows = ui.sweep_outputs(result, session.models.drafter_description)
    assert len(rows) == 2 and tau_fig.data and speed_fig.data
    with pytest.raises(ui.UserError):
        ui.sweep(session, "2,x", "4", PROMPT, 6)


def test_figures_from_plain_values_only():
    for fig in (figures.supertree_figure(None), figures.mask_figure(None), figures.verify_figure(None, 7)):
        assert is_placeholder(fig) and fig.layout.annotations
    tree = {"texts": ["a", "b", "c"], "parents": [-1, 0, 1], "prefix_len": 5}
    fig = figures.mask_figure(tree)
    assert list(fig.data[0].z[2]) == [2, 1, 1, 1]  # prefix column (2) + ancestors + itself (1)
    pos = figures.layered_layout([{"id": 0, "parent": None}, {"id": 1, "parent": 0, "order": 1},
                                  {"id": 2, "parent": 0, "order": 0}])
    assert pos[2][1] > pos[1][1] and pos[0] == (0, 0.5)


def test_auto_budget_round_is_lossless_and_explains_its_choice(canonical, plain):
    """The checkbox runs dartree with the shipped calibration: B varies per round, capped by the slider."""
    session = copy.deepcopy(canonical)
    values = ui.Controls(**dict(SMALL, budget=40, auto_budget=True)).values()
    out = outputs(ui.event(session, "draft", *values))
    for _ in range(7):
        out = outputs(ui.event(session, "depth", *values))
    out = outputs(ui.event(session, "prune", *values))
    assert "auto budget chose B =" in out["status"] and 1 <= out["summary"]["tree_nodes"] <= 28
    out = outputs(ui.event(session, "end", *values))
    assert out["summary"]["output_ids"] == plain
    assert ui.Controls.of(*values).auto_budget and not ui.Controls.of(*values[:-1], "false").auto_budget


def test_default_controls_are_the_measured_shape_and_auto_only_where_calibrated(models, monkeypatch):
    from dataclasses import replace

    from dartree.defaults import CPU_DEFAULTS

    c = ui.default_controls(models, max_new_tokens=12)
    assert (c.width, c.budget, c.auto_budget, c.max_new_tokens) == (CPU_DEFAULTS["width"], CPU_DEFAULTS["budget"],
                                                                    bool(CPU_DEFAULTS.get("auto_budget")), 12)
    # a device default with the auto budget keeps it only where a shipped calibration fits the models
    monkeypatch.setitem(CPU_DEFAULTS, "auto_budget", True)
    auto = ui.default_controls(models, max_new_tokens=12)
    assert auto.auto_budget is True
    other = replace(models, drafter_name="some/other-drafter")  # no shipped calibration fits it
    assert ui.default_controls(other).auto_budget is False
    session = ui.canonical_session(models, auto)  # the shipped policy drives the first round
    assert session.decoder.settings.auto_budget and len(session.decoder.rounds) >= 1
