"""Ad-hoc timing of one round's stages on the real models: the drafter pass, each method's tree build
(with the engine's one-thread tree stage), one target forward over 17 tree tokens (B = 16 plus the
root) and a plain decoding step. Medians of 7.

    .venv/bin/python scripts/profile_stages.py            # default threads
    OMP_NUM_THREADS=1 .venv/bin/python scripts/profile_stages.py
    DARTREE_PACKED_GEMM=0 .venv/bin/python scripts/profile_stages.py   # without MKL-packed weights
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.cache import truncate_cache  # noqa: E402
from dartree.draft import DrafterContext, PathCorrector, draft_block  # noqa: E402
from dartree.engine import DecodeSettings, build_round_tree, generate  # noqa: E402
from dartree.models.loading import load_models  # noqa: E402


def median_ms(fn, repeats=7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 1)


def main() -> None:
    torch.set_grad_enabled(False)
    models = load_models("smollm2-135m", "default")
    t, d = models.target, models.drafter
    ids = t.chat_ids("Write a Python function that checks whether a number is prime.")
    cache = DynamicCache()
    out = t.forward(torch.tensor([ids]), torch.arange(len(ids))[None], cache,
                    feature_layers=tuple(d.cfg.target_layer_ids), logit_rows=slice(-1, None))
    ctx = DrafterContext.from_prefill(d, out.features)
    anchor = torch.tensor(ids[-1])
    print("threads", torch.get_num_threads())
    print("draft ms", median_ms(lambda: draft_block(d, t, ctx, anchor, len(ids), 7, 64)))
    block = draft_block(d, t, ctx, anchor, len(ids), 7, 64)
    for method, w, b in (("chain", 1, 1), ("ddtree", 1, 16), ("dartree-fixed", 1, 16), ("dartree", 4, 16),
                         ("dartree", 8, 32), ("dartree", 12, 64)):
        s = DecodeSettings(method=method, width=w, budget=b, depth=7, candidates=64)
        print(method, f"W={w} B={b}", "tree ms", median_ms(lambda: build_round_tree(s, block, PathCorrector(d, t, block))))
    tree_tokens = torch.tensor([ids[-17:]])
    tree_positions = torch.arange(len(ids), len(ids) + 17)[None]

    def verify_17():
        t.forward(tree_tokens, tree_positions, cache)  # causal over the 17 rows: the cost of a 17-node tree
        truncate_cache(cache, len(ids))

    print("verify forward 17 tokens ms", median_ms(verify_17))
    r = generate(t, None, ids, DecodeSettings(method="ar", max_new_tokens=20))
    print("AR ms/token", round(1e3 * r.decode_seconds / (r.new_tokens - 1), 1))


if __name__ == "__main__":
    main()
