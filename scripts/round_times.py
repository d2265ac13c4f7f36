"""Per-round stage times of plain decoding against dartree W = 4, B = 8, decoded for real and interleaved
(5 dev prompts x 96 tokens; the first pass is a warm-up). docs/speed.md, "Where a round goes".

    REPS=3 .venv/bin/python scripts/round_times.py
"""

import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dartree.engine import DecodeSettings, generate  # noqa: E402
from dartree.models.loading import load_models  # noqa: E402
from dartree.trace import STAGE_KEYS  # noqa: E402

CONFIGS = {"ar": DecodeSettings(method="ar", max_new_tokens=96),
           "dartree W=4 B=8": DecodeSettings(method="dartree", width=4, budget=8, max_new_tokens=96)}


def main() -> None:
    torch.set_grad_enabled(False)
    models = load_models("smollm2-135m", "default")
    target, drafter = models.target, models.drafter
    rows = [json.loads(line) for line in open(REPO.parent / "shared" / "data" / "dev_prompts.jsonl")][:40:8]
    prompts = [target.chat_ids(row["prompt"]) for row in rows]
    totals = {name: dict.fromkeys(STAGE_KEYS + ("rounds", "tokens"), 0.0) for name in CONFIGS}
    for rep in range(int(os.environ.get("REPS", 2))):
        for ids in prompts:
            for name, settings in CONFIGS.items():
                result = generate(target, drafter if settings.method != "ar" else None, ids, settings)
                if rep == 0:
                    continue  # warm-up
                for stage in STAGE_KEYS:
                    totals[name][stage] += result.stage_seconds[stage]
                totals[name]["rounds"] += result.rounds
                totals[name]["tokens"] += result.new_tokens
    round_seconds = {name: sum(t[s] for s in STAGE_KEYS) / t["rounds"] for name, t in totals.items()}
    t_ar = round_seconds["ar"]
    ar_rate = totals["ar"]["tokens"] / (t_ar * totals["ar"]["rounds"])
    for name, t in totals.items():
        stages = " ".join(f"{s} {1e3 * t[s] / t['rounds']:.1f} ms ({t[s] / t['rounds'] / t_ar:.2f})" for s in STAGE_KEYS)
        rate = t["tokens"] / (round_seconds[name] * t["rounds"])
        print(f"{name}: tau {t['tokens'] / t['rounds']:.2f} | {stages} | round {1e3 * round_seconds[name]:.1f} ms"
              f" ({round_seconds[name] / t_ar:.2f} t_AR) | speedup {rate / ar_rate:.2f}")


if __name__ == "__main__":
    main()
