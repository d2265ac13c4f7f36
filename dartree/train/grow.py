"""Grow a trained drafter without changing what it computes (capacity legs from a trained start, issue #21).

A capacity comparison from scratch needs many thousand steps a variant before the variants differ by more than
their noise (from scratch, held-out chain τ is about 1.5 after 1,000 steps); this 2-core machine affords about a
thousand steps a variant. So every capacity leg starts from the same trained drafter: the baseline leg fine-tunes
it as it is, the others first grow it here, function-preservingly (the idea of Net2Net, Chen et al. 2016): the
grown drafter's logits equal its parent's, and the new weights are where the extra capacity learns.

- **A backbone layer** is appended after the last one, with its two residual outputs (``self_attn.o_proj`` and
  ``mlp.down_proj``) at zero, so at first it adds nothing to the residual stream. Its other weights are random,
  so the zero outputs get a gradient at the first step.
- **GRU units** (the correction head's width) are added after the old ones: random input and recurrent rows
  (PyTorch's r, z, n gate blocks, each grown), zero recurrent columns from the new units into the old ones (the
  old units never read them), and zero columns for them in ``embed_proj.0`` (the correction never reads them
  yet). The new units' state is nonzero from the first token, so those columns get a gradient at once.

Nothing else changes: the draft vocabulary, the norms, the fc projection and ``embed_proj``'s other weights are
copied. Growing a drafter to its own size returns it unchanged; shrinking one is refused.
"""

from __future__ import annotations

import copy

import torch

from ..errors import UserError
from ..models.drafter import DominoDrafter


@torch.no_grad()
def grow(parent: DominoDrafter, num_layers: int, gru_hidden_dim: int, seed: int = 0) -> DominoDrafter:
    """A drafter with `num_layers` backbone layers and a `gru_hidden_dim`-wide GRU that computes what `parent` does."""
    cfg = parent.cfg
    if num_layers < cfg.num_layers or gru_hidden_dim < cfg.gru_hidden_dim:
        raise UserError(f"a drafter can only grow: {cfg.num_layers} layers / GRU {cfg.gru_hidden_dim} cannot become "
                        f"{num_layers} / {gru_hidden_dim}")
    if gru_hidden_dim != cfg.gru_hidden_dim and not cfg.has_correction:
        raise UserError("this drafter has no correction head, so it has no GRU to widen")
    if (num_layers, gru_hidden_dim) == (cfg.num_layers, cfg.gru_hidden_dim):
        return parent
    raw = copy.deepcopy(cfg.raw)
    raw["num_hidden_layers"] = num_layers
    if cfg.has_correction:
        raw["dflash_config"]["gru_hidden_dim"] = gru_hidden_dim
    torch.manual_seed(seed)
    child = DominoDrafter(raw).to(next(parent.parameters()).device)
    # every tensor whose shape did not change: the old layers, fc, norms, embed_proj.2, the draft vocabulary
    old, new = parent.state_dict(), child.state_dict()
    child.load_state_dict({k: v for k, v in old.items() if k in new and new[k].shape == v.shape}, strict=False)
    for layer in child.layers[cfg.num_layers:]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    if gru_hidden_dim != cfg.gru_hidden_dim:
        _widen_gru(child, old, cfg.gru_hidden_dim, cfg.hidden_size)
    return child.to(dtype=next(parent.parameters()).dtype).keep_gru_fp32().train(parent.training)


def _widen_gru(child: DominoDrafter, old: dict, g_old: int, h: int) -> None:
    """Copy the parent's GRU and correction input into the wider child (module docstring, second point)."""
    g_new = child.cfg.gru_hidden_dim
    w_ih = child.prefix_gru.weight_ih_l0  # [3 g_new, h]: gate blocks r, z, n
    w_hh = child.prefix_gru.weight_hh_l0  # [3 g_new, g_new]
    old_ih = old["prefix_gru.weight_ih_l0"].to(w_ih.dtype)  # [3 g_old, h]
    old_hh = old["prefix_gru.weight_hh_l0"].to(w_hh.dtype)  # [3 g_old, g_old]
    # per gate block: the old units' rows keep their weights; the new units' rows keep their random init
    w_ih.view(3, g_new, h)[:, :g_old] = old_ih.view(3, g_old, h)
    w_hh.view(3, g_new, g_new)[:, :g_old, :g_old] = old_hh.view(3, g_old, g_old)
    w_hh.view(3, g_new, g_new)[:, :g_old, g_old:] = 0  # old units never read the new ones
    first = child.embed_proj[0].weight  # [emb, h + g_new]: input [z ; state]
    old_first = old["embed_proj.0.weight"].to(first.dtype)  # [emb, h + g_old]
    first[:, :h + g_old] = old_first
    first[:, h + g_old:] = 0  # the correction does not read the new units yet
