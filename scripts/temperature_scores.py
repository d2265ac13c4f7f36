"""Which tree scores win at T > 0: τ of each score temperature, replayed on sampled continuations.

For every decoding temperature T and seed, plain decoding samples one continuation per prompt; every
(configuration, score temperature) is then replayed on the same samples (dartree.replay: the accepted
path of a replay on a sampled continuation has the distribution of the decoder's at T), so the
differences between score temperatures are paired. A score temperature is written as a multiple of T
("x1" = the target's T, option b of issue #24) or "none" (the drafter's scores as they are, option a).

    python scripts/temperature_scores.py --prompt-file /tmp/train24.jsonl --temperatures 0.8,1.0 --seeds 0,1 \\
        --max-new-tokens 96 --configs dartree:W=4:B=8 --scores none,x1,x1.25,x1.5

With --calibration-width W it instead prints, per T (0 included), P(node on the accepted path | score bin)
of W-wide supertrees at the default scores (dartree.budget.calibrate, what `--budget auto` reads), to see
whether one calibration serves every temperature.

With --predict RESULTS.json --costs SWEEP.json it reads the rows of an earlier run instead and adds each
one's speedup over plain decoding **predicted** from a committed cost curve (dartree.sweep.committed_costs:
t_draft + t_verify(nodes + 1) + t_commit + the shape's tree time, nodes = B, or the depth for a chain).

Prints, per T and configuration, τ per score temperature (per seed and overall) and its mean paired
difference from "none" over (prompt, seed) with the standard error; --out writes the rows as JSON.
Train prompts only (rows below 18,515 of train_prompts.jsonl): never tune on dev.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.bench import parse_configs  # noqa: E402
from dartree.engine import DecodeSettings  # noqa: E402
from dartree.models.loading import load_models  # noqa: E402
from dartree.prompts import read_prompt_file  # noqa: E402
from dartree.replay import make_continuation, plain_outputs, replay  # noqa: E402


def score_temperature(spec: str, temperature: float) -> float:
    """'none' -> 0 (unprocessed); 'x<k>' -> k * T."""
    return 0.0 if spec == "none" else float(spec.lstrip("x")) * temperature


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-file", help="a JSONL of train prompts (required unless --predict)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--temperatures", default="0.8,1.0")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--configs", default="dartree:W=4:B=8")
    ap.add_argument("--scores", default="none,x1")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--calibration-width", type=int, default=None)
    ap.add_argument("--predict", default=None, metavar="RESULTS_JSON")
    ap.add_argument("--costs", default="assets/benchmarks/sweep-cpu.json")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.predict:
        return predict(args.predict, args.costs)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.prompt_file:
        ap.error("--prompt-file is required (train prompts only)")
    prompts = read_prompt_file(args.prompt_file, args.limit)
    models = load_models()
    configs = [c for c in parse_configs(args.configs) if c.method != "ar"]
    scores = [s.strip() for s in args.scores.split(",")]
    if args.calibration_width:
        return calibration_by_temperature(models, prompts, args)
    rows = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        base = DecodeSettings(temperature=temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens)
        # per (config, score): per seed, per prompt (committed, rounds)
        tallies = {(c.label, s): {} for c in configs for s in scores}
        for seed in (int(x) for x in args.seeds.split(",")):
            pairs = plain_outputs(models, prompts, args.max_new_tokens, True, temperature, args.top_p, seed)
            for i, (ids, out) in enumerate(pairs):
                cont = make_continuation(models.target, models.drafter, ids, out)
                for cfg in configs:
                    for spec in scores:
                        s = replace(cfg.settings(base), seed=seed, score_temperature=score_temperature(spec, temperature))
                        r = replay(models.target, models.drafter, cont, s)
                        tallies[(cfg.label, spec)][(seed, i)] = (sum(r.committed), len(r.committed))
            print(f"T={temperature:g} seed {seed} replayed", file=sys.stderr, flush=True)
        for cfg in configs:
            ref = tallies[(cfg.label, scores[0])]
            for spec in scores:
                t = tallies[(cfg.label, spec)]
                seeds = sorted({k[0] for k in t})
                per_seed = [sum(c for (sd, _), (c, _) in t.items() if sd == seed)
                            / sum(n for (sd, _), (_, n) in t.items() if sd == seed) for seed in seeds]
                tau = sum(c for c, _ in t.values()) / sum(n for _, n in t.values())
                diffs = [t[k][0] / t[k][1] - ref[k][0] / ref[k][1] for k in t]
                se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
                row = {"temperature": temperature, "config": cfg.label, "scores": spec, "tau": tau,
                       "tau_per_seed": per_seed, "diff_vs_first": statistics.mean(diffs), "diff_se": se,
                       "pairs": len(diffs)}
                rows.append(row)
                print(f"T={temperature:g} {cfg.label:<32} scores={spec:<7} tau {tau:.4f}  per seed "
                      f"{' '.join(f'{x:.4f}' for x in per_seed)}  vs {scores[0]}: {row['diff_vs_first']:+.4f} "
                      f"± {se:.4f} (SE, {len(diffs)} pairs)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


def predict(path: str, costs_path: str) -> int:
    """Each row of a results file with its speedup predicted from the committed cost curve."""
    from dartree.replay import interpolate_verify
    from dartree.sweep import committed_costs

    costs = committed_costs(costs_path)
    t_ar = interpolate_verify(costs, 1) + costs.get("ar_commit_seconds", 0.0)
    for row in json.loads(Path(path).read_text())["rows"]:
        cfg = parse_configs(row["config"].replace(" ", ":"))[-1]
        s = cfg.settings(DecodeSettings(temperature=row["temperature"])).resolved("cpu")
        nodes = s.depth or 7 if cfg.method == "chain" else s.budget  # the shipped drafter: D = 7
        key = f"{cfg.method}:W={cfg.width}:B={cfg.budget}"
        tree = costs["tree_seconds"].get(key, costs["tree_seconds"].get(f"dartree:W={cfg.width}:B=8", 0.0))
        seconds = costs["draft_seconds"] + interpolate_verify(costs, nodes + 1) + costs.get("commit_seconds", 0.0) + tree
        print(f"T={row['temperature']:g} {row['config']:<28} scores={row['scores']:<6} tau {row['tau']:.4f} "
              f"round {1e3 * seconds:.2f} ms (tree {1e3 * tree:.2f}) predicted speedup {row['tau'] * t_ar / seconds:.3f}")
    return 0


def calibration_by_temperature(models, prompts, args) -> int:
    """P(on path | score bin) of W-wide supertrees replayed at each temperature (default scores)."""
    from dartree.budget import calibrate

    results = {}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        settings = DecodeSettings(method="dartree", width=args.calibration_width, budget=256, temperature=temperature,
                                  top_p=args.top_p, max_new_tokens=args.max_new_tokens)
        samples = []
        for seed in (int(x) for x in args.seeds.split(",")):
            for ids, out in plain_outputs(models, prompts, args.max_new_tokens, True, temperature, args.top_p, seed):
                cont = make_continuation(models.target, models.drafter, ids, out)
                samples += replay(models.target, models.drafter, cont, replace(settings, seed=seed),
                                  keep_scores=True).supertree_scores
        cal = calibrate(samples)
        results[temperature] = cal
        print(f"T={temperature:g} ({len(samples)} rounds): edges {cal['edges']}", flush=True)
        print("  rates  " + " ".join(f"{r:.3f}" for r in cal["rates"]), flush=True)
        print("  counts " + " ".join(str(c) for c in cal["counts"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "calibration": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
