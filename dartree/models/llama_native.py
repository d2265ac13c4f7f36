"""Decoding and tree verify through `llama_rows.c`: one C call per decoder layer.

`LlamaPass` (models/llama.py) runs a pass here when it has a tree mask (a plain decoding step is the
one-node tree) and every product of the model streams through the row kernel; the prefill keeps the
written-out torch layers. Per layer the C side does the norms, the q/k/v product, RoPE, the KV write,
tree attention, the o product, the gate/up product, SiLU and the down product (the C file says why and
how a row's result stays independent of the tree around it). What stays in Python per pass: the
embedding lookup, the rotary tables, the scratch buffer, the final norm.

The cache must be a `PrefixCache` (models/cache.py): the layer writes the new rows' keys and values into
its buffers in place, as `PrefixLayer.update` would.
"""

from __future__ import annotations

import ctypes
import os

import torch

from ..cache import PrefixCache
from .rows_kernel import BlockPanels, linear_key, load_rows_kernel

KINDS = {torch.float32: 0, torch.bfloat16: 1, "q4_1": 2, "q8_0": 3}  # llama_rows.c's `linear_of`
ARGTYPES = [ctypes.c_void_p] + [ctypes.c_long] * 6 + [ctypes.c_void_p] * 2 + [ctypes.c_float] \
    + [ctypes.c_void_p] * 6 + [ctypes.c_long] * 2 + [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p]


def native_layers_wanted() -> bool:
    """False where `DARTREE_NATIVE_LAYERS=0` (read at load, nowhere else): the torch layers, for A/B runs."""
    return os.environ.get("DARTREE_NATIVE_LAYERS", "1") != "0"


def _kind_and_pointer(panels) -> tuple[int, int]:
    if isinstance(panels, BlockPanels):
        return KINDS[panels.kind], panels.data.data_ptr()
    return KINDS[panels.dtype], panels.data_ptr()


class NativeLayers:
    """The C tables of one `LlamaPass`'s layers: per layer the products' formats and panel pointers.

    Built from the layers' fused panels, and rebuilt when any weight changed since (the same check as
    the fused products make); `None` from `tables()` where some product has no kernel panels.
    """

    def __init__(self, layers, head_dim: int, q_heads: int, kv_heads: int):
        self.layers, self.d, self.hq, self.hkv = layers, head_dim, q_heads, kv_heads
        self.linears = [lin for layer in layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)
                        for lin in f.linears]
        self.key = None
        self.per_layer = None

    def _weights_key(self):
        return tuple([linear_key(lin) for lin in self.linears])  # one flat pass: it runs every forward

    def tables(self):
        key = self._weights_key()
        if key != self.key:
            self.key, self.per_layer = key, self._build()
        return self.per_layer

    def _build(self):
        kernels = load_rows_kernel()
        if not kernels or "llama_layer" not in kernels:
            return None
        kernels["llama_layer"].argtypes = ARGTYPES
        per_layer = []
        for layer in self.layers:
            panels = [f.current_panels() for f in (layer.qkv, layer.o, layer.gate_up, layer.down)]
            if any(p is None for p in panels):
                return None
            kinds, pointers = zip(*map(_kind_and_pointer, panels))
            per_layer.append(((ctypes.c_int * 4)(*kinds), (ctypes.c_void_p * 4)(*pointers), panels))
        return per_layer

    def applies(self, x: torch.Tensor, cache) -> bool:
        return (isinstance(cache, PrefixCache) and x.device.type == "cpu" and x.dtype == torch.float32
                and not torch.is_grad_enabled() and self.tables() is not None)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: PrefixCache,
                attention_mask: torch.Tensor, feature_layers: tuple[int, ...]):
        """x [n, hidden] (updated in place), cos/sin [n, d], `attention_mask` [1, 1, n, prefix + n] (additive;
        only its tree columns are read: every node sees the whole prefix). Returns the features by layer."""
        kernels = load_rows_kernel()
        n, hidden = x.shape
        prefix = cache.layers[0].length
        if attention_mask.shape[-1] != prefix + n or bool(attention_mask[..., :prefix].any()):
            raise ValueError("the native layers take a tree mask: the whole prefix visible, then n tree columns")
        visible = (attention_mask[0, 0, :, prefix:] == 0).to(torch.uint8).contiguous()  # [n, n]
        inter = self.layers[0].gate_up.sizes[0]  # gate and up: two products of `inter` columns
        scratch = torch.empty(kernels["llama_scratch_floats"](n, hidden, self.hq, self.hkv, self.d, prefix, inter))
        cos, sin = cos.contiguous(), sin.contiguous()
        shape_of_rows = x.new_empty(1, self.hkv, 0, self.d)  # what the cache's buffers are shaped like
        features = {}
        for i, (layer, (kinds, pointers, _)) in enumerate(zip(self.layers, self.per_layer)):
            keys = cache.layers[i]
            keys.reserve(prefix + n, shape_of_rows, shape_of_rows)
            kernels["llama_layer"](
                x.data_ptr(), n, hidden, self.hq, self.hkv, self.d, inter, layer.norm_in.weight.data_ptr(),
                layer.norm_post.weight.data_ptr(), layer.norm_in.variance_epsilon, kinds, pointers, cos.data_ptr(),
                sin.data_ptr(), keys.key_buffer.data_ptr(), keys.value_buffer.data_ptr(), keys.key_buffer.shape[2],
                prefix, visible.data_ptr(), layer.attn.scaling, scratch.data_ptr())
            keys.keep(prefix + n)
            if i in feature_layers:
                features[i] = x.clone()
        return features

