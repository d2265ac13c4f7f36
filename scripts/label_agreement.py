"""How often do bf16 greedy and fp32 greedy disagree on the committed training data? (issue #21, item 3)

The committed responses were generated in bf16 (CPU AMX), while the app decodes in fp32. Teacher-forced
over a sample of committed sequences, this counts, over response tokens, where the fp32 argmax differs
from the committed label, where the bf16 argmax differs from it, and where fp32 and bf16 differ from each
other. Sequences are picked evenly over the shards (seeded), right-padded into batches (every real token
keeps its true position under plain causal attention, as in `datagen.recompute_features`).

    nice -n 19 env OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python scripts/label_agreement.py \
        --preset smollm2-cpu --tokens 300000
"""

import argparse
import copy
import json

import numpy as np
import torch

from dartree.models.target import load_target
from dartree.shards import list_shards, read_tokens, sequences, tokens_path
from dartree.train.datagen import tokens_dir


def sample_sequences(tok_dir, n_tokens: int, seed: int) -> list[tuple[np.ndarray, int]]:
    """(ids, prompt_len) pairs in a seeded random order over all shards, until `n_tokens` response tokens."""
    seqs = []
    for k in list_shards(tok_dir):
        seqs += [(s.ids, s.prompt_len) for s in sequences(read_tokens(tokens_path(tok_dir, k)))]
    order = np.random.default_rng(seed).permutation(len(seqs))
    picked, total = [], 0
    for i in order:
        if total >= n_tokens:
            break
        picked.append(seqs[i])
        total += len(seqs[i][0]) - seqs[i][1]
    return picked


@torch.inference_mode()
def response_argmax(model, batch: list[tuple[np.ndarray, int]]) -> list[torch.Tensor]:
    """Teacher-forced argmax at every position that predicts a response token."""
    width = max(len(x) for x, _ in batch) - 1
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, (x, _) in enumerate(batch):
        ids[r, :len(x) - 1] = torch.from_numpy(x[:-1])
        mask[r, :len(x) - 1] = 1
    pos = torch.arange(width)[None].expand(len(batch), -1)
    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
    return [model.lm_head(hidden[r, p - 1:len(x) - 1]).argmax(-1) for r, (x, p) in enumerate(batch)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-cpu")
    ap.add_argument("--tokens", type=int, default=300_000, help="response tokens to compare")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fp32 = load_target("smollm2-135m", device="cpu").model
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    seqs = sorted(sample_sequences(tokens_dir(args.preset), args.tokens, args.seed), key=lambda s: len(s[0]))
    n = d32 = d16 = d_both = 0
    for s in range(0, len(seqs), args.batch):
        chunk = seqs[s:s + args.batch]
        a32, a16 = response_argmax(fp32, chunk), response_argmax(bf16, chunk)
        for (x, p), g32, g16 in zip(chunk, a32, a16):
            label = torch.from_numpy(x[p:])
            n += len(label)
            d32 += int((g32 != label).sum())
            d16 += int((g16 != label).sum())
            d_both += int((g32 != g16).sum())
        if (s // args.batch) % 25 == 0:
            print(f"{s + len(chunk)}/{len(seqs)} seqs, {n} tokens: fp32 != label {d32 / n:.4%}", flush=True)
    print(json.dumps({"sequences": len(seqs), "response_tokens": n,
                      "fp32_argmax_vs_committed": d32 / n, "bf16_argmax_vs_committed": d16 / n,
                      "fp32_vs_bf16_argmax": d_both / n, "counts": [d32, d16, d_both]}, indent=1))


if __name__ == "__main__":
    main()
