"""Summarise scripts/device_check.sh's outputs in OUT into OUT/device-check.json (and print it).

Reads OUT/lossless.xml (pytest's junit report) and OUT/bench-<dtype>.json (`python -m dartree bench --out`).
Exits 1 when a lossless test failed or an fp32 run's tokens differ from plain decoding: those are the
exactness claims; bf16's "same as ar" count is reported, not required.

    python scripts/device_summary.py OUT [--seconds N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def lossless_summary(path: Path) -> dict:
    if not path.is_file():
        return {"ran": False}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"ran": True, **counts, "passed": counts["tests"] > 0 and counts["failures"] + counts["errors"] == 0}


def bench_summary(path: Path) -> dict:
    results = json.loads(path.read_text())
    rows = [{"config": " ".join(x for x in (r["method"], r["width"] and f"W={r['width']}",
                                            r["budget"] and f"B={r['budget']}",
                                            r.get("depth_bonus") is not None and f"bonus={r['depth_bonus']:g}") if x),
             "tau": round(r["tau"], 3), "tokens_per_second": round(r["tokens_per_second"], 2),
             "speedup_vs_ar": round(r["speedup_vs_ar"], 3), "median_speedup": round(r["median_speedup"], 3),
             "same_as_ar": f"{r['identical_to_ar']}/{r['n_prompts']}"} for r in results["rows"]]
    return {"dtype": results["settings"].get("dtype"), "n_prompts": results["settings"]["n_prompts"],
            "max_new_tokens": results["settings"]["max_new_tokens"], "machine": results["machine"],
            "command": results.get("command"), "all_same_as_ar": all(
                r["identical_to_ar"] == r["n_prompts"] for r in results["rows"]), "rows": rows,
            "t_ar": results.get("cost_curve", {}).get("t_ar")}


def summarise(out: Path, seconds: float | None = None) -> dict:
    benches = {p.stem.removeprefix("bench-"): bench_summary(p) for p in sorted(out.glob("bench-*.json"))}
    machine = next(iter(benches.values()))["machine"] if benches else {}
    summary = {"date": datetime.date.today().isoformat(), "gpu": machine.get("gpu"), "torch": machine.get("torch"),
               "seconds": seconds, "lossless_tests_fp32": lossless_summary(out / "lossless.xml"), "bench": benches}
    summary["ok"] = bool(summary["lossless_tests_fp32"].get("passed")) and "fp32" in benches \
        and benches["fp32"]["all_same_as_ar"]
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=None, help="the whole check's wall time")
    args = parser.parse_args(argv)
    summary = summarise(args.out, args.seconds)
    (args.out / "device-check.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
