"""The target's forward pass written out, for Llama-architecture targets (the embedded SmolLM2).

transformers' `LlamaModel.forward` spends much of a small model's decoding step outside arithmetic: per
layer it calls about a dozen modules through their hooks and decorators, threads keyword arguments
through each, and looks up the attention function by name. On SmolLM2-135M on this CPU, with the row
kernel streaming the GGUF's blocks, that Python is more than the linears themselves (docs/speed.md,
"The target's own forward"). This file does the same operations, in the same order, on the same
weights, top to bottom as in gpt-fast's model.py, with two fusions that change no bit:

- q/k/v are one row-kernel call, and so are gate/up: the kernel computes every output element as its
  own dot product in a fixed order, whichever other weight rows share the call (`rows_linear.c`), so
  the concatenated weight gives each output exactly as its own weight does;
- RoPE rotates q and k in one pass over the q and k heads: it is elementwise, so each head is rotated
  exactly as on its own.

So with these torch layers the logits and the drafter's features equal transformers' bit for bit
(tests/test_llama_forward.py), and every lossless guarantee stands. Attention is
`dartree.attention.tree_sdpa_forward`, the function transformers would call.

Decoding steps and tree verifies go one step further where every product runs the row kernel: each
decoder layer is one C call (`llama_native.py`, `llama_rows.c`). Those layers differ from transformers'
in the last bits (another reduction order, another exp), but every row they compute is the same function
of its own path whatever the tree around it, so a verified node gets exactly what plain decoding gets,
which is the property losslessness needs. The prefill keeps the torch layers; `DARTREE_NATIVE_LAYERS=0`
keeps them everywhere. Anything this file does not cover (other architectures, biases, a cache with
rows but no mask for several tokens) takes transformers' forward: `LlamaPass.supports` decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.masking_utils import create_causal_mask

from ..attention import TREE_SDPA, tree_sdpa_forward
from .llama_native import NativeLayers
from .rows_kernel import PANEL, BlockPanels, _blocks_of, _panels_of, kernel_applies, linear_key, routed, rows_linear


class FusedLinears:
    """Linears that read the same input, as one row-kernel call when all of them run the kernel.

    Returns the outputs side by side [.., sum of out features], the layout `torch.cat` of the separate
    calls would have. The fused panels are the linears' own panels laid end to end, and each linear then
    keeps a view of its part, so fusing costs no memory. Keyed on the weights' storage and version: should
    a weight change, they are rebuilt. Where the kernel does not apply (a GPU, half precision, a
    gradient), or the panels cannot be laid end to end, it calls the linears one by one.
    """

    def __init__(self, linears: list[torch.nn.Linear]):
        self.linears = linears
        self.sizes = [lin.weight.shape[0] for lin in linears]
        self.total = sum(self.sizes)
        self.key = None
        self.panels = None

    def weights_key(self):
        return tuple([linear_key(lin) for lin in self.linears])

    def current_panels(self):
        """The fused panels for the weights as they are now (None where the linears cannot be fused)."""
        key = self.weights_key()
        if key != self.key:
            self.panels, self.key = self._fuse(), key
        return self.panels

    def _fuse(self):
        """The linears' panels end to end (None where their kinds or padding differ); each linear's cache
        becomes a view of its part (models.rows_kernel keeps `_rows_blocks` / `_rows_panels` per linear)."""
        if any(n % PANEL for n in self.sizes) or not all(map(routed, self.linears)):
            return None
        parts = [_blocks_of(lin) or _panels_of(lin) for lin in self.linears]
        if all(isinstance(p, BlockPanels) for p in parts) and len({p.kind for p in parts}) == 1:
            data = torch.cat([p.data for p in parts])
            fused, views = BlockPanels(parts[0].kind, data, self.total, parts[0].k), []
            for p, rows in zip(parts, _panel_ranges(self.sizes)):
                views.append(("_rows_blocks", BlockPanels(p.kind, data[rows], p.n, p.k)))
        elif all(isinstance(p, torch.Tensor) for p in parts) and len({p.dtype for p in parts}) == 1:
            fused = torch.cat(parts)
            views = [("_rows_panels", fused[rows]) for rows in _panel_ranges(self.sizes)]
        else:
            return None
        for lin, (name, view) in zip(self.linears, views):
            lin.__dict__[name] = (linear_key(lin), view)
        return fused

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _kernel_call(self.linears[0], x):
            panels = self.current_panels()
            if panels is not None:
                return rows_linear(x, panels, self.total)
        outs = [lin(x) for lin in self.linears]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def _panel_ranges(sizes: list[int]) -> list[slice]:
    """The panel rows of each of several weights laid end to end (sizes are multiples of PANEL)."""
    ends = torch.tensor(sizes).cumsum(0).div(PANEL, rounding_mode="floor").tolist()
    return [slice(a, b) for a, b in zip([0] + ends[:-1], ends)]


def _kernel_call(linear: torch.nn.Linear, x: torch.Tensor) -> bool:
    """Whether `linear(x)` would run the row kernel: it is routed, and the kernel applies to the call."""
    return routed(linear) and kernel_applies(linear, x)


def rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm, op for op (a fused `torch.rms_norm` may round differently)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as transformers' apply_rotary_pos_emb: x [n, heads, d], cos/sin [n, 1, d]."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


@dataclass
class Layer:
    """What one decoder layer's pass reads, gathered once (an nn.Module attribute lookup costs a call)."""

    attn: torch.nn.Module  # transformers' attention module: tree_sdpa_forward reads its groups and scaling
    norm_in: torch.nn.Module
    norm_post: torch.nn.Module
    qkv: FusedLinears
    o: FusedLinears
    gate_up: FusedLinears
    down: FusedLinears

    @staticmethod
    def of(layer) -> "Layer":
        a, m = layer.self_attn, layer.mlp
        return Layer(a, layer.input_layernorm, layer.post_attention_layernorm,
                     FusedLinears([a.q_proj, a.k_proj, a.v_proj]), FusedLinears([a.o_proj]),
                     FusedLinears([m.gate_proj, m.up_proj]), FusedLinears([m.down_proj]))


class LlamaPass:
    """One target's layers, ready for `forward`; built once per loaded target (models.target.load_target)."""

    def __init__(self, model, native: bool = True):
        cfg = model.config
        self.embed, self.rotary, self.norm = model.model.embed_tokens, model.model.rotary_emb, model.model.norm
        self.cfg = cfg
        self.layers = [Layer.of(layer) for layer in model.model.layers]
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.q_heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        # decoding and tree verify through models/llama_rows.c where the kernel runs every product; False (or
        # DARTREE_NATIVE_LAYERS=0 at load) keeps the torch layers, transformers' operations bit for bit
        self.native = NativeLayers(self.layers, self.head_dim, self.q_heads, self.kv_heads) if native else None

    @staticmethod
    def supports(model) -> bool:
        """A plain Llama running `TREE_SDPA` (dartree.attention): no biases, SiLU, every layer full attention."""
        cfg = model.config
        return (cfg.model_type == "llama" and cfg._attn_implementation == TREE_SDPA
                and not getattr(cfg, "attention_bias", False)
                and not getattr(cfg, "mlp_bias", False) and cfg.hidden_act == "silu"
                and not getattr(cfg, "pretraining_tp", 1) > 1
                and len(model.model.layers) == cfg.num_hidden_layers)

    def _mask(self, hidden, attention_mask, position_ids, cache):
        """The mask attention takes: a given 4D mask as is (as transformers does), else transformers' own
        causal mask (None where SDPA's causal flag covers it: the prefill, a single token)."""
        if attention_mask is not None:
            return attention_mask
        return create_causal_mask(config=self.cfg, inputs_embeds=hidden, attention_mask=None,
                                  past_key_values=cache, position_ids=position_ids)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache,
                attention_mask: torch.Tensor | None = None, feature_layers: tuple[int, ...] = ()):
        """Hidden states [n, hidden] after the final norm, and the outputs of layers `feature_layers` side by
        side [n, len(feature_layers) * hidden] (None without any), for `input_ids` [1, n] at
        `position_ids` [1, n] appended to `cache`."""
        n = input_ids.shape[1]
        hq, hkv, d = self.q_heads, self.kv_heads, self.head_dim
        x = self.embed(input_ids)  # [1, n, hidden]
        mask = self._mask(x, attention_mask, position_ids, cache)
        cos, sin = self.rotary(x, position_ids)  # [1, n, d]
        cos, sin = cos[0, :, None], sin[0, :, None]  # [n, 1, d]
        if attention_mask is not None and self.native is not None and self.native.applies(x, cache):  # decoding and tree verify
            x = x[0]
            features = self.native.forward(x, cos, sin, cache, attention_mask, feature_layers)
            return self._finish(x[None], features, feature_layers)
        features = {}
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(rms_norm(layer.norm_in, x)).view(n, hq + 2 * hkv, d)
            qk = rotate(qkv[:, : hq + hkv], cos, sin)  # [n, hq + hkv, d]
            q = qk[:, :hq].transpose(0, 1)[None]  # [1, hq, n, d]
            k = qk[:, hq:].transpose(0, 1)[None]  # [1, hkv, n, d]
            v = qkv[:, hq + hkv:].transpose(0, 1)[None]
            if cache is not None:
                k, v = cache.update(k, v, i)  # [1, hkv, cached + n, d]
            out, _ = tree_sdpa_forward(layer.attn, q, k, v, mask, scaling=layer.attn.scaling)  # [1, n, hq, d]
            x = x + layer.o(out.reshape(1, n, hq * d))
            gate, up = layer.gate_up(rms_norm(layer.norm_post, x)).split(layer.gate_up.sizes, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            if i in feature_layers:
                features[i] = x[0]
        return self._finish(x, features, feature_layers)

    def _finish(self, x: torch.Tensor, features: dict, feature_layers: tuple[int, ...]):
        """The final norm of x [1, n, hidden], and the features side by side."""
        hidden = rms_norm(self.norm, x)[0]
        if len(self.layers) - 1 in features:  # transformers' hidden_states end with the normed output
            features[len(self.layers) - 1] = hidden
        feats = torch.cat([features[i] for i in feature_layers], dim=-1) if feature_layers else None
        return hidden, feats
