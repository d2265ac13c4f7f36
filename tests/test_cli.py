"""The CLI on the real target: JSON lines of `generate`, the results file of `bench`."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real

GEN_KEYS = {"prompt_index", "method", "text", "token_ids", "new_tokens", "rounds", "tau", "decode_seconds",
            "tokens_per_second"}
ROW_KEYS = {"method", "width", "budget", "tau", "tokens_per_second", "speedup_vs_ar", "n_prompts", "new_tokens"}


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
    run("bench", "--limit", "2", "--methods", "ar,chain,ddtree,dartree-fixed,dartree", "--budgets", "8",
        "--widths", "4", "--max-new-tokens", "6", "--drafter", "random", "--no-progress", "--out", str(out_file))
    results = json.loads(out_file.read_text())
    methods = [r["method"] for r in results["rows"]]
    assert methods == ["ar", "chain", "ddtree", "dartree-fixed", "dartree"]
    for row in results["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["n_prompts"] == 2 and row["identical_to_ar"] == 2
    assert results["rows"][0]["speedup_vs_ar"] == 1.0
    assert "machine" in results
