"""The embedded target's linears as the GGUF's own Q4_1 / Q8_0 blocks: block panels for the row kernel.

The embedded SmolLM2 ships as a GGUF (Q4_1 linears, a Q8_0 embedding tied to the LM head), which
`target.convert_embedded` dequantises once to fp32 through transformers' GGUF loader. Every fp32 weight is
then exactly what `gguf.quants` computes from its block, so the row kernel can stream the blocks instead,
~96 MB instead of ~540 MB per pass, and rebuild each weight bit for bit in registers (rows_linear.c, "GGUF
blocks"): every output stays what the fp32 panels give. This module
- maps each `nn.Linear` to its GGUF tensor and to the row order the conversion gave it: transformers'
  llama loader un-permutes q and k for RoPE (its own function is applied to the row numbers here), and
  the head is the tied embedding;
- re-lays the blocks into panels (`q4_1_panels`, `q8_0_panels`), cached beside the converted checkpoint,
  since parsing the GGUF takes seconds;
- checks at every load that each linear's rebuilt weights equal its fp32 weights element for element: a
  linear that fails keeps its fp32 panels, and the start-up line says how many stream blocks.

`DARTREE_WEIGHTS=fp32` keeps the fp32 panels for every linear (`weights_choice` reads it, nowhere else).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import UserError
from .rows_kernel import PANEL, QK, BlockPanels, rebuild_mismatches, rows_kernel_available
from .target import EMBEDDED_NAME, converted_dir, embedded_gguf_path

WEIGHTS_ENV = "DARTREE_WEIGHTS"
WEIGHTS_CHOICES = ("gguf", "fp32")
CACHE_FILE = "gguf-panels.safetensors"  # inside the converted checkpoint: rebuilt along with it
LAYOUT = "1"  # bump when the block panel layout of rows_linear.c changes
GGUF_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # one GGUF block: Q4_1 d, m (fp16), 16 nibble bytes; Q8_0 d, 32 int8


def weights_choice() -> str:
    """`gguf` (the default: block panels wherever a linear has exact ones) or `fp32` (fp32 panels only)."""
    value = os.environ.get(WEIGHTS_ENV, "").strip().lower() or "gguf"
    if value not in WEIGHTS_CHOICES:
        raise UserError(f"{WEIGHTS_ENV}={value!r} is not a choice: use {' or '.join(WEIGHTS_CHOICES)}")
    return value


def _panel_blocks(rows: np.ndarray, kind: str) -> np.ndarray:
    """GGUF rows [n, k / 32 * block bytes] -> [ceil(n / 32), k / 32, 32 columns, block bytes], zero-padded
    (a zero block rebuilds zero weights: d = m = 0)."""
    n, kb = rows.shape[0], rows.shape[1] // GGUF_BLOCK_BYTES[kind]
    padded = np.zeros((-(-n // PANEL) * PANEL, rows.shape[1]), dtype=np.uint8)
    padded[:n] = rows
    return padded.reshape(-1, PANEL, kb, GGUF_BLOCK_BYTES[kind]).transpose(0, 2, 1, 3)


def q4_1_panels(rows: np.ndarray) -> np.ndarray:
    """GGUF Q4_1 rows -> block panels [ceil(n / 32), k / 32, 640]: d[32] | m[32] | q[32 k][16] (rows_linear.c).

    A GGUF Q4_1 block holds its 32 weights' 4-bit values as 16 bytes: byte i has weight i in its low nibble
    and weight i + 16 in its high one. The panel regroups them by k: byte t of q[kk] has column t's value
    at k = kk in its low nibble and column t + 16's in its high one.
    """
    blocks = _panel_blocks(rows, "q4_1")  # [panels, kb, column, 20]
    panels, kb = blocks.shape[:2]
    nibbles = blocks[..., 4:]  # [panels, kb, column, 16]
    q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).transpose(0, 1, 3, 2)  # [panels, kb, k, column]
    packed = q[..., :PANEL // 2] | (q[..., PANEL // 2:] << 4)  # [panels, kb, k, 16]
    return np.concatenate([blocks[..., 0:2].reshape(panels, kb, -1), blocks[..., 2:4].reshape(panels, kb, -1),
                           packed.reshape(panels, kb, -1)], axis=-1)


def q8_0_panels(rows: np.ndarray) -> np.ndarray:
    """GGUF Q8_0 rows -> block panels [ceil(n / 32), k / 32, 1088]: d[32] | q[32 k][32 columns] (rows_linear.c)."""
    blocks = _panel_blocks(rows, "q8_0")  # [panels, kb, column, 34]
    panels, kb = blocks.shape[:2]
    q = blocks[..., 2:].transpose(0, 1, 3, 2)  # [panels, kb, k, column]
    return np.concatenate([blocks[..., 0:2].reshape(panels, kb, -1), q.reshape(panels, kb, -1)], axis=-1)


RELAY = {"q4_1": q4_1_panels, "q8_0": q8_0_panels}


def block_panels(rows: np.ndarray, kind: str, k: int) -> BlockPanels:
    """GGUF rows of `kind` holding an [n, k] weight -> its `BlockPanels`."""
    data = torch.from_numpy(np.ascontiguousarray(RELAY[kind](rows)))
    return BlockPanels(kind, data, rows.shape[0], k)


def panels_from_gguf(model: torch.nn.Module, gguf_path: Path) -> dict[str, BlockPanels]:
    """Block panels for every `nn.Linear` of `model` whose weight a Q4_1 or Q8_0 tensor of the GGUF holds,
    in the row order the conversion gave it. Unchecked: `exact_block_panels` checks them."""
    # deferred: gguf parsing and transformers' GGUF helpers are needed only when the cache is (re)built
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    reader = gguf.GGUFReader(gguf_path)
    arch = reader.fields["general.architecture"].contents()
    arch_id = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    # the processor the conversion used, applied to row numbers: it says where each converted row came from
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=model.config.to_dict())
    embedding = model.get_input_embeddings()
    embedding_name = next(name for name, module in model.named_modules() if module is embedding)
    kinds = {gguf.GGMLQuantizationType.Q4_1: "q4_1", gguf.GGMLQuantizationType.Q8_0: "q8_0"}
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        tied = module.weight is embedding.weight  # the tied head: the embedding's tensor
        source = tensors.get(f"{names.get_name(embedding_name if tied else name)}.weight")
        if source is None or source.tensor_type not in kinds:
            continue
        n, k = module.weight.shape
        rows = np.asarray(source.data)
        order = processor.process(weights=np.arange(rows.shape[0])[:, None], name=source.name).weights
        if rows.shape[0] != n or order.shape != (n, 1) or k % QK:
            continue  # not a plain row permutation of this weight: it keeps its fp32 panels
        out[name] = block_panels(rows[order[:, 0]], kinds[source.tensor_type], k)
    return out


def _stamp(gguf_path: Path) -> dict[str, str]:
    return {"gguf": str(gguf_path), "gguf_bytes": str(gguf_path.stat().st_size), "layout": LAYOUT}


def cached_panels_from_gguf(model: torch.nn.Module, gguf_path: Path, cache: Path) -> dict[str, BlockPanels]:
    """`panels_from_gguf`, kept in the safetensors file `cache` (stamped with the GGUF and the layout)."""
    stamp = _stamp(gguf_path)
    if cache.is_file():
        try:
            with safe_open(cache, framework="pt") as f:
                meta = f.metadata() or {}
                if {key: meta.get(key) for key in stamp} == stamp:
                    shapes = json.loads(meta["panels"])
                    return {name: BlockPanels(kind, f.get_tensor(name), n, k)
                            for name, (kind, n, k) in shapes.items()}
        except (OSError, ValueError, KeyError, SafetensorError):  # a damaged cache: made again below
            pass
    print(f"[dartree] re-laying the GGUF's blocks for the row kernel into {cache} (once, ~10 s)",
          file=sys.stderr, flush=True)
    panels = panels_from_gguf(model, gguf_path)
    meta = dict(stamp, panels=json.dumps({name: [p.kind, p.n, p.k] for name, p in panels.items()}))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache.parent) as tmp:  # write, then rename: never half a file
            save_file({name: p.data for name, p in panels.items()}, Path(tmp) / cache.name, metadata=meta)
            os.replace(Path(tmp) / cache.name, cache)
    except OSError as exc:  # a read-only or full cache: this process still has the panels
        print(f"[dartree] could not cache the block panels ({exc}): they will be re-laid at the next start",
              file=sys.stderr, flush=True)
    return panels


def exact_block_panels(model: torch.nn.Module, panels: dict[str, BlockPanels]) -> dict[str, BlockPanels]:
    """The panels whose rebuilt weights equal their linear's fp32 weights, every element."""
    modules = dict(model.named_modules())
    return {name: p for name, p in panels.items()
            if name in modules and tuple(modules[name].weight.shape) == (p.n, p.k)
            and rebuild_mismatches(p, modules[name].weight) == 0}


def head_block_panels(target, blocks: dict[str, BlockPanels]) -> BlockPanels | None:
    """The embedded target's LM head as its exact Q8_0 block panels, whichever weights its own linears stream.

    The drafter's draft head is a row slice of this head (`BlockPanels.select_rows`, `route_like_target`): its
    blocks rebuild the same fp32 weights bit for bit, so the draft's logits are unchanged while a round
    reads ~10 MB instead of the ~38 MB of fp32 rows (16,384 x 576). DARTREE_WEIGHTS governs what the target's
    passes stream, and plain decoding never uses the draft head, so it holds on both. `blocks`: the ones the
    target already has (`target_block_panels`), else they are read from the panels cache.
    """
    head = target.model.get_output_embeddings()
    name = next((n for n, m in target.model.named_modules() if m is head), None)
    if name in blocks:
        return blocks[name]
    if _without_gguf_blocks(target):
        return None
    found = _embedded_panels(target)
    return exact_block_panels(target.model, {name: found[name]}).get(name) if name in found else None


def _without_gguf_blocks(target) -> str | None:
    """Why `target` cannot stream GGUF blocks (the start-up log's words), or None where it can."""
    if target.name != EMBEDDED_NAME:
        return "fp32 panels (no GGUF behind this target)"
    if target.device.type != "cpu" or target.dtype != torch.float32 or not rows_kernel_available():
        return "fp32 panels"  # the row kernel is a CPU fp32 path: it does not run here
    return None


def _embedded_panels(target) -> dict[str, BlockPanels]:
    """Every linear's block panels of the embedded target's GGUF, from the panels cache."""
    return cached_panels_from_gguf(target.model, embedded_gguf_path(), converted_dir() / CACHE_FILE)


def target_block_panels(target) -> tuple[dict[str, BlockPanels], str]:
    """The block panels `load_models` gives the target's linears, and the start-up log's words for them.

    Only the embedded target has a GGUF behind its weights; other targets, a GPU, or DARTREE_WEIGHTS=fp32
    keep fp32 panels.
    """
    if weights_choice() == "fp32":
        return {}, f"fp32 panels ({WEIGHTS_ENV}=fp32)"
    reason = _without_gguf_blocks(target)
    if reason:
        return {}, reason
    linears = sum(isinstance(m, torch.nn.Linear) for m in target.model.modules())
    found = _embedded_panels(target)
    exact = exact_block_panels(target.model, found)
    kinds = "/".join(sorted({p.kind.upper() for p in exact.values()}))
    words = f"the GGUF's {kinds} blocks for {len(exact)} of {linears} linears" if exact else "fp32 panels"
    if len(exact) < linears:
        words += f" ({linears - len(exact)} on fp32 panels: {len(found) - len(exact)} rebuilt inexactly)"
    return exact, words
