"""MKL-packed weights for the few-row linears of speculative decoding on CPU.

Tree verification runs the target over B + 1 rows (9-65 here) and the drafter over one block of K
rows. For such short inputs MKL's `sgemm` spends much of each call re-packing the weight matrix
into its internal layout. `cblas_sgemm_pack` does that once (`torch.ops.mkl._mkl_reorder_linear_weight`)
and `cblas_sgemm_compute` (`torch.ops.mkl._mkl_linear`) then only multiplies. Measured on this
2-core Xeon (`scripts/profile_stages.py` with and without `DARTREE_PACKED_GEMM=0`, docs/speed.md):
the drafter pass fell from 32-34 to 17-21 ms (most of it the 49k-wide LM head over 7 rows) and one
target forward over 17 tree tokens from 145-168 to 110-114 ms.

A pack is only valid for the row count it was made for (the op silently falls back to a plain
`F.linear` otherwise), so packs are made lazily per (layer, row count), on the second call with that
count (a prompt's prefill length is usually seen once and is not worth ~0.3 s of packing), and kept
in one LRU bounded in bytes: a fixed-B decode needs three sizes (the drafter block, the LM head's draft rows, B + 1),
while a slider sweep in the app may touch many. Single rows (plain decoding, a memory-bound GEMV)
and autograd calls (training) always take the ordinary path.

Exactness: a row's result is a function of that row and the weights alone in both paths, but the
packed and unpacked kernels may round differently. Plain decoding never uses packs (one row), so
the T = 0 identity with it is what every lossless test and `bench` run checks, as for any kernel.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import contextmanager

import torch
import torch.nn.functional as F

DEFAULT_BUDGET_BYTES = 3 << 30
MIN_ROWS, MAX_ROWS = 2, 256
_one_off = threading.local()


@contextmanager
def unpacked():
    """Run the enclosed linears (this thread only) on plain `F.linear`, packing nothing.

    For forwards whose row count is a one-off: a prompt's prefill. Packing the target for it costs
    ~0.3 s and its pack takes LRU room from the verify widths that every round reuses. An interleaved
    `bench` prefills each prompt once per configuration, so each prompt length used to be packed on its
    second visit and to evict the hot packs, which the next rounds then re-packed mid-decode (a 6-prompt
    bench made packs for 4 prompt lengths besides its 5 verify widths).
    """
    previous = getattr(_one_off, "active", False)
    _one_off.active = True
    try:
        yield
    finally:
        _one_off.active = previous


def packing_available() -> bool:
    """MKL packed GEMM exists in this torch build and is not switched off (`DARTREE_PACKED_GEMM=0`)."""
    if os.environ.get("DARTREE_PACKED_GEMM", "1") == "0":
        return False
    return (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"))


class PackedWeights:
    """An LRU of packed weights keyed by (linear, rows), bounded by `budget_bytes`; thread-safe."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self._packs: OrderedDict = OrderedDict()  # (linear, weight ptr, version, rows) -> (pack, nbytes)
        self._seen: set = set()  # keys met once, not packed yet
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._packs)

    def get(self, linear: torch.nn.Linear, rows: int):
        """The pack for this linear and row count, or None the first time the pair is met."""
        # The weight's address and version are part of the key, so an in-place update or a
        # replaced parameter never meets a stale pack.
        w = linear.weight
        key = (id(linear), w.data_ptr(), w._version, rows)
        with self._lock:
            hit = self._packs.get(key)
            if hit is not None:
                self._packs.move_to_end(key)
                return hit[0]
            if key not in self._seen:
                if len(self._seen) > 65536:
                    self._seen.clear()
                self._seen.add(key)
                return None
            self._seen.discard(key)
        pack = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), rows)
        nbytes = w.numel() * w.element_size()  # the pack is about the size of the weight
        with self._lock:
            self._packs[key] = (pack, nbytes)
            self.bytes += nbytes
            while self.bytes > self.budget_bytes and len(self._packs) > 1:
                _, (_, freed) = self._packs.popitem(last=False)
                self.bytes -= freed
        return pack

    def clear(self) -> None:
        with self._lock:
            self._packs.clear()
            self._seen.clear()
            self.bytes = 0


def packed_linear(linear: torch.nn.Linear, x: torch.Tensor, packs: PackedWeights) -> torch.Tensor:
    """`linear(x)` through a packed weight when x has MIN_ROWS..MAX_ROWS rows and needs no gradient."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if (not MIN_ROWS <= rows <= MAX_ROWS or getattr(_one_off, "active", False)
            or x.dtype != torch.float32 or x.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or linear.weight.requires_grad))):
        return F.linear(x, linear.weight, linear.bias)
    pack = packs.get(linear, rows)
    if pack is None:
        return F.linear(x, linear.weight, linear.bias)
    flat = x.reshape(rows, x.shape[-1]).contiguous()
    out = torch.ops.mkl._mkl_linear(flat, pack, linear.weight, linear.bias, rows)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def use_packed_linears(model: torch.nn.Module, packs: PackedWeights | None = None,
                       skip: tuple[str, ...] = ()) -> PackedWeights | None:
    """Route every fp32 CPU `nn.Linear` of `model` through `packed_linear`; returns the LRU (None: off).

    Done per module instance (an instance `forward`), so nothing global changes and a model moved to
    CUDA or half precision keeps its own path (`packed_linear` checks dtype and device per call).
    Modules whose names start with one of `skip` keep `F.linear` (the drafter's correction head runs
    on W rows inside the one-thread tree stage, where packing measured slower).
    """
    if not packing_available():
        return None
    packs = packs or PackedWeights()
    for name, module in model.named_modules():
        if skip and name.startswith(skip):
            continue
        if isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.float32 \
                and module.weight.device.type == "cpu":
            module.forward = (lambda m: (lambda x: packed_linear(m, x, packs)))(module)
    return packs
