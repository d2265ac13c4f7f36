"""scripts/device_check.sh cannot run here (no GPU): its shell parses, the commands it runs are ones the CLI
and pytest accept, and its summary is right about passes and failures. The whole script runs on the CPU in
a tiny setting in the slow suite."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dartree.bench import parse_configs
from dartree.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import device_summary  # noqa: E402


def dry_run(**env) -> list[list[str]]:
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return [shlex.split(line[2:]) for line in out.stderr.splitlines() if line.startswith("+ ")]


def test_the_script_parses_and_its_commands_are_valid(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    commands = dry_run(OUT=str(tmp_path))
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
    tests, *benches, summary = commands
    assert tests[:2] == ["env", "DARTREE_TEST_DEVICE=cuda"] and "tests/test_lossless.py" in tests
    dtypes = []
    for cmd in benches:
        assert cmd[1:4] == ["-m", "dartree", "bench"]
        args = build_parser().parse_args(cmd[3:])  # flags the CLI really has
        assert args.device == "cuda" and args.limit == 10 and args.spread and args.max_new_tokens == 128
        configs = parse_configs(args.configs)
        assert [c.label for c in configs] == ["ar", "dartree W=12 B=64 bonus=-0.2", "dartree W=4 B=8"]
        dtypes.append(args.dtype)
        assert args.out == str(tmp_path / f"bench-{args.dtype}.json")
    assert dtypes == ["fp32", "bf16"]
    assert summary[1] == "scripts/device_summary.py" and summary[2] == str(tmp_path)


def write_outputs(folder: Path, failures: int = 0, fp32_same: int = 2):
    (folder / "lossless.xml").write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="9" failures="{failures}" errors="0" '
        'skipped="0"></testsuite></testsuites>')
    for dtype, same in (("fp32", fp32_same), ("bf16", 1)):
        rows = [{"method": "ar", "width": None, "budget": None, "depth_bonus": None, "tau": 1.0,
                 "tokens_per_second": 50.0, "speedup_vs_ar": 1.0, "median_speedup": 1.0, "identical_to_ar": 2,
                 "n_prompts": 2},
                {"method": "dartree", "width": 12, "budget": 64, "depth_bonus": -0.2, "tau": 3.1,
                 "tokens_per_second": 120.0, "speedup_vs_ar": 2.4, "median_speedup": 2.3, "identical_to_ar": same,
                 "n_prompts": 2}]
        (folder / f"bench-{dtype}.json").write_text(json.dumps({
            "rows": rows, "settings": {"dtype": dtype, "n_prompts": 2, "max_new_tokens": 128},
            "machine": {"gpu": "NVIDIA H200", "torch": "2.x"}, "command": "python -m dartree bench"}))


@pytest.mark.parametrize("failures,fp32_same,ok", [(0, 2, True), (1, 2, False), (0, 1, False)])
def test_summary_requires_the_lossless_tests_and_fp32_exactness_not_bf16(tmp_path, failures, fp32_same, ok):
    write_outputs(tmp_path, failures, fp32_same)
    assert device_summary.main([str(tmp_path), "--seconds", "300"]) == (0 if ok else 1)
    summary = json.loads((tmp_path / "device-check.json").read_text())
    assert summary["ok"] is ok and summary["gpu"] == "NVIDIA H200" and summary["seconds"] == 300
    assert summary["lossless_tests_fp32"]["tests"] == 9
    assert summary["bench"]["bf16"]["rows"][1] == {
        "config": "dartree W=12 B=64 bonus=-0.2", "tau": 3.1, "tokens_per_second": 120.0, "speedup_vs_ar": 2.4,
        "median_speedup": 2.3, "same_as_ar": "1/2"}
    assert not summary["bench"]["bf16"]["all_same_as_ar"]  # reported, not required


def test_summary_without_outputs_is_not_ok(tmp_path):
    assert device_summary.main([str(tmp_path)]) == 1


@pytest.mark.slow
@pytest.mark.real
def test_the_whole_check_runs_on_the_cpu_in_a_tiny_setting(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "DTYPES": "fp32", "PROMPTS": "1", "MAX_NEW": "4",
           "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=1500, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "device-check.json").read_text())
    assert summary["ok"] and summary["lossless_tests_fp32"]["passed"]
    assert summary["bench"]["fp32"]["dtype"] == "fp32" and len(summary["bench"]["fp32"]["rows"]) == 3
