"""Per-round stage times of plain decoding against dartree W = 4, B = 8, decoded for real and interleaved
(5 dev prompts x 96 tokens; the first pass is a warm-up). README "Where a round goes".

    REPS=3 .venv/bin/python scripts/round_times.py
"""
import sys, statistics, json, os, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from dartree.models.loading import load_models
from dartree.engine import DecodeSettings, generate
torch.set_grad_enabled(False)
m = load_models("smollm2-135m", "default")
t, d = m.target, m.drafter
rows = [json.loads(l) for l in open(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "shared/data/dev_prompts.jsonl"))][:40:8]
prompts = [t.chat_ids(r["prompt"]) for r in rows]
cfgs = {"ar": DecodeSettings(method="ar", max_new_tokens=96),
        "w4b8": DecodeSettings(method="dartree", width=4, budget=8, max_new_tokens=96)}
agg = {k: {"draft": 0, "tree": 0, "verify": 0, "commit": 0, "rounds": 0, "tokens": 0} for k in cfgs}
for rep in range(int(os.environ.get("REPS", 2))):
    for p in prompts:
        for k, s in cfgs.items():
            g = generate(t, d if k != "ar" else None, p, s)
            if rep == 0: continue  # warm-up
            for kk, v in g.stage_seconds.items(): agg[k][kk] += v
            agg[k]["rounds"] += g.rounds; agg[k]["tokens"] += g.new_tokens
ar = agg["ar"]; t_ar = sum(ar[x] for x in ("draft", "tree", "verify", "commit")) / ar["rounds"]
for k, a in agg.items():
    R = a["rounds"]
    print(k, "tau %.2f" % (a["tokens"] / R), " ".join("%s %.1fms(%.2f)" % (x, 1e3 * a[x] / R, a[x] / R / t_ar) for x in ("draft", "tree", "verify", "commit")),
          "round %.1fms speedup %.2f" % (1e3 * sum(a[x] for x in ("draft", "tree", "verify", "commit")) / R, (a["tokens"] / sum(a[x] for x in ("draft", "tree", "verify", "commit"))) / (ar["tokens"] / (t_ar * ar["rounds"]))))
