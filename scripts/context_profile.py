"""Where a verify pass spends its time at a given context: torch.profiler's top ops (docs/speed.md,
"Costs that grow with the context").

    python scripts/context_profile.py --context 2048 --nodes 9            # the decoder's cache and attention
    python scripts/context_profile.py --context 2048 --nodes 9 --before   # DynamicCache + transformers' SDPA
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import profile
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dartree.bench import _chain_tree  # noqa: E402
from dartree.cache import new_cache, truncate_cache  # noqa: E402
from dartree.context_costs import context_ids  # noqa: E402
from dartree.models.loading import load_models  # noqa: E402
from dartree.prompts import DEV_LONG_PROMPTS, read_prompt_file  # noqa: E402
from dartree.verify import verify_tree  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--nodes", type=int, default=9)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--before", action="store_true", help="DynamicCache and transformers' own SDPA function")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_models()
    target, drafter = models.target, models.drafter
    if args.before:
        target.model.set_attn_implementation("sdpa")
    ids = context_ids(target, read_prompt_file(DEV_LONG_PROMPTS), args.context)
    layers = tuple(drafter.cfg.target_layer_ids)
    cache = DynamicCache() if args.before else new_cache(target, len(ids) + args.nodes)
    tree = _chain_tree(args.nodes, drafter.max_depth, target.device)
    with torch.inference_mode():
        target.prefill(ids, cache, layers)
        for _ in range(2):  # warm-up
            verify_tree(target, tree, cache, len(ids), layers)
            truncate_cache(cache, len(ids))
        with profile() as prof:
            for _ in range(args.repeats):
                verify_tree(target, tree, cache, len(ids), layers)
                truncate_cache(cache, len(ids))
    print(f"{len(ids)} tokens of context, {args.nodes} nodes, {args.repeats} verify passes"
          f"{' (before: DynamicCache, repeat_kv)' if args.before else ''}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
