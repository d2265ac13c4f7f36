"""Teacher-forced evaluation of a drafter.

`evaluate_chain` measures, on held-out sequences, the top-1 accuracy of each block position with the
base and with the corrected logits, and the accepted length of a single greedy chain: with GRU states
teacher-forced on the true path, a chain's drafts are exactly what the decoder would propose as long as
every earlier one was right, so "consecutive correct from position 1" is the chain's acceptance and
``tau_chain = 1 + mean(accepted)`` (the +1 is the target's own token). Tree decoding (the real τ) is
measured by the decoding engine; the card (:mod:`.card`) takes its results through ``eval_results``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .batch import autocast, build_batch, drafter_logits, to_draft_labels


def eval_anchors(anchors: np.ndarray, n: int) -> np.ndarray:
    """Evenly spaced anchors (deterministic, covers the whole response)."""
    if len(anchors) <= n:
        return anchors
    return anchors[np.linspace(0, len(anchors) - 1, n).round().astype(int)]


@torch.no_grad()
def evaluate_chain(target, drafter, store, seq_ids, anchors_per_seq: int = 8, seqs_per_batch: int = 4,
                   autocast_mode: str = "off") -> dict:
    """Per-position top-1 accuracy and chain acceptance; `autocast_mode="bf16"` for the cheap periodic
    evaluations during training (the final one runs in fp32, like inference)."""
    was_training = drafter.training
    drafter.eval()
    K = drafter.block_size
    device = next(drafter.parameters()).device
    hits_b = np.zeros(K - 1)
    hits_c = np.zeros(K - 1)
    count = np.zeros(K - 1)
    acc_len_b, acc_len_c = [], []
    ce_b = ce_c = 0.0
    n_valid = 0
    for s in range(0, len(seq_ids), seqs_per_batch):
        seqs = list(seq_ids[s:s + seqs_per_batch])
        anchors = [eval_anchors(store.anchors(i), anchors_per_seq) for i in seqs]
        batch = to_draft_labels(drafter, build_batch(store, seqs, anchors, K, drafter.cfg.mask_token_id).to(device))
        with autocast(autocast_mode, device.type):
            base, corrected = drafter_logits(target, drafter, batch)
        base = base.float()
        corrected = base if corrected is None else corrected.float()
        valid = batch.valid
        for logits, hits, lens in ((base, hits_b, acc_len_b), (corrected, hits_c, acc_len_c)):
            ok = (logits.argmax(-1) == batch.labels) & valid  # [b, A, K-1]
            hits += ok.sum((0, 1)).cpu().numpy()
            chain = ok.long().cumprod(-1).sum(-1)  # consecutive correct from position 1
            block_ok = valid[..., 0]
            lens.extend(chain[block_ok].tolist())
        count += valid.sum((0, 1)).cpu().numpy()
        v = (valid & (batch.labels >= 0)).reshape(-1)  # cross-entropy only where the label can be drafted
        lab = batch.labels.reshape(-1)[v]
        ce_b += float(F.cross_entropy(base.reshape(-1, base.shape[-1])[v], lab, reduction="sum"))
        ce_c += float(F.cross_entropy(corrected.reshape(-1, corrected.shape[-1])[v], lab, reduction="sum"))
        n_valid += int(v.sum())
    if was_training:
        drafter.train()
    c = np.maximum(count, 1)
    return {
        "acc_base": (hits_b / c).round(4).tolist(),
        "acc_corr": (hits_c / c).round(4).tolist(),
        "tau_base": float(1 + np.mean(acc_len_b)) if acc_len_b else 1.0,
        "tau_corr": float(1 + np.mean(acc_len_c)) if acc_len_c else 1.0,
        "ce_base": ce_b / max(n_valid, 1),
        "ce_corr": ce_c / max(n_valid, 1),
        "blocks": len(acc_len_b),
        "sequences": len(seq_ids),
    }


def format_eval(ev: dict) -> str:
    b = " ".join(f"{a:.2f}" for a in ev["acc_base"])
    c = " ".join(f"{a:.2f}" for a in ev["acc_corr"])
    return (f"tau_chain base {ev['tau_base']:.2f} corr {ev['tau_corr']:.2f} | acc@k base [{b}] corr [{c}] "
            f"| ce base {ev['ce_base']:.3f} corr {ev['ce_corr']:.3f} ({ev['blocks']} blocks)")
