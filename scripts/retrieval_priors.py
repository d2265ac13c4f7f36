"""Prior acceptance rates for retrieved nodes (dartree.defaults.RETRIEVAL_PRIORS), from TRAIN prompts only.

Decodes a fixed spread of rows of ../shared/data/train_prompts.jsonl below row 18,515 (the rows from 18,515 on
are reserved for measurement, and dev files are never used to fit anything) with dartree at the CPU default
shape and `--retrieval both` at T = 0, and reads each generation's online counts (dartree.retrieval
.AcceptanceRates: per slot, the retrieved nodes the cut kept whose parent was accepted, and how many of them
were accepted). Prints the rates per source and slot group, and the priors they give: n-grams by match
length n = 1..4, the table by column at depth 1 and one rate for its chains below. Counts are exact (no
timing), so this may run on a loaded machine:

    python scripts/retrieval_priors.py [--per-family 6] [--long 8] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dartree.defaults import RETRIEVAL_PRIOR_WEIGHT, RETRIEVAL_PRIORS  # noqa: E402
from dartree.engine import Decoder, DecodeSettings  # noqa: E402
from dartree.models.loading import load_models  # noqa: E402
from dartree.retrieval import MAX_NGRAM, TABLE_WIDTH  # noqa: E402

TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "train_prompts.jsonl"
RESERVED_FROM = 18_515  # rows from here on are measurement rows (../shared/data/README.md)
FAMILIES = ("gsm8k", "gpteacher-codegen", "gpteacher-", "self-instruct-")
LONG_CHARS = 1_200  # a long-document prompt, as dev_long's rows are


def pick_rows(per_family: int, long: int) -> list[int]:
    """The first `per_family` short rows of each source family and the first `long` long-document rows (the
    file is shuffled, so its first rows of a kind are a fair sample of that kind)."""
    rows = [json.loads(line) for line in TRAIN.read_text(encoding="utf-8").split("\n")[:RESERVED_FROM]]
    picked, taken = [], {f: 0 for f in FAMILIES}
    long_taken = 0
    for i, r in enumerate(rows):
        if len(r["prompt"]) >= LONG_CHARS:
            if long_taken < long:
                picked.append(i)
                long_taken += 1
            continue
        family = next(f for f in FAMILIES if r["source"].startswith(f))
        if taken[family] < per_family:
            picked.append(i)
            taken[family] += 1
    return picked


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=4)
    ap.add_argument("--long", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    rows = pick_rows(args.per_family, args.long)
    prompts = [json.loads(line)["prompt"] for line in TRAIN.read_text(encoding="utf-8").split("\n")[:RESERVED_FROM]]
    models = load_models()
    target, drafter = models.target, models.drafter
    settings = DecodeSettings(method="dartree", retrieval="both", temperature=0.0,
                              max_new_tokens=args.max_new_tokens).resolved(target.device.type)
    hits = seen = None
    committed = rounds = 0
    for row in rows:
        dec = Decoder(target, drafter, target.chat_ids(prompts[row]), settings)
        result = dec.run()
        rates = dec.retriever.rates
        h = {s: rates.hits[s].cpu() for s in rates.hits}
        n = {s: rates.seen[s].cpu() for s in rates.seen}
        hits = h if hits is None else {s: hits[s] + h[s] for s in h}
        seen = n if seen is None else {s: seen[s] + n[s] for s in n}
        committed += sum(r.committed for r in result.round_records)
        rounds += len(result.round_records)
        print(f"row {row}: {len(result.round_records)} rounds, tau "
              f"{sum(r.committed for r in result.round_records) / max(1, len(result.round_records)):.2f}",
              flush=True)
    depth = dec.settings.depth  # the drafter's block depth (validated settings)
    ng_h, ng_s = hits["ngram"].reshape(MAX_NGRAM, depth).sum(1), seen["ngram"].reshape(MAX_NGRAM, depth).sum(1)
    tb_h, tb_s = hits["table"], seen["table"]
    groups = [("ngram n=%d" % (n + 1), ng_h[n], ng_s[n]) for n in range(MAX_NGRAM)]
    groups += [("table col %d" % c, tb_h[c], tb_s[c]) for c in range(TABLE_WIDTH)]
    groups += [("table chain", tb_h[TABLE_WIDTH:].sum(), tb_s[TABLE_WIDTH:].sum())]
    print(f"\n{len(rows)} train rows {rows}, dartree W={settings.width} B={settings.budget} retrieval=both, "
          f"{args.max_new_tokens} tokens, T = 0: {rounds} rounds, tau {committed / rounds:.2f} (committed per round)")
    print(f"{'slot group':<14}{'accepted':>10}{'seen':>8}{'rate':>8}")
    rate = {}
    for name, h, s in groups:
        rate[name] = float(h) / float(s) if s else None
        shown = f"{rate[name]:.3f}" if s else "-"
        print(f"{name:<14}{int(h):>10}{int(s):>8}{shown:>8}")

    def r2(name, fallback):  # a slot never seen keeps the current prior
        return round(rate[name], 2) if rate[name] is not None else fallback

    proposed = {"ngram": tuple(r2(f"ngram n={n + 1}", RETRIEVAL_PRIORS["ngram"][n]) for n in range(MAX_NGRAM)),
                "table": tuple(r2(f"table col {c}", RETRIEVAL_PRIORS["table"][c]) for c in range(TABLE_WIDTH)),
                "table_chain": r2("table chain", RETRIEVAL_PRIORS["table_chain"])}
    print(f"\ncurrent  RETRIEVAL_PRIORS = {RETRIEVAL_PRIORS} (weight {RETRIEVAL_PRIOR_WEIGHT})")
    print(f"proposed RETRIEVAL_PRIORS = {proposed}")


if __name__ == "__main__":
    main()
