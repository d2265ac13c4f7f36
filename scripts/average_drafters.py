"""Weight-average two drafters fine-tuned from one parent (a "model soup", Wortsman et al. 2022).

A fine-tuning leg on new data can gain where the data is new and lose a little elsewhere; two legs that
started from the same weights lie in one basin, and a point on the line between them often keeps the
gains of both. This writes (1 - alpha) * A + alpha * B in the checkpoint's own dtype, with A's
config and a training record naming both, so the result loads like any drafter (`--drafter OUT`).

    python scripts/average_drafters.py assets/drafter-smollm2 runs/v2w48 --alpha 0.5 --out runs/soup
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def average(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    if set(a) != set(b):
        raise SystemExit(f"the drafters hold different tensors: {sorted(set(a) ^ set(b))[:5]}")
    out = {}
    for name, x in a.items():
        y = b[name]
        if x.shape != y.shape:
            raise SystemExit(f"{name}: shapes {tuple(x.shape)} and {tuple(y.shape)} differ (another architecture)")
        if not x.is_floating_point():  # index tensors (the draft vocabulary) must agree, not be averaged
            if not torch.equal(x, y):
                raise SystemExit(f"{name} differs: average only drafters that share a draft vocabulary")
            out[name] = x
            continue
        out[name] = torch.lerp(x.float(), y.float(), alpha).to(x.dtype)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--alpha", type=float, default=0.5, help="weight of B (0: A, 1: B)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not 0.0 <= args.alpha <= 1.0:
        raise SystemExit("--alpha must lie in [0, 1]")
    weights = average(load_file(args.a / WEIGHTS), load_file(args.b / WEIGHTS), args.alpha)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(weights, args.out / WEIGHTS)
    config = json.loads((args.a / "config.json").read_text())
    records = [json.loads((d / "config.json").read_text()).get("dartree_training") for d in (args.a, args.b)]
    config["dartree_training"] = {**(records[1] or {}), "averaged": {"a": str(args.a), "b": str(args.b),
                                                                     "alpha": args.alpha, "a_record": records[0]}}
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {args.out}: {1 - args.alpha:g} x {args.a} + {args.alpha:g} x {args.b}")


if __name__ == "__main__":
    main()
