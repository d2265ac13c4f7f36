"""The data stage of a preset: generate its missing shards (resumable), or only their missing features.

    python -m dartree train --preset NAME --stage data [--max-minutes 50]

See :mod:`.datagen` for the shard layout and :mod:`.mix` for the mixed presets' plan.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..models.target import load_target
from .datagen import (RESERVED_FROM_ROW, PromptList, check_manifest, features_dir, fill_missing_features,
                      generate_shards, load_prompts, tokenize_prompts, tokens_dir)
from .mix import MixPlan, write_mix_stats
from .presets import get_preset
from .stream import greedy, sampler


def add_datagen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="smollm2-cpu")
    p.add_argument("--max-prompts", type=int, default=None, help="use the first N prompts of the preset's plan")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--shard-size", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="generation precision (bf16: AMX makes it ~4x faster than fp32 here; fp32: the app's labels)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="start no new shard after this many minutes (a stage of bounded length; rerun to resume)")
    p.add_argument("--features-only", action="store_true", help="only recompute missing features")
    p.add_argument("--first-shard", type=int, default=0,
                   help="skip the shards before this one (--features-only; in training, the window's start)")
    p.add_argument("--no-features", action="store_true", help="do not save features (ids only)")
    p.add_argument("--no-progress", action="store_true")


def run_datagen(args) -> dict:
    preset = get_preset(args.preset)
    d = dict(preset["data"])
    for key in ("max_prompts", "batch_size", "shard_size", "max_new_tokens", "dtype"):
        if getattr(args, key, None) is not None:
            d[key] = getattr(args, key)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = tuple(preset["drafter"]["target_layer_ids"])
    device = getattr(args, "device", "cpu")
    target = load_target(preset["target"], device=device, dtype="bf16" if device == "cuda" and d["dtype"] == "bf16" else None)
    if d["dtype"] == "bf16" and target.dtype != torch.bfloat16:
        # load_target refuses bf16 on CPU (inference must be exact); for data generation speed matters
        # more: bf16 greedy text is still the target's own text, and features differ by ~1.4% (relative).
        target.model.to(torch.bfloat16)
        target.dtype = torch.bfloat16
    tok_dir, feat_dir = tokens_dir(args.preset), features_dir(args.preset)
    progress = not args.no_progress
    if args.features_only:
        limit = getattr(args, "max_prompts", None)  # --max-prompts N: the shards of the plan's first N prompts
        n = fill_missing_features(target, tok_dir, feat_dir, layers, progress=progress,
                                  max_shards=None if limit is None else -(-limit // d["shard_size"]),
                                  first_shard=args.first_shard)
        return {"recomputed_shards": n}
    manifest = {"target": preset["target"], "shard_size": d["shard_size"], "max_new_tokens": d["max_new_tokens"],
                "max_prompt_tokens": d["max_prompt_tokens"], "prompt_file": "train_prompts.jsonl", "dtype": d["dtype"],
                "target_layer_ids": list(layers)}
    if "mix" in d:
        manifest["mix"] = d["mix"]
    choose = greedy
    if d.get("response_temperature"):  # sampled responses, recorded so a later stage cannot mix in greedy ones
        manifest["response_temperature"], manifest["response_seed"] = d["response_temperature"], d["response_seed"]
        # a stage's draws depend on where it resumes, not only on the seed: the shards record what was drawn
        choose = sampler(d["response_temperature"], 1.0, torch.Generator().manual_seed(d["response_seed"]))
    check_manifest(tok_dir, manifest)
    n_prompts = min(d["max_prompts"], RESERVED_FROM_ROW) if "mix" not in d else d["max_prompts"]
    if "mix" in d:
        plan = MixPlan(target, d, n_shards=(n_prompts + d["shard_size"] - 1) // d["shard_size"], tok_dir=tok_dir)
        on_shard = lambda k: write_mix_stats(tok_dir)  # noqa: E731
    else:
        plan = PromptList(tokenize_prompts(target, load_prompts()[:n_prompts], d["max_prompt_tokens"]), d["shard_size"])
        on_shard = None
    print(f"[datagen] {plan.n_shards} shards of {d['shard_size']}, batch {d['batch_size']}, {d['dtype']}, "
          f"tokens -> {tok_dir}, features -> {feat_dir}", flush=True)
    deadline = time.time() + 60 * args.max_minutes if getattr(args, "max_minutes", None) else None
    stats = generate_shards(target, plan, tok_dir=tok_dir, feat_dir=None if args.no_features else feat_dir,
                            batch_size=d["batch_size"], max_new_tokens=d["max_new_tokens"], feature_layers=layers,
                            deadline=deadline, progress=progress, on_shard=on_shard,
                            max_batch_tokens=d.get("max_batch_tokens"), max_prefill_tokens=d.get("max_prefill_tokens"),
                            choose=choose)
    print(f"[datagen] done: {stats}", flush=True)
    return stats


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dartree.train.datastage", description=__doc__.splitlines()[0])
    add_datagen_arguments(p)
    run_datagen(p.parse_args(argv))


if __name__ == "__main__":
    main()
