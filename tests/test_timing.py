"""The Explorer, the Race and `bench` reach the one timing function, `dartree.timing.alternate`, and show what it
returns. Structural, not timed: a spy wraps the function and rewrites every run's decode seconds so that each
method runs at exactly twice plain decoding's speed; each of the three must then report 2.00x."""

import inspect
from dataclasses import asdict

import pytest

from dartree import timing
from dartree.bench import parse_configs, run_bench
from dartree.engine import DecodeSettings
from dartree.ui import compare, panels
from dartree.ui.session import DEFAULT_PROMPT, Controls, Session, event

pytestmark = [pytest.mark.real, pytest.mark.filterwarnings("ignore::UserWarning")]

TOKENS = 17  # at least panels.MIN_RATIO_TOKENS decoded tokens, so the Explorer shows a ratio
PLAIN_TPS, METHOD_TPS = 10.0, 20.0


@pytest.fixture(scope="module")
def models():
    import torch

    from dartree.models.loading import load_models

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_models()
    torch.set_num_threads(before)


@pytest.fixture
def spy(monkeypatch):
    """Calls of timing.alternate by calling module, with every run's speed set to PLAIN_TPS or METHOD_TPS."""
    calls, real = [], timing.alternate

    def alternate(target, drafter, prompt_ids, settings, *args, **kwargs):
        calls.append((inspect.stack()[1].frame.f_globals["__name__"], [s.method for s in settings]))
        runs = real(target, drafter, prompt_ids, settings, *args, **kwargs)
        for s, per in zip(settings, runs):
            for r in per:
                r.decode_seconds = (r.new_tokens - 1) / (PLAIN_TPS if s.method == "ar" else METHOD_TPS)
        return runs

    monkeypatch.setattr(timing, "alternate", alternate)
    return calls


def test_bench_explorer_and_race_report_what_the_one_timing_function_measured(models, spy):
    results = run_bench(models, [DEFAULT_PROMPT], parse_configs("dartree:W=4:B=8"),
                        DecodeSettings(max_new_tokens=TOKENS), progress=False, warmup_tokens=2)
    assert ("dartree.bench", ["ar", "dartree"]) in spy
    assert results["rows"][1]["speedup_vs_ar"] == pytest.approx(2.0)

    spy.clear()
    session = Session(models)
    values = asdict(Controls(max_new_tokens=TOKENS))
    out = event(session, "end", **values)
    assert ("dartree.ui.session", ["ar", "dartree"]) in spy
    assert session.measured()["ratio"] == pytest.approx(2.0) and "speed ratio 2.00×" in out["speed_md"]
    assert panels.speed_md(session) == out["speed_md"]

    spy.clear()
    lanes = list(compare.race(models, Controls(max_new_tokens=TOKENS), pace=False))[-1]
    assert spy == [("dartree.ui.compare", list(compare.RACE_METHODS))]
    assert all(lane["ratio"] == pytest.approx(2.0) for lane in lanes if lane["method"] != "ar")
