"""The CLI on the real target: JSON lines of `generate`, the results file of `bench`."""

import json
import subprocess
import sys

import pytest

from dartree.defaults import CPU_DEFAULTS

pytestmark = pytest.mark.real

GEN_KEYS = {"prompt_index", "method", "text", "token_ids", "new_tokens", "rounds", "tau", "decode_seconds",
            "tokens_per_second"}
ROW_KEYS = {"method", "width", "budget", "tau", "tokens_per_second", "speedup_vs_ar", "n_prompts", "new_tokens",
            "e2e_tokens_per_second", "e2e_speedup_vs_ar", "prefill_seconds", "prefill_vs_ar"}


def run(*args, timeout=600):
    out = subprocess.run([sys.executable, "-m", "dartree", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out


def test_generate_json_lines_match_plain_decoding(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Say hello."}) + "\n" + json.dumps({"prompt": "Count to five."}) + "\n")
    common = ["generate", "--prompt-file", str(prompts), "--json", "--max-new-tokens", "10", "--drafter", "random"]
    ar = [json.loads(l) for l in run(*common, "--method", "ar").stdout.splitlines()]
    dt = [json.loads(l) for l in run(*common, "--method", "dartree", "--width", "4", "--budget", "8").stdout.splitlines()]
    assert len(ar) == len(dt) == 2
    for a, d in zip(ar, dt):
        assert set(a) == set(d) == GEN_KEYS
        assert a["token_ids"] == d["token_ids"] and a["tau"] == 1.0
        assert d["new_tokens"] == len(d["token_ids"]) <= 10


def test_bench_writes_rows_against_plain_decoding(tmp_path):
    out_file = tmp_path / "results.json"
    out = run("bench", "--limit", "2", "--spread", "--methods", "ar,chain,ddtree,dartree-fixed,dartree", "--budgets",
              "8", "--widths", "4", "--max-new-tokens", "6", "--drafter", "random", "--no-progress", "--out", str(out_file))
    results = json.loads(out_file.read_text())
    methods = [r["method"] for r in results["rows"]]
    assert methods == ["ar", "chain", "ddtree", "dartree-fixed", "dartree"]
    for row in results["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["n_prompts"] == 2 and row["identical_to_ar"] == 2
        # --spread takes the dev file's first and last prompts: two sources, one prompt each
        per = row["by_source"]
        assert sorted(per) == ["gsm8k-test", "self-instruct-user-oriented"]
        assert all(v["n_prompts"] == 1 and v["tau"] >= 1.0 for v in per.values())
    assert results["rows"][0]["speedup_vs_ar"] == results["rows"][0]["e2e_speedup_vs_ar"] == 1.0
    assert "e2e tok/s" in out.stdout
    assert all(v["tau"] == 1.0 and v["speedup_vs_ar"] == 1.0 for v in results["rows"][0]["by_source"].values())
    assert "tau by prompt source" in out.stdout
    assert "machine" in results
    assert results["settings"]["dtype"] == "fp32" and "dtype fp32" in out.stdout
    assert [r["depth_bonus"] for r in results["rows"]] == [None, None, None, None, CPU_DEFAULTS["depth_bonus"]]


def test_bench_configs_with_auto_budget_and_cost_curve(tmp_path):
    """--configs picks exact configurations; B=auto uses a calibration file; --cost-curve adds t_verify(N)."""
    from dartree.budget import AutoBudget

    policy = tmp_path / "policy.json"
    AutoBudget([-4.0, -1.0], [0.0, 0.2, 0.6], 0.03, {1: 0.08, 16: 0.14, 64: 0.4}, 64).save(
        policy, extra={"target": "smollm2-135m", "drafter": "random", "device": "cpu"})
    out_file = tmp_path / "results.json"
    run("bench", "--limit", "1", "--configs", "chain,dartree:W=4:B=8,dartree:W=4:B=auto", "--max-new-tokens", "6",
        "--drafter", "random", "--no-progress", "--budget-policy", str(policy), "--cost-curve", "--out", str(out_file),
        "--plot", str(tmp_path / "bench.html"))
    assert "share of a round" in (tmp_path / "bench.html").read_text()
    results = json.loads(out_file.read_text())
    assert [(r["method"], r["width"], r["budget"]) for r in results["rows"]] == [
        ("ar", None, None), ("chain", None, None), ("dartree", 4, 8), ("dartree", 4, "auto")]
    assert all(r["identical_to_ar"] == 1 for r in results["rows"])
    curve = results["cost_curve"]
    assert {"1", "9", "257"} <= set(curve["verify_seconds"]) and curve["draft_seconds"] > 0
    assert curve["commit_seconds"] > 0 and results["command"].startswith("python -m dartree bench")


def test_auto_budget_for_other_models_is_a_clear_error(tmp_path):
    from dartree.budget import AutoBudget

    policy = tmp_path / "policy.json"
    AutoBudget([-1.0], [0.1, 0.5], 0.03, {1: 0.08, 64: 0.4}, 64).save(
        policy, extra={"target": "smollm2-135m", "drafter": "default", "device": "cpu"})
    out = subprocess.run([sys.executable, "-m", "dartree", "bench", "--limit", "1", "--configs", "dartree:W=2:B=auto",
                          "--drafter", "random", "--budget-policy", str(policy)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "calibrated for drafter 'default'" in out.stderr


@pytest.mark.slow
def test_sweep_replays_every_config_and_writes_json_plot_and_policy(tmp_path):
    out, plot, policy = tmp_path / "sweep.json", tmp_path / "sweep.html", tmp_path / "auto.json"
    run("sweep", "--drafter", "random", "--limit", "2", "--spread", "--max-new-tokens", "8", "--budgets", "8,16",
        "--widths", "2", "--calibrate-out", str(policy), "--calibrate-prompts", "1", "--out", str(out),
        "--plot", str(plot), "--no-progress", timeout=900)
    results = json.loads(out.read_text())
    got = [(r["method"], r["width"], r["budget"]) for r in results["rows"]]
    assert got == [("ar", None, None), ("chain", None, None), ("ddtree", None, 8), ("ddtree", None, 16),
                   ("dartree-fixed", None, 8), ("dartree-fixed", None, 16), ("dartree", 2, 8), ("dartree", 2, 16),
                   ("dartree", 2, "auto")]
    for r in results["rows"]:
        assert r["tau"] >= 1.0 and r["predicted_speedup"] > 0
    assert [t["budget"] for t in results["tree_build"]] == [16, 32, 64, 128, 256, 512, 1024]
    assert "<html" in plot.read_text().lower()
    saved = json.loads(policy.read_text())
    assert saved["drafter"] == "random" and len(saved["rates"]) == len(saved["edges"]) + 1


def test_generate_default_budget_falls_back_to_fixed_b_for_an_uncalibrated_drafter(monkeypatch, capsys):
    """A device default with the auto budget (calibrated for the shipped drafter only) gives another drafter
    its fixed B instead of an error; `generate` reads the same `shape_for`. The CLI runs in this process, so
    the patched default reaches it."""
    from dartree.cli import main
    from dartree.budget import shape_for
    from dartree.defaults import CPU_DEFAULTS
    from dartree.models.loading import load_models

    monkeypatch.setitem(CPU_DEFAULTS, "auto_budget", True)
    assert shape_for(load_models("smollm2-135m", "default"))["auto_budget"] is True
    assert shape_for(load_models("smollm2-135m", "random"))["auto_budget"] is False
    assert main(["generate", "--prompt", "Say hello.", "--json", "--max-new-tokens", "4", "--drafter", "random"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["new_tokens"] == len(line["token_ids"]) <= 4


def test_depth_bonus_flag_defaults_per_device_and_is_validated(tmp_path):
    from dartree.defaults import default_shape
    from dartree.engine import DecodeSettings

    assert DecodeSettings().resolved("cuda").depth_bonus == -0.2  # the reference's
    assert DecodeSettings().resolved("cpu").depth_bonus == default_shape("cpu")["depth_bonus"]
    assert DecodeSettings(depth_bonus=-0.5).resolved("cpu").depth_bonus == -0.5  # an explicit value wins
    out = subprocess.run([sys.executable, "-m", "dartree", "generate", "--prompt", "Hi", "--drafter", "random",
                          "--depth-bonus", "0.3", "--max-new-tokens", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "depth bonus must be between -1.0 and 0" in out.stderr


def test_bench_table_says_when_same_as_ar_is_not_guaranteed():
    from dartree.bench import format_table

    row = {"method": "ar", "width": None, "budget": None, "depth_bonus": None, "tau": 1.0, "tokens_per_second": 9.0,
           "speedup_vs_ar": 1.0, "identical_to_ar": 3, "n_prompts": 3, "e2e_tokens_per_second": 8.0,
           "e2e_speedup_vs_ar": 1.0, "prefill_vs_ar": 1.0,
           "stage_share": {"draft": 0.0, "tree": 0.0, "verify": 1.0, "commit": 0.0}}
    assert "not guaranteed" not in format_table({"rows": [row], "settings": {"dtype": "fp32"}})
    assert "not guaranteed in bf16" in format_table({"rows": [row], "settings": {"dtype": "bf16"}})


def test_the_api_default_is_the_clis(real_models, monkeypatch):
    """`generate` with DecodeSettings() resolves the same W, B, C and depth bonus as `python -m dartree
    generate` uses (both: the device's measured defaults, dartree.defaults), and decodes the same tokens."""
    import dartree.engine
    from dartree.cli import main
    from dartree.defaults import default_shape
    from dartree.engine import DecodeSettings, generate

    used = []
    real = dartree.engine.generate

    def spy(target, drafter, prompt_ids, settings=None, budget_policy=None):
        res = real(target, drafter, prompt_ids, settings, budget_policy)
        used.append(res)
        return res

    monkeypatch.setattr(dartree.engine, "generate", spy)
    assert main(["generate", "--prompt", "Say hello.", "--json", "--max-new-tokens", "6", "--drafter", "random"]) == 0
    cli = used[0]
    target = real_models.target
    api = generate(target, real_models.drafter, target.chat_ids("Say hello."), DecodeSettings(max_new_tokens=6))
    shape = default_shape(target.device.type)
    keys = ("method", "width", "budget", "candidates", "depth_bonus", "auto_budget", "depth")
    assert {k: api.settings[k] for k in keys} == {k: cli.settings[k] for k in keys}
    assert (api.settings["width"], api.settings["budget"], api.settings["depth_bonus"]) == \
        (shape["width"], shape["budget"], shape["depth_bonus"])
    assert api.token_ids == cli.token_ids
