"""How much does the 16,384-token draft vocabulary cost on the v2 data? (issue #21, item 4)

The drafter can only propose tokens of its draft vocabulary; a response token outside it (OOV) is a
certain miss at that block position, and the chain stops there. Over the committed response tokens of each
data source this reports:
- the OOV rate, for the shipped drafter's vocabulary and for one re-derived from v1 + v2 data (the trainer's
  own rule, `draft_vocab_from_data`: the most frequent response tokens plus the end-of-turn tokens);
- the share of drafting blocks (an anchor and its next K - 1 labels) that hold an OOV label;
- the vocabulary's ceiling on chain τ: 1 + the mean run of in-vocabulary labels after an anchor (at most
  K - 1), what a drafter right about every in-vocabulary token would reach, against K for a full vocabulary.
  The τ an actual drafter loses is smaller (it misses most of those positions anyway): its expected cost
  with the card's per-position top-1 accuracies is printed beside it.

    PYTHONPATH=. .venv/bin/python scripts/draft_vocab_coverage.py --drafter assets/drafter-smollm2
"""

import argparse
import json
from collections import defaultdict

import numpy as np
from safetensors import safe_open

from dartree.models.target import load_target
from dartree.shards import list_shards, read_tokens, sequences, tokens_path
from dartree.train.datagen import tokens_dir
from dartree.train.presets import get_preset
from dartree.train.trainer import SeqStore, draft_vocab_from_data

BLOCK = get_preset("smollm2-cpu-v2")["drafter"]["block_size"]  # K: an anchor and its K - 1 labels
# corrected top-1 accuracy at block positions 1-7, held-out, from the v1 drafter's card (the drafter shipped when
# the table in docs/training.md was made: `git show 1233df8:assets/drafter-smollm2/TRAINING.md`)
CARD_TOP1 = [0.658, 0.591, 0.574, 0.549, 0.516, 0.482, 0.434]


def responses(preset: str) -> dict[str, list[np.ndarray]]:
    """Response token ids per data source (v1 data has one source, 'v1')."""
    out = defaultdict(list)
    folder = tokens_dir(preset)
    for k in list_shards(folder):
        for s in sequences(read_tokens(tokens_path(folder, k))):
            out[s.source].append(s.response)
    return out


def block_stats(seqs: list[np.ndarray], vocab: np.ndarray) -> dict:
    """OOV rate, share of blocks with an OOV label, vocabulary-capped τ and its expected cost."""
    in_vocab = [np.isin(s, vocab) for s in seqs]
    n_tok = sum(len(s) for s in seqs)
    oov = sum(int((~m).sum()) for m in in_vocab) / n_tok
    runs, blocked = [], []  # per anchor: in-vocabulary labels before the first OOV one; was there an OOV one
    for m in in_vocab:
        for p in range(len(m) - 1):
            miss = np.flatnonzero(~m[p + 1:p + BLOCK])
            runs.append(min(BLOCK - 1, len(m) - 1 - p) if len(miss) == 0 else int(miss[0]))
            blocked.append(len(miss) > 0)
    runs = np.array(runs)
    reach = [(runs >= k).mean() for k in range(1, BLOCK)]  # P(no OOV label up to position k)
    acc = np.cumprod(CARD_TOP1)  # P(chain passes position k) for the card's drafter, ignoring OOV
    return {"response_tokens": n_tok, "oov_rate": round(oov, 5),
            "blocks_with_oov": round(float(np.mean(blocked)), 4),
            "tau_ceiling": round(1 + float(runs.mean()), 3),
            "expected_tau_cost": round(float(np.sum(acc * (1 - np.array(reach)))), 4)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="assets/drafter-smollm2")
    p.add_argument("--out", default=None, help="write the table as JSON here")
    args = p.parse_args()
    with safe_open(f"{args.drafter}/model.safetensors", "np") as f:  # the weights are bf16: read one tensor
        shipped = f.get_tensor("draft_vocab").astype(np.int64)
    by_source = {"v1": responses("smollm2-cpu")["v1"], **responses("smollm2-cpu-v2")}
    # the trainer's rule over v1 + v2 response tokens (a store of ids only: features are not needed)
    store = SeqStore()
    for seqs in by_source.values():
        for s in seqs:
            store.add(s, 0, None)
    rederived = draft_vocab_from_data(store, list(range(len(store))), len(shipped), always=load_target("smollm2-135m").eos_token_ids)  # as the trainer does
    table = {}
    for name, vocab in (("shipped", shipped), ("v1+v2", rederived)):
        for src, seqs in by_source.items():
            table[f"{name} / {src}"] = block_stats(seqs, vocab)
            print(f"{name:8s} {src:9s} {table[f'{name} / {src}']}", flush=True)
    print(f"re-derived vocabulary: {len(set(rederived.tolist()) - set(shipped.tolist()))} of {len(shipped)} tokens "
          f"are not in the shipped one")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
