"""What one draw per tree node costs: the sampler (dartree.sampling.next_tokens) against torch.multinomial.

    python scripts/sampler_cost.py [--rows 9] [--vocab 49152] [--repeats 50]

Median milliseconds over --repeats calls, one torch thread, on random logits of the target's vocabulary size.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dartree.sampling import draw, next_tokens, processed_probs  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=9)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logits = torch.randn(args.rows, args.vocab)
    g = torch.Generator().manual_seed(0)
    probs = processed_probs(logits, 0.8)
    cases = {"argmax (T = 0)": lambda: next_tokens(logits, 0.0, 1.0, g),
             "processed_probs T = 0.8": lambda: processed_probs(logits, 0.8),
             "draw": lambda: draw(probs, g),
             "next_tokens T = 0.8": lambda: next_tokens(logits, 0.8, 1.0, g),
             "next_tokens T = 0.8, top-p 0.95": lambda: next_tokens(logits, 0.8, 0.95, g),
             "torch.multinomial": lambda: torch.multinomial(probs, 1, generator=g)}
    for name, fn in cases.items():
        median_ms(fn, 5)  # warm up (the allocator settles)
        print(f"{args.rows} rows x {args.vocab}, {name}: {median_ms(fn, args.repeats):.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
