"""Time the target's linears alone, by row count: torch's F.linear, MKL-packed weights, the row kernel
streaming fp32 panels, and the row kernel streaming GGUF block panels.

A stack shaped like SmolLM2-135M (30 layers x 7 linears + the 49k-row LM head, ~513 MB of fp32 random
weights, so every pass streams them from memory as a real forward does), run over M rows for each path,
median of 7 passes after a warm-up. The weights are random GGUF blocks (Q4_1, the head Q8_0, as the
embedded GGUF) and their fp32 dequantisation, so every path computes the same products (the block and
fp32 panels, the same bits). docs/speed.md quotes it.

    .venv/bin/python scripts/linear_costs.py [--rows 1,9] [--paths "row kernel,row kernel blocks"]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.models.gguf_panels import GGUF_BLOCK_BYTES, block_panels  # noqa: E402
from dartree.models.packed import packing_available  # noqa: E402
from dartree.models.rows_kernel import panel_weight, rows_kernel_status, rows_linear  # noqa: E402

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
ROWS = (1, 9, 17, 33, 65)


def random_blocks(n: int, k: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """GGUF rows of an [n, k] weight: random quants, fp16 scales (and mins) of a 0.02-scale weight."""
    rows = rng.integers(0, 256, size=(n, k // 32, GGUF_BLOCK_BYTES[kind]), dtype=np.uint8)
    halves = 2 if kind == "q4_1" else 1
    scales = np.empty((n, k // 32, halves), dtype=np.float16)
    scales[..., 0] = rng.uniform(0.001, 0.006, size=(n, k // 32))  # d
    if kind == "q4_1":
        scales[..., 1] = -8 * scales[..., 0]  # m: centre the 4-bit values
    rows[..., :2 * halves] = scales.view(np.uint8)
    return rows.reshape(n, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts, comma-separated")
    parser.add_argument("--paths", default=None, help="only these paths, comma-separated (default: all)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    kinds = [("q4_1", GGMLQuantizationType.Q4_1)] * (30 * len(SHAPES)) + [("q8_0", GGMLQuantizationType.Q8_0)]
    rows = [random_blocks(n, k, kind, rng) for (n, k), (kind, _) in zip(SHAPES * 30 + [(49152, 576)], kinds)]
    weights = [torch.from_numpy(quants.dequantize(r, qtype)) for r, (_, qtype) in zip(rows, kinds)]
    blocks = [block_panels(r, kind, w.shape[1]) for r, (kind, _), w in zip(rows, kinds, weights)]
    del rows
    panels = [panel_weight(w) for w in weights]
    packs: dict = {}

    def mkl_packed(x, i, w):
        key = (i, x.shape[0])
        if key not in packs:
            packs[key] = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
        return torch.ops.mkl._mkl_linear(x, packs[key], w, None, x.shape[0])

    paths = {"F.linear": lambda x, i, w: F.linear(x, w),
             "row kernel": lambda x, i, w: rows_linear(x, panels[i], w.shape[0]),
             "row kernel blocks": lambda x, i, w: rows_linear(x, blocks[i], w.shape[0])}
    if packing_available():
        paths["MKL packed"] = mkl_packed
    if args.paths:
        paths = {name: fn for name, fn in paths.items() if name in args.paths.split(",")}
    print(f"row kernel: {rows_kernel_status()}; ms per pass over all {len(weights)} linears")
    print(f"{'rows':>5} " + " ".join(f"{name:>18}" for name in paths))
    with torch.inference_mode():
        for m in [int(r) for r in args.rows.split(",")]:
            inputs = {576: torch.randn(m, 576), 1536: torch.randn(m, 1536)}
            cells = []
            for name, linear in paths.items():
                if name == "MKL packed" and m == 1:
                    cells.append(f"{'-':>18}")  # one row never packs (a GEMV)
                    continue

                def one_pass():
                    for i, w in enumerate(weights):
                        linear(inputs[w.shape[1]], i, w)

                one_pass()
                times = []
                for _ in range(7):
                    start = time.perf_counter()
                    one_pass()
                    times.append(time.perf_counter() - start)
                cells.append(f"{statistics.median(times) * 1e3:>18.1f}")
            print(f"{m:>5} " + " ".join(cells))


if __name__ == "__main__":
    main()
