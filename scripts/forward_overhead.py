"""What the written-out forward (dartree.models.llama) saves against transformers' forward on the real target.

Interleaved medians, one process, on a quiet machine: a plain decoding step (one token, the root-only tree's
mask) and a 9-node verify (the CPU default's tree, with the drafter's feature layers), each through three
paths: `LlamaPass` with its native layers (one C call a layer, models/llama_native.py; "ours"), `LlamaPass`
with its torch layers ("torch layers", transformers' operations bit for bit), and transformers'
`LlamaModel.forward`, at a short and a long context. The weight path is the loader's (DARTREE_WEIGHTS=fp32
for the fp32 panels).

    PYTHONPATH=. .venv/bin/python scripts/forward_overhead.py --out assets/benchmarks/forward-overhead-gguf.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch

from dartree.attention import additive_mask, ancestor_matrix, position_ids
from dartree.bench import machine_info
from dartree.cache import new_cache, truncate_cache
from dartree.models.loading import load_models

PARENTS = torch.tensor([-1, 0, 1, 2, 0, 4, 1, 3, 5])  # a 9-node tree of depth 4
DEPTHS = torch.tensor([0, 1, 2, 3, 1, 2, 2, 4, 3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--out")
    args = ap.parse_args()
    models = load_models()
    target, layers = models.target, tuple(models.drafter.cfg.target_layer_ids)
    text = " ".join(f"Sentence {i} of a long document about rivers, bridges and the towns between them." for i in range(400))
    body = target.tokenizer(text)["input_ids"]
    lean = target.layers_pass
    native = lean.native
    rows = []
    for length in [int(c) for c in args.contexts.split(",")]:
        ids = body[:length]
        cache = new_cache(target, length + 64)
        target.forward(torch.tensor([ids]), torch.arange(length)[None], cache)
        tokens = (torch.arange(9) * 97 + 1000)[None]
        cases = {
            "plain step": (tokens[:, :1], torch.tensor([[length]]),
                           additive_mask(torch.ones(1, 1, dtype=torch.bool), length, target.dtype), ()),
            "9-node verify": (tokens, position_ids(DEPTHS, length),
                              additive_mask(ancestor_matrix(PARENTS, 4), length, target.dtype), layers),
        }
        paths = ("ours", "torch layers", "transformers")
        times = {(case, path): [] for case in cases for path in paths}
        for _ in range(args.repeats):
            for case, (tok, pos, mask, feats) in cases.items():
                for path in paths:
                    target.layers_pass = None if path == "transformers" else lean
                    lean.native = native if path == "ours" else None
                    start = time.perf_counter()
                    target.forward(tok, pos, cache, attention_mask=mask, feature_layers=feats)
                    times[(case, path)].append(time.perf_counter() - start)
                    truncate_cache(cache, length)
        target.layers_pass, lean.native = lean, native
        for case in cases:
            ours, torch_layers, theirs = (statistics.median(times[(case, p)]) for p in paths)
            rows.append({"context": length, "pass": case, "ours_ms": ours * 1e3, "torch_layers_ms": torch_layers * 1e3,
                         "transformers_ms": theirs * 1e3, "saved": 1 - ours / theirs})
            print(f"{length:>6} {case:<14} ours {ours * 1e3:7.2f} ms  torch layers {torch_layers * 1e3:7.2f} ms  "
                  f"transformers {theirs * 1e3:7.2f} ms  saved {100 * (1 - ours / theirs):5.1f} %", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "machine": machine_info(target), "date": datetime.date.today().isoformat(),
                       "command": "scripts/forward_overhead.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()
                                                                            if v is not None)}, f, indent=1)


if __name__ == "__main__":
    main()
