"""The temperature axis of the defaults: bands, the shape that follows T, and the app's controls following it."""

from types import SimpleNamespace

import pytest
import torch

from dartree import defaults
from dartree.defaults import CPU_DEFAULTS, TEMPERATURE_BANDS, default_shape, score_temperature, temperature_band
from dartree.engine import DecodeSettings
from dartree.ui.session import SHAPE_CONTROLS, default_controls, follow_temperature

MODELS = SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu")), drafter_name="default")


def test_bands_cover_every_temperature_and_greedy_is_its_own():
    assert [temperature_band(t) for t in (0.0, 0.01, 0.65, 0.66, 1.0, 2.0)] == [0, 1, 1, 2, 2, 2]
    assert len(defaults.CPU_SAMPLING_SHAPES) == len(TEMPERATURE_BANDS)
    assert default_shape("cpu", 0.0) == CPU_DEFAULTS  # greedy: the T = 0 shape as measured
    assert score_temperature(0.0) == 0.0 and score_temperature(0.8) > 0


@pytest.fixture
def sampling_shape(monkeypatch):
    """A distinct shape for the top band, so that following it is visible."""
    shapes = list(defaults.CPU_SAMPLING_SHAPES)
    shapes[-1] = {"width": 7, "budget": 13, "depth_bonus": -0.05}
    monkeypatch.setattr(defaults, "CPU_SAMPLING_SHAPES", tuple(shapes))


def test_settings_resolve_the_shape_of_their_temperature(sampling_shape):
    hot = DecodeSettings(temperature=0.9).resolved("cpu")
    assert (hot.width, hot.budget, hot.depth_bonus) == (7, 13, -0.05)
    cold = DecodeSettings(temperature=0.0).resolved("cpu")
    assert (cold.width, cold.budget, cold.depth_bonus) == (CPU_DEFAULTS["width"], CPU_DEFAULTS["budget"],
                                                           CPU_DEFAULTS["depth_bonus"])
    explicit = DecodeSettings(temperature=0.9, width=3, budget=5).resolved("cpu")
    assert (explicit.width, explicit.budget) == (3, 5)  # an explicit value wins
    assert default_shape("cuda", 0.9) == default_shape("cuda", 0.0)  # the GPU keeps the reference's shape


def test_the_app_shape_follows_the_temperature_until_the_visitor_touches_it(sampling_shape):
    start = default_controls(MODELS)
    untouched = {k: getattr(start, k) for k in SHAPE_CONTROLS}
    hot = follow_temperature(MODELS, 0.9, **untouched)
    assert (hot["width"], hot["budget"], hot["depth_bonus"]) == (7, 13, -0.05)
    assert follow_temperature(MODELS, 0.0, **hot) == untouched  # and back
    touched = dict(untouched, width=5)
    assert follow_temperature(MODELS, 0.9, **touched) == touched
    assert follow_temperature(MODELS, 0.9, **{k: str(v) for k, v in untouched.items()}) == hot  # page values as text


def test_an_auto_budget_calibration_serves_its_temperature_band_only(tmp_path):
    """P(on path | score) changes with the temperature, so a policy file answers for its own band."""
    import json

    from dartree.budget import SHIPPED_POLICY, policy_for
    from dartree.errors import UserError

    data = json.loads(SHIPPED_POLICY.read_text())
    target = SimpleNamespace(name=data["target"], device=torch.device(data["device"]))
    assert policy_for(target, data["drafter"], SHIPPED_POLICY, 0.0).rates == data["rates"]  # shipped: greedy
    with pytest.raises(UserError, match="--temperature 0.8"):
        policy_for(target, data["drafter"], SHIPPED_POLICY, 0.8)
    hot = tmp_path / "auto-budget-hot.json"
    hot.write_text(json.dumps(dict(data, temperature=0.9, rates=[0.5 * r for r in data["rates"]])))
    assert policy_for(target, data["drafter"], hot, 0.8).rates[-1] == 0.5 * data["rates"][-1]
    with pytest.raises(UserError, match="temperature 0.9"):
        policy_for(target, data["drafter"], hot, 0.0)


def test_the_verify_caption_explains_why_sampling_accepts_less():
    from dartree.ui.narrate import sampling_note

    assert sampling_note(DecodeSettings(temperature=0.0).resolved("cpu")) == ""
    note = sampling_note(DecodeSettings(temperature=0.8).resolved("cpu"))
    assert "draws one from its own distribution" in note and "fewer tokens are accepted" in note
    assert f"temperature {score_temperature(0.8):g}" in note  # the scores' own temperature is named
