"""Do greedy-only labels cap acceptance at T > 0? (issue #24, "Training data")

At T > 0 the walk accepts a child of the root with probability p_T(child), the target's processed
probability of its token, so the root's W children can at best catch the W most likely tokens of p_T.
A drafter trained on greedy labels learns to put the target's argmax first, which is also p_T's most
likely token, but its 2nd..W-th choices were never trained toward p_T. This measures, at the root of
every round position of sampled continuations (train prompts only, never dev):

- `drafter`: the p_T mass of the drafter's W best children, ranked by the tree's own scores at that
  temperature (`tree.child_log_probs`: the corrected log-probs processed at the settings' score temperature);
- `oracle`: the p_T mass of p_T's own W most likely tokens, the most any drafter's W children can catch;
- `top-1`: how often the drafter's first child is p_T's most likely token.

If `drafter` is close to `oracle`, better ranking of the 2nd..W-th children (what sampled training labels
would teach) has little to gain at the root; the gap is the cap greedy labels put on the first depth.

    DARTREE_WEIGHTS=fp32 PYTHONPATH=. .venv/bin/python scripts/greedy_label_cap.py \\
        --prompt-file /tmp/train.jsonl --limit 40 --temperatures 0,0.8,1.0 --widths 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.cache import new_cache  # noqa: E402
from dartree.draft import PathCorrector, draft_block  # noqa: E402
from dartree.engine import DecodeSettings  # noqa: E402
from dartree.models.loading import load_models  # noqa: E402
from dartree.prompts import read_prompt_file  # noqa: E402
from dartree.replay import make_continuation, plain_outputs  # noqa: E402
from dartree.sampling import processed_probs  # noqa: E402
from dartree.tree import child_log_probs  # noqa: E402


@torch.inference_mode()
def root_masses(models, prompt_ids: list[int], output_ids: list[int], settings: DecodeSettings, widths: list[int]):
    """Per round position of the continuation: (drafter mass, oracle mass) for each W, and top-1 agreement."""
    target, drafter = models.target, models.drafter
    cont = make_continuation(target, drafter, prompt_ids, output_ids)
    seq = cont.sequence
    out = target.forward(torch.tensor([seq]), torch.arange(len(seq))[None], new_cache(target, len(seq)))
    temperature = max(settings.temperature, 1e-6)  # T = 0: p_T is the argmax's point mass, as the walk accepts
    rows = []
    for position in range(len(prompt_ids), len(seq) - 1):  # the anchor at `position`, its next token drafted
        block = draft_block(drafter, target, cont.context.prefix(position), torch.tensor(seq[position]), position,
                            settings.depth, settings.candidates)
        corrector = PathCorrector(drafter, target, block)
        scores = child_log_probs(block.draft, 1, corrector.residual(1, corrector.root_state()),
                                 settings.score_temperature, settings.top_p).reshape(-1)  # [C]
        children = block.draft.cand_tokens[0][scores.argsort(descending=True)]  # the drafter's order
        logits = out.logits[position]
        p = (processed_probs(logits[None], temperature, settings.top_p)[0] if settings.temperature > 0
             else torch.nn.functional.one_hot(logits.argmax(), logits.shape[0]).float())
        best = p.argsort(descending=True)
        rows.append({"drafter": [float(p[children[:w]].sum()) for w in widths],
                     "oracle": [float(p[best[:w]].sum()) for w in widths],
                     "top1": bool(children[0] == best[0])})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-file", required=True, help="train prompts only (rows below 18,515)")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--temperatures", default="0,0.8,1.0")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    models = load_models()
    prompts = read_prompt_file(args.prompt_file, args.limit)
    widths = [int(w) for w in args.widths.split(",")]
    result = {"command": " ".join(sys.argv), "widths": widths, "rows": []}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        settings = DecodeSettings(temperature=temperature, seed=args.seed).validated(
            models.drafter.max_depth, models.target.vocab_size, models.target.device.type)
        rows = []
        pairs = plain_outputs(models, prompts, args.max_new_tokens, False, temperature, 1.0, args.seed)
        for ids, out in pairs:
            rows += root_masses(models, ids, out, settings, widths)
        n = len(rows)
        summary = {"temperature": temperature, "score_temperature": settings.score_temperature, "positions": n,
                   "top1_agreement": sum(r["top1"] for r in rows) / n,
                   "drafter_mass": [sum(r["drafter"][i] for r in rows) / n for i in range(len(widths))],
                   "oracle_mass": [sum(r["oracle"][i] for r in rows) / n for i in range(len(widths))]}
        result["rows"].append(summary)
        cells = "  ".join(f"W={w}: {d:.3f} / {o:.3f} ({d / o:.1%})" for w, d, o in
                          zip(widths, summary["drafter_mass"], summary["oracle_mass"]))
        print(f"T={temperature:g} ({n} positions) top-1 = p_T's best {summary['top1_agreement']:.3f}; "
              f"p_T mass of the root's W children, drafter / oracle: {cells}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
