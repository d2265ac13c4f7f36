"""The machine's reference: the committed `bench` result for the shape on show, from assets/benchmarks/.

The Explorer shows it beside its live ratio, so that one prompt's figure is read against a mean over many.
A result matches when it was measured on the same kind of device, at the same temperature and candidates
count, for the same method and the knobs that method has (dartree.methods); among matches a result measured
with the drafter on show wins (the bench JSON's `drafter` line against the loaded drafter's description), then
the newest file, then the one with more prompts. Nothing is hard-coded: a new bench JSON there is picked up.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from functools import lru_cache
from pathlib import Path

from ..methods import METHODS

BENCH_DIR = Path(__file__).resolve().parents[2] / "assets" / "benchmarks"


def _file_date(path: Path) -> str:
    """The date the file was committed (git), else its modification date."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or dt.date.fromtimestamp(path.stat().st_mtime).isoformat()


@lru_cache(maxsize=1)
def bench_results(root: Path = BENCH_DIR) -> tuple[dict, ...]:
    """Every bench result under `root` (files with rows measured against plain decoding), with its date."""
    found = []
    for path in sorted(root.rglob("*.json")):
        if "archive" in path.relative_to(root).parts:
            continue  # superseded results, kept for the docs that cite them
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        rows = data.get("rows") if isinstance(data, dict) else None
        if not rows or "speedup_vs_ar" not in rows[0] or "machine" not in data:
            continue  # a sweep (predicted speeds) or another kind of file
        if "--prompt-file" in data.get("command", ""):
            continue  # measured on other prompts than the dev bench the reference stands for
        found.append({"file": str(path.relative_to(root.parents[1])), "rows": rows,
                      "weights": data["machine"].get("weights") or _legacy_weights(data["machine"]),
                      "date": data.get("date") or _file_date(path), "settings": data.get("settings", {}),
                      "device": str(data["machine"].get("device", "")), "command": data.get("command", ""),
                      "drafter": str(data.get("drafter", ""))})
    return tuple(found)


def _legacy_weights(machine: dict) -> str:
    """The weight path of a bench JSON written before `machine.weights` existed (2026-12-05), read from its
    linear-path description: the two paths run plain decoding at different speeds, so a speedup measured
    on one is not the reference for the other."""
    return "gguf" if "GGUF" in machine.get("cpu_linears", "") else "fp32"


def _matches(row: dict, settings) -> bool:
    method = METHODS.get(settings.method)
    if method is None or row["method"] != settings.method:
        return False
    if "W" in method.knobs and row.get("width") != settings.width:
        return False
    budget = "auto" if settings.auto_budget else settings.budget
    if "B" in method.knobs and row.get("budget") != budget:
        return False
    if (row.get("retrieval") or "none") != (getattr(settings, "retrieval", None) or "none"):
        return False  # rows from before retrieval existed ran without it
    if abs((row.get("continuity") or 0.0) - (getattr(settings, "continuity", None) or 0.0)) > 1e-9:
        return False  # rows from before the n-gram continuity term existed ran without it
    if method.prunes:  # rows from before the depth bonus existed (None) ran without one
        return abs((row.get("depth_bonus") or 0.0) - settings.depth_bonus) < 1e-9
    return True


def bench_reference(settings, device_type: str, results=None, weights: str | None = None,
                    drafter: str | None = None) -> dict | None:
    """The best-matching bench row for these (resolved) settings on this kind of device (and CPU weight path,
    `weights`: gguf or fp32, None: any), or None. `drafter` (the loaded drafter's description) ranks the
    results measured with it first; the reference's `same_drafter` says whether it is one of them (True
    when `drafter` is None)."""
    if settings.method == "ar":
        return None
    best = None
    for res in bench_results() if results is None else results:
        s = res["settings"]
        if not res["device"].startswith(device_type) or float(s.get("temperature", 0.0)) != settings.temperature:
            continue
        if s.get("candidates") not in (None, settings.candidates):
            continue
        if weights is not None and res.get("weights", "fp32") != weights:
            continue
        for row in res["rows"]:
            if _matches(row, settings):
                same = drafter is None or res.get("drafter") == drafter
                ref = {"speedup": row["speedup_vs_ar"], "tau": row["tau"], "n_prompts": row["n_prompts"],
                       "max_new_tokens": s.get("max_new_tokens"), "date": res["date"],
                       "file": res["file"], "command": res["command"], "same_drafter": same}
                rank = (same, ref["date"], ref["n_prompts"])
                if best is None or rank > (best["same_drafter"], best["date"], best["n_prompts"]):
                    best = ref
    return best
