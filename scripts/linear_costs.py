"""Time the target's linears alone, by row count: torch's F.linear, MKL-packed weights, the row kernel.

A stack shaped like SmolLM2-135M (30 layers x 7 linears + the 49k-row LM head, ~513 MB of fp32 random
weights, so every pass streams them from memory as a real forward does), run over M rows for each path,
median of 7 passes after a warm-up. docs/speed.md quotes it.

    .venv/bin/python scripts/linear_costs.py
"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.models.packed import packing_available  # noqa: E402
from dartree.models.rows_kernel import panel_weight, rows_kernel_status, rows_linear  # noqa: E402

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
ROWS = (1, 9, 17, 33, 65)


def main() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for _ in range(30) for n, k in SHAPES] + [torch.randn(49152, 576) * 0.02]
    panels = [panel_weight(w) for w in weights]
    packs: dict = {}

    def mkl_packed(x, i, w):
        key = (i, x.shape[0])
        if key not in packs:
            packs[key] = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
        return torch.ops.mkl._mkl_linear(x, packs[key], w, None, x.shape[0])

    paths = {"F.linear": lambda x, i, w: F.linear(x, w),
             "row kernel": lambda x, i, w: rows_linear(x, panels[i], w.shape[0])}
    if packing_available():
        paths["MKL packed"] = mkl_packed
    print(f"row kernel: {rows_kernel_status()}; ms per pass over all {len(weights)} linears")
    print(f"{'rows':>5} " + " ".join(f"{name:>11}" for name in paths))
    with torch.inference_mode():
        for m in ROWS:
            inputs = {576: torch.randn(m, 576), 1536: torch.randn(m, 1536)}
            cells = []
            for name, linear in paths.items():
                if name == "MKL packed" and m == 1:
                    cells.append(f"{'-':>11}")  # one row never packs (a GEMV)
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
                cells.append(f"{statistics.median(times) * 1e3:>11.1f}")
            print(f"{m:>5} " + " ".join(cells))


if __name__ == "__main__":
    main()
