"""The row-streaming fp32 linear (`rows_linear.c`): built once per machine, loaded with ctypes.

Plain decoding and tree verification on CPU both go through it, so every row of a verify gets bit for
bit what plain decoding gets for it one row at a time (the C file says why this holds), while the weights
are read from memory once per pass whatever the row count. The weights stream as fp32 (or exact bf16)
panels, or, for the embedded GGUF target, as the GGUF's own Q4_1 / Q8_0 blocks (`BlockPanels`, made by
`models.gguf_panels`) rebuilt bit for bit in registers: the same results from about a sixth of the bytes.
The same library holds a decoder layer around these products (`llama_rows.c`, used by `models.llama_native`)
and the draws at T > 0 (`sample_rows.c`, used by `dartree.sampling`).

The kernel needs AVX-512F and a C compiler (gcc, present wherever Python packages compile); where either
is missing, or `DARTREE_ROWS_KERNEL=0`, `rows_kernel_available()` is False and `models.loading` keeps the
MKL-packed path (`models.packed`).

No torch headers or ninja are involved: the C files and the header they share, one `gcc` call (~1 s),
cached under `$DARTREE_CACHE/kernels` by a hash of the source, the flags and the compiler version.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .cache_dir import cache_root
from .packed import use_packed_linears

SOURCES = tuple(Path(__file__).with_name(name) for name in ("rows_linear.c", "llama_rows.c", "sample_rows.c"))
HEADERS = (Path(__file__).with_name("vec.h"),)  # included by the sources: part of the build's cache key
# -ffp-contract=off: the GGUF block rebuild keeps gguf.quants' separate multiply and add (rows_linear.c)
FLAGS = ("-O2", "-mavx512f", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
_lock = threading.Lock()
_state: dict = {}


def _cpu_has_avx512f() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return " avx512f" in line
    except OSError:
        pass
    return False


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]
    out = cache_root() / "kernels" / f"rows_linear-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        # compile to a temporary name, then rename: two processes building at once never load half a file
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            proc = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", str(tmp_out)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{cc} failed to build {', '.join(p.name for p in SOURCES)}:\n{proc.stderr[-2000:]}")
            os.replace(tmp_out, out)
    return out


def load_rows_kernel():
    """The loaded C functions by weight dtype, or None with the reason in `rows_kernel_status()`."""
    if "fn" in _state:  # every linear call asks: no lock once loaded
        return _state["fn"]
    with _lock:
        if "fn" in _state:
            return _state["fn"]
        fn, why = None, ""
        cc = _compiler()
        if os.environ.get("DARTREE_ROWS_KERNEL", "1") == "0":
            why = "switched off (DARTREE_ROWS_KERNEL=0)"
        elif not _cpu_has_avx512f():
            why = "this CPU has no AVX-512F"
        elif cc is None:
            why = "no C compiler (gcc) on PATH"
        else:
            try:
                lib = ctypes.CDLL(str(_build(cc)))
                fn = {torch.float32: lib.rows_linear_f32, torch.bfloat16: lib.rows_linear_bf16w,
                      "q4_1": lib.rows_linear_q4_1, "q8_0": lib.rows_linear_q8_0}
                for f in fn.values():
                    f.restype = None
                    f.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_long, ctypes.c_long, ctypes.c_long]
                for kind in BLOCK_BYTES:  # the exactness check of block panels
                    f = fn[f"mismatches_{kind}"] = getattr(lib, f"rows_mismatches_{kind}")
                    f.restype = ctypes.c_long
                    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long]
                fn["llama_layer"] = lib.llama_layer  # models/llama_rows.c: a decoder layer around the products
                fn["llama_layer"].restype = None
                fn["llama_scratch_floats"] = lib.llama_scratch_floats
                fn["llama_scratch_floats"].restype = ctypes.c_long
                fn["llama_scratch_floats"].argtypes = [ctypes.c_long] * 7
                fn["sample_rows"] = lib.sample_rows  # models/sample_rows.c: draws at T > 0
                fn["sample_rows"].restype = None
                fn["sample_rows"].argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                                              ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p]
                why = "on"
            except (OSError, RuntimeError) as exc:
                why = f"build failed: {exc}"
        _state["fn"], _state["why"] = fn, why
        return fn


def rows_kernel_available() -> bool:
    return load_rows_kernel() is not None


def rows_kernel_status() -> str:
    load_rows_kernel()
    return _state["why"]


PANEL = 32  # output columns per panel, as `P` in rows_linear.c


def panel_weight(weight: torch.Tensor, allow_bf16: bool = True) -> torch.Tensor:
    """The kernel's layout of an [N, K] weight: [ceil(N / 32), K, 32], each panel contiguous, zero-padded.

    A copy (the original stays for embeddings, autograd and other devices), made once per weight. When
    every value of the weight is exactly a bf16 number (a bf16 checkpoint run in fp32, like the shipped
    drafter), the copy is bf16: half the bytes to stream, and the same results, since the kernel widens
    each value back to the same fp32 before multiplying.
    """
    n, k = weight.shape
    w = weight.detach().float()
    as_bf16 = w.to(torch.bfloat16)
    exact = allow_bf16 and bool(torch.equal(as_bf16.float(), w))
    padded = torch.zeros(-(-n // PANEL) * PANEL, k, dtype=torch.bfloat16 if exact else torch.float32)
    padded[:n] = as_bf16 if exact else w
    return padded.view(-1, PANEL, k).transpose(1, 2).contiguous()


QK = 32  # weights per GGUF block, as in rows_linear.c
BLOCK_BYTES = {"q4_1": 640, "q8_0": 1088}  # bytes per 32 x 32 weights of a block panel (rows_linear.c)


@dataclass(frozen=True)
class BlockPanels:
    """An [n, k] weight as GGUF block panels: `data` uint8 [ceil(n / 32), k / 32, BLOCK_BYTES[kind]].

    rows_linear.c ("GGUF blocks") has the byte layout; `models.gguf_panels` makes them from a GGUF.
    """

    kind: str  # "q4_1" or "q8_0"
    data: torch.Tensor
    n: int
    k: int

    def __post_init__(self):
        expected = (-(-self.n // PANEL), self.k // QK, BLOCK_BYTES[self.kind])
        if self.k % QK or self.data.dtype != torch.uint8 or tuple(self.data.shape) != expected:
            raise ValueError(f"{self.kind} block panels of a [{self.n}, {self.k}] weight must be uint8 {expected}, "
                             f"not {self.data.dtype} {tuple(self.data.shape)}")

    def select_rows(self, rows: torch.Tensor) -> "BlockPanels":
        """The block panels of the weight's rows `rows` (Q8_0 only: the draft head is a row slice of the tied
        Q8_0 LM head). A Q8_0 panel is d[32 columns] (fp16 bytes) | q[32 k][32 columns] per 32-wide k block;
        the weight's rows are the panels' columns, so this gathers columns and lays them out again."""
        if self.kind != "q8_0":
            raise ValueError(f"only Q8_0 block panels select rows, not {self.kind}")
        count, kb = self.data.shape[:2]
        scales = self.data[..., :2 * PANEL].reshape(count, kb, PANEL, 2).permute(0, 2, 1, 3)  # [p, col, kb, 2]
        q = self.data[..., 2 * PANEL:].reshape(count, kb, QK, PANEL).permute(0, 3, 1, 2)  # [p, col, kb, k]
        n = rows.numel()
        width = -(-n // PANEL) * PANEL  # zero rows pad the last panel (zero scales rebuild zero weights)
        picked = []
        for part in (scales, q):
            flat = part.reshape(count * PANEL, kb, part.shape[-1])
            out = flat.new_zeros(width, kb, part.shape[-1])
            out[:n] = flat[rows.to(flat.device)]
            picked.append(out.view(-1, PANEL, kb, part.shape[-1]))
        scales, q = picked[0].permute(0, 2, 1, 3), picked[1].permute(0, 2, 3, 1)  # [p, kb, col, 2], [p, kb, k, col]
        data = torch.cat([scales.reshape(width // PANEL, kb, -1), q.reshape(width // PANEL, kb, -1)], dim=-1)
        return BlockPanels(self.kind, data.contiguous(), n, self.k)


def rows_linear(x: torch.Tensor, panels, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for fp32 CPU tensors through the kernel (which must be available).

    `panels` is `panel_weight(weight)` or the weight's `BlockPanels`, and `n` the weight's row count;
    x may have any leading shape.
    """
    kernels = load_rows_kernel()
    if isinstance(panels, BlockPanels):
        fn, k, data = kernels[panels.kind], panels.k, panels.data
    else:
        fn, k, data = kernels[panels.dtype], panels.shape[1], panels
    flat = x.reshape(-1, k)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m = flat.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if m:
        fn(flat.data_ptr(), flat.stride(0), data.data_ptr(), bias.data_ptr() if bias is not None else None,
           out.data_ptr(), m, k, n)
    return out.reshape(*x.shape[:-1], n)


def rebuild_mismatches(panels: BlockPanels, weight: torch.Tensor) -> int:
    """How many elements of the fp32 [n, k] `weight` differ in any bit from what the kernel rebuilds from
    `panels` (by the kernel's own code): 0 means the panels give the fp32 panels' results bit for bit."""
    w = weight.detach().float().contiguous()
    if tuple(w.shape) != (panels.n, panels.k):
        raise ValueError(f"a [{panels.n}, {panels.k}] weight's panels checked against a {tuple(w.shape)} weight")
    return load_rows_kernel()[f"mismatches_{panels.kind}"](panels.data.data_ptr(), w.data_ptr(), panels.k, panels.n)


def weight_key(weight: torch.Tensor) -> tuple[int, int]:
    """What panels made from a weight are keyed on: its storage and its version (every in-place write bumps it)."""
    return weight.data_ptr(), weight._version


def linear_key(linear: torch.nn.Linear) -> tuple[int, int]:
    """`weight_key` of a linear's weight, read from `_parameters`: `linear.weight` goes through nn.Module's
    `__getattr__` (~0.4 us), and the native layers check all 211 of the target's weights every pass."""
    return weight_key(linear._parameters["weight"])


def cached_panels(owner, name: str, weight: torch.Tensor) -> torch.Tensor:
    """`panel_weight(weight)`, kept on `owner` under `name`; rebuilt if the weight was replaced or changed."""
    key = weight_key(weight)
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        with torch.inference_mode(False), torch.no_grad():
            cached = (key, panel_weight(weight))
        owner.__dict__[name] = cached  # a plain attribute: never saved, moved or trained
    return cached[1]


def _panels_of(linear: torch.nn.Linear) -> torch.Tensor:
    return cached_panels(linear, "_rows_panels", linear.weight)


def gru_cell(x: torch.Tensor, h: torch.Tensor, ih_panels: torch.Tensor, hh_panels: torch.Tensor) -> torch.Tensor:
    """`torch.gru_cell(x, h, w_ih, w_hh)` (no biases) with its two products through the kernel.

    The drafter's path corrector advances W states per depth with it: its weights (~2.6 MB in fp32, 1.3 MB
    as the bf16 panels of the shipped drafter) then stay in a core's L2 across depths.
    """
    gates = 3 * h.shape[-1]
    i_r, i_z, i_n = rows_linear(x, ih_panels, gates).chunk(3, dim=-1)
    h_r, h_z, h_n = rows_linear(h, hh_panels, gates).chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return n + z * (h - n)


def _blocks_of(linear: torch.nn.Linear) -> BlockPanels | None:
    """The linear's GGUF block panels, while its weight is still the one they were checked against."""
    held = linear.__dict__.get("_rows_blocks")
    return held[1] if held is not None and held[0] == linear_key(linear) else None


def routed(linear: torch.nn.Linear) -> bool:
    """Whether `use_rows_kernel` routed `linear` through the kernel (it holds panels or block panels)."""
    return "_rows_panels" in linear.__dict__ or "_rows_blocks" in linear.__dict__


def kernel_applies(linear: torch.nn.Linear, x: torch.Tensor) -> bool:
    """Whether the kernel can compute `linear(x)`: fp32 input, weight and bias on a CPU, and no gradient."""
    w, bias = linear.weight, linear.bias
    return (x.dtype == torch.float32 and w.dtype == torch.float32 and x.device.type == "cpu"
            and w.device.type == "cpu"
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)))


def _kernel_linear(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`linear(x)`, through the kernel whenever it applies (`kernel_applies`), else `F.linear`."""
    if not kernel_applies(linear, x):
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    return rows_linear(x, _blocks_of(linear) or _panels_of(linear), linear.weight.shape[0], linear.bias)


def use_rows_kernel(model: torch.nn.Module, skip: tuple[str, ...] = (),
                    blocks: dict[str, BlockPanels] | None = None) -> bool:
    """Route every CPU fp32 `nn.Linear` of `model` (but those named under `skip`) through the kernel.

    Per module instance, like `packed.use_packed_linears`: nothing global changes; a model on a GPU or in
    half precision is left alone, and a call that needs a gradient (training), or whose module was later
    moved or cast, takes `F.linear` as before. Each routed linear keeps its weight in the kernel's panel
    layout beside the original (a second fp32 copy: ~540 MB for SmolLM2-135M), or streams the block panels
    `blocks` has under its name, which must rebuild its weight exactly (`gguf_panels` checks): should the
    weight change later, the linear takes fp32 panels again. Returns False, with nothing changed, where the
    kernel is unavailable (`rows_kernel_status()` says why).
    """
    if not rows_kernel_available():
        return False
    blocks = blocks or {}
    for name, module in model.named_modules():
        if skip and name.startswith(skip):
            continue
        if (isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.float32
                and module.weight.device.type == "cpu"):
            module.forward = (lambda m: (lambda x: _kernel_linear(m, x)))(module)
            if name in blocks:  # a plain attribute, like the panels: never saved, moved or trained
                module.__dict__["_rows_blocks"] = (linear_key(module), blocks[name])
            else:
                _panels_of(module)  # now, not in the first decode
    return True


def route_like_target(module: torch.nn.Module, target, skip: tuple[str, ...] = (),
                      head_rows: torch.Tensor | None = None) -> None:
    """Give `module` (a drafter, or its draft head) the CPU linear path `load_models` chose for `target`:
    the kernel, MKL packs sharing the target's LRU, or neither.

    `head_rows`: `module` is the linear made of these rows of the target's LM head (the draft head), so it
    streams their slice of the head's block panels where the target has them (`target.head_blocks`).
    """
    if getattr(target, "rows_kernel", False):
        head_blocks = getattr(target, "head_blocks", None)
        blocks = None
        if head_rows is not None and head_blocks is not None:
            blocks = {"": head_blocks.select_rows(head_rows)}
        use_rows_kernel(module, skip, blocks=blocks)
    elif getattr(target, "packed_weights", None) is not None:
        use_packed_linears(module, target.packed_weights, skip)


def describe_linear_path(target) -> str:
    """One line for the start-up log: the CPU linear path `load_models` chose for `target`, and why."""
    if getattr(target, "rows_kernel", False):
        return f"CPU linears: the row kernel (rows_linear.c), {getattr(target, 'linear_weights', 'fp32 panels')}"
    why = rows_kernel_status().splitlines()[0]
    if getattr(target, "packed_weights", None) is not None:
        return f"CPU linears: MKL packs, the fallback (no row kernel: {why})"
    return f"CPU linears: F.linear (no row kernel: {why}; MKL packs unavailable or switched off)"
