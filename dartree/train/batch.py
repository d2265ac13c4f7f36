"""One training batch of drafter blocks: building it, the drafter's logits on it, its labels and its loss.

One training example is a *block*: an anchor position p inside a response. The drafter sees the projected
target features of positions < p as context and the block [x_p, MASK x (K-1)] at positions p..p+K-1, and
must predict x_{p+1..p+K-1}. Many blocks of one sequence share one context: the context keys/values are
built once per sequence and all its blocks are concatenated along the query axis, with an attention mask
that lets block j see the context columns < p_j and its own K columns only (bidirectional inside the
block). Sequences are padded into a batch.

The trainer (:mod:`.trainer`) and the evaluation (:mod:`.evaluate`) both read their batches from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from ..models.drafter import DominoDrafter
from ..models.target import Target


@dataclass
class Batch:
    ctx_features: torch.Tensor  # [b, S, L*h]
    ctx_positions: torch.Tensor  # [b, S]
    block_ids: torch.Tensor  # [b, A*K] anchor + MASKs
    block_positions: torch.Tensor  # [b, A*K]
    attn_mask: torch.Tensor  # [b, 1, A*K, S + A*K] bool
    path_ids: torch.Tensor  # [b, A, K-1]: x_p .. x_{p+K-2} (GRU inputs)
    labels: torch.Tensor  # [b, A, K-1]: x_{p+1} .. x_{p+K-1}
    valid: torch.Tensor  # [b, A, K-1] bool

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def build_batch(store: SeqStore, seq_ids: list[int], anchors: list[np.ndarray], block_size: int,
                mask_token_id: int) -> Batch:
    """Stack the blocks of several sequences (anchors[j] are sequence j's anchor positions)."""
    K = block_size
    b = len(seq_ids)
    A = max(1, max(len(a) for a in anchors))
    S = max(len(store.ids(i)) - 1 for i in seq_ids)
    L = store.features(seq_ids[0]).shape[-1]
    ctx = torch.zeros(b, S, L)
    ctx_pos = torch.zeros(b, S, dtype=torch.long)
    block_ids = torch.full((b, A * K), mask_token_id, dtype=torch.long)
    block_pos = torch.zeros(b, A * K, dtype=torch.long)
    mask = torch.zeros(b, 1, A * K, S + A * K, dtype=torch.bool)
    path = torch.zeros(b, A, K - 1, dtype=torch.long)
    labels = torch.zeros(b, A, K - 1, dtype=torch.long)
    valid = torch.zeros(b, A, K - 1, dtype=torch.bool)
    for r, (i, anc) in enumerate(zip(seq_ids, anchors)):
        x = torch.from_numpy(store.ids(i))
        n = len(x)
        f = store.features(i)
        ctx[r, :n - 1] = f
        ctx_pos[r, :n - 1] = torch.arange(n - 1)
        for j in range(A):
            rows = slice(j * K, (j + 1) * K)
            # Every block row sees its own block, so no query row is fully masked (padding blocks too).
            mask[r, 0, rows, S + j * K:S + (j + 1) * K] = True
            if j >= len(anc):
                continue
            p = int(anc[j])
            block_ids[r, j * K] = x[p]
            block_pos[r, rows] = torch.arange(p, p + K)
            mask[r, 0, rows, :p] = True
            m = min(K - 1, n - 1 - p)  # labels that exist
            labels[r, j, :m] = x[p + 1:p + 1 + m]
            path[r, j, :m] = x[p:p + m]
            valid[r, j, :m] = True
    return Batch(ctx, ctx_pos, block_ids, block_pos, mask, path, labels, valid)


def drafter_logits(target: Target, drafter: DominoDrafter, batch: Batch):
    """Base and corrected logits [b, A, K-1, V] of a batch (teacher-forced GRU states)."""
    K = drafter.block_size
    b, AK = batch.block_ids.shape
    A = AK // K
    with torch.no_grad():
        block_emb = target.embed(batch.block_ids).float()
        path_emb = target.embed(batch.path_ids.view(b * A, K - 1)).float()
    ctx_kv = drafter.context_kv(batch.ctx_features, batch.ctx_positions)
    mask = batch.attn_mask
    h = drafter.block_hidden(block_emb, batch.block_positions, ctx_kv, attn_mask=mask)
    # the rows that draft depths 1..K-1 (the labels' depths): rows 1..K-1 (slot 0 is the anchor), or with
    # a shift-label drafter rows 0..K-2 (the anchor's row drafts depth 1); DrafterConfig.first_draft_row
    z = drafter.draft_rows(h.view(b, A, K, -1), K - 1)
    if z.dtype != target.dtype and not torch.is_autocast_enabled(z.device.type):
        z = z.to(target.dtype)  # a bf16 target without autocast
    base = drafter.base_logits(z, target)
    corrected = None
    if drafter.cfg.has_correction:
        states = drafter.gru_scan(path_emb).view(b, A, K - 1, -1)
        corr = drafter.correction(z, states)
        prefix = drafter.cfg.pure_draft_prefix_len
        if prefix > 0:
            keep = (torch.arange(1, K, device=corr.device) > prefix).to(corr.dtype)
            corr = corr * keep[:, None]
        corrected = base + corr
    return base, corrected


def autocast(mode: str, device_type: str = "cpu"):
    """bf16 autocast for the matmuls (the full-vocab logits dominate a step); weights stay fp32."""
    if mode not in ("bf16", "off"):
        raise ValueError(f"unknown autocast mode {mode!r}: bf16 or off")
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=mode == "bf16")


def position_weights(K: int, gamma: float) -> torch.Tensor:
    return torch.exp(-torch.arange(K - 1, dtype=torch.float32) / gamma)


def to_draft_labels(drafter: DominoDrafter, batch: Batch) -> Batch:
    """Labels as columns of the drafter's logits. With a draft vocabulary, a label outside it can never be
    drafted: it becomes column -1, which `weighted_ce` skips and the evaluation counts as a miss."""
    if drafter.draft_vocab is None:
        return batch
    return replace(batch, labels=drafter.to_draft_columns(batch.labels))


def weighted_ce(logits: torch.Tensor, batch: Batch, weights: torch.Tensor) -> torch.Tensor:
    """Position-weighted cross-entropy over valid labels (labels of -1, outside a draft vocabulary, skipped)."""
    valid = batch.valid & (batch.labels >= 0)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.labels.clamp(min=0).reshape(-1),
                         reduction="none").view(batch.labels.shape)
    w = weights.view(1, 1, -1) * valid
    return (ce * w).sum() / w.sum().clamp(min=1e-9)
