"""Drafter capacity at one training budget (issue #21, item 4): backbone depth and the GRU's width.

Every variant trains the same number of steps on the same data and seed. By default each starts from the shipped
drafter (2 layers, GRU 256): the baseline fine-tunes it as it is, the others first grow it without changing what it
computes (`dartree/train/grow.py`: a zero-output third layer, zero-read GRU units), so the legs differ only in
capacity and a thousand steps a variant already separate them; `--init-from none` trains every variant from
scratch instead (from scratch, held-out chain τ is about 1.5 after 1,000 steps: many thousand steps a variant are
needed). Then one replay sweep on the 30 dev prompts gives each variant's tree τ (dartree W = 4, B = 8, no
retrieval: the drafter alone), its measured drafter pass (t_draft) and plain decoding's step (t_AR), so the table
can rank the variants by dev τ per unit of drafter cost. Every step skips what is done (the trainer resumes from
its checkpoint, a variant with a sweep JSON is finished), so the job runs in legs and survives a stop:

    setsid nohup .venv/bin/python scripts/capacity.py --steps 1000 --out runs/capacity > capacity.log 2>&1 &

t_draft is a timing: run the job with nothing else on the machine. The features of the data it names must
exist (`python -m dartree.train --preset smollm2-cpu-v2 --stage data --features-only --max-prompts 1536`, and
the same for smollm2-cpu with --max-prompts 1536).
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
PRESET = "smollm2-cpu-v2"
# variant name -> the trainer arguments that make it (the preset's drafter: 2 layers, GRU 256)
VARIANTS = {
    "2L-gru256": [],
    "3L-gru256": ["--drafter-layers", "3"],
    "2L-gru512": ["--gru-hidden", "512"],
}
SWEEP_CONFIG = "dartree:W=4:B=8:retrieval=none"


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    # fp32 weights: the path the speed issues' ratios hold on (the GGUF blocks make t_AR itself faster)
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "DARTREE_WEIGHTS": "fp32"})


def train(name: str, folder: Path, args) -> None:
    if (folder / "model.safetensors").is_file():
        return
    start = ["--init", "random"] if args.init_from == "none" else ["--init-from", args.init_from, "--lr", str(args.lr)]
    run([sys.executable, "-m", "dartree.train", "--preset", PRESET, "--stage", "train", "--steps", str(args.steps),
         *start, "--max-shards", str(args.shards), "--also-data", args.also_data,
         "--eval-every", "1000", "--run-name", f"cap-{name}", "--out", str(folder), "--no-progress",
         *VARIANTS[name]])


def sweep(folder: Path, args) -> dict:
    out = folder / "sweep.json"
    if not out.is_file():
        run([sys.executable, "-m", "dartree", "sweep", "--limit", str(args.prompts), "--spread", "--max-new-tokens",
             "128", "--drafter", str(folder), "--configs", f"ar,{SWEEP_CONFIG}", "--out", str(out), "--no-progress"])
    return json.loads(out.read_text())


def card_value(folder: Path, key: str) -> float:
    """A `- key: value` line of the export's TRAINING.md (the trainer's final fp32 held-out evaluation)."""
    m = re.search(rf"^- {re.escape(key)}: ([0-9.]+)$", (folder / "TRAINING.md").read_text(), re.M)
    return float(m.group(1)) if m else float("nan")


def summarize(name: str, folder: Path, result: dict) -> dict:
    params = sum(t.numel() for t in load_file(folder / "model.safetensors").values())
    row = next(r for r in result["rows"] if r["method"] == "dartree")
    costs = result["cost_curve"]
    return {"variant": name, "params": params, "size_mb": (folder / "model.safetensors").stat().st_size / 1e6,
            "heldout_chain_tau": card_value(folder, "tau_corr"), "dev_tau": row["tau"],
            "t_draft_ms": costs["draft_seconds"] * 1e3, "t_ar_ms": costs["t_ar"] * 1e3,
            "t_draft_over_t_ar": costs["draft_seconds"] / costs["t_ar"],
            "predicted_speedup": row["predicted_speedup"]}


def table(rows: list[dict]) -> str:
    lines = ["| variant | parameters | export MB | held-out chain τ | dev τ (W 4, B 8) | t_draft / t_AR | "
             "predicted speedup |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['params'] / 1e6:.1f} M | {r['size_mb']:.1f} | {r['heldout_chain_tau']:.3f} "
                     f"| {r['dev_tau']:.4f} | {r['t_draft_over_t_ar']:.3f} ({r['t_draft_ms']:.2f} / {r['t_ar_ms']:.1f} "
                     f"ms) | {r['predicted_speedup']:.3f}× |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000, help="the training budget of every variant")
    p.add_argument("--init-from", default="assets/drafter-smollm2",
                   help="the drafter every variant starts from (grown to the variant's size), or none: from scratch")
    p.add_argument("--lr", type=float, default=2e-4, help="the peak learning rate of a leg from --init-from")
    p.add_argument("--shards", type=int, default=16, help=f"{PRESET}'s first N data shards")
    p.add_argument("--also-data", default="smollm2-cpu:16", help="as the trainer's --also-data")
    p.add_argument("--prompts", type=int, default=30, help="dev prompts of the sweep")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    p.add_argument("--out", default="runs/capacity")
    args = p.parse_args()
    names = [n.strip() for n in args.variants.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    rows = []
    for name in names:
        folder = Path(args.out) / name
        train(name, folder, args)
        rows.append(summarize(name, folder, sweep(folder, args)))
        Path(args.out, "capacity.json").write_text(json.dumps({"steps": args.steps, "init_from": args.init_from,
                                                               "shards": args.shards, "also_data": args.also_data,
                                                               "rows": rows}, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
