"""Bad input gives a clear message: empty prompt, W/B/C/D out of range, unknown model or method."""

import subprocess
import sys

import pytest

from dartree.engine import Decoder, DecodeSettings
from dartree.errors import UserError
from dartree.models.target import resolve_target_path
from tiny import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def models():
    t = tiny_target()
    return t, tiny_drafter(t)


@pytest.mark.parametrize("settings,message", [
    (DecodeSettings(width=0), "width W"), (DecodeSettings(width=65), "width W"),
    (DecodeSettings(budget=0), "budget B"), (DecodeSettings(budget=5000), "budget B"),
    (DecodeSettings(candidates=0), "candidates C"), (DecodeSettings(candidates=65), "candidates C"),
    (DecodeSettings(depth=0), "depth D"), (DecodeSettings(depth=6), "depth D"),
    (DecodeSettings(temperature=-1), "temperature"), (DecodeSettings(top_p=0), "top-p"),
    (DecodeSettings(max_new_tokens=0), "max new tokens"), (DecodeSettings(method="beam"), "unknown method"),
])
def test_out_of_range_settings_are_refused(models, settings, message):
    target, drafter = models
    with pytest.raises(UserError, match=message):
        Decoder(target, drafter, [1, 2, 3], settings)


def test_empty_and_too_long_prompts_are_refused(models):
    target, drafter = models
    with pytest.raises(UserError, match="empty"):
        Decoder(target, drafter, [], DecodeSettings())
    with pytest.raises(UserError, match="exceeds the target's context"):
        Decoder(target, drafter, [5] * 4090, DecodeSettings(max_new_tokens=16))


def test_tree_methods_need_a_drafter(models):
    with pytest.raises(UserError, match="needs a drafter"):
        Decoder(models[0], None, [1, 2], DecodeSettings(method="dartree"))


def test_unknown_target_is_refused():
    with pytest.raises(UserError, match="unknown target"):
        resolve_target_path("no-such-model")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dartree", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["generate", "--prompt", "   "], "the prompt is empty"),
    (["generate", "--prompt", "hi", "--method", "beam"], "unknown method"),
    (["generate", "--prompt", "hi", "--target", "no-such-model"], "unknown target"),
    (["bench", "--methods", "ar,beam"], "unknown method"),
    (["generate", "--prompt-file", "/no/such/file.jsonl"], "does not exist"),
])
def test_cli_reports_bad_input_without_a_traceback(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
