"""Teacher-forced evaluation of a drafter and the training card.

`evaluate_chain` measures, on held-out sequences, the top-1 accuracy of each block position with the
base and with the corrected logits, and the accepted length of a single greedy chain: with GRU states
teacher-forced on the true path, a chain's drafts are exactly what the decoder would propose as long as
every earlier one was right, so "consecutive correct from position 1" is the chain's acceptance and
``tau_chain = 1 + mean(accepted)`` (the +1 is the target's own token). Tree decoding (the real τ) is
measured by the decoding engine; `write_card` takes its results through ``eval_results``.
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .trainer import autocast, build_batch, drafter_logits


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
    hits_b = np.zeros(K - 1)
    hits_c = np.zeros(K - 1)
    count = np.zeros(K - 1)
    acc_len_b, acc_len_c = [], []
    ce_b = ce_c = 0.0
    n_valid = 0
    for s in range(0, len(seq_ids), seqs_per_batch):
        seqs = list(seq_ids[s:s + seqs_per_batch])
        anchors = [eval_anchors(store.anchors(i), anchors_per_seq) for i in seqs]
        batch = build_batch(store, seqs, anchors, K, drafter.cfg.mask_token_id)
        with autocast(autocast_mode):
            base, corrected = drafter_logits(target, drafter, batch)
        base = base.float()
        corrected = base if corrected is None else corrected.float()
        valid = batch.valid
        for logits, hits, lens in ((base, hits_b, acc_len_b), (corrected, hits_c, acc_len_c)):
            ok = (logits.argmax(-1) == batch.labels) & valid  # [b, A, K-1]
            hits += ok.sum((0, 1)).numpy()
            chain = ok.long().cumprod(-1).sum(-1)  # consecutive correct from position 1
            block_ok = valid[..., 0]
            lens.extend(chain[block_ok].tolist())
        count += valid.sum((0, 1)).numpy()
        v = valid.reshape(-1)
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


def git_commit(repo: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no commit yet)"


def write_card(folder: Path, *, command: str, repo: Path, preset: str, preset_config: dict, data: dict,
               train_summary: dict, eval_results: dict, steps: int, wall_seconds: float,
               extra: dict | None = None) -> Path:
    """Write ``TRAINING.md`` beside the exported drafter, from facts only (nothing typed by hand).

    `eval_results` maps a section name to a dict of results (e.g. ``{"teacher_forced_chain": {...},
    "tree_tau_dev": {...}}``), so later evaluations (tree τ from the decoding engine) can be added by
    calling this again with more entries.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Drafter training card: `{preset}`",
        "",
        f"Written by `dartree.train` on {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
        "## Reproduce",
        "",
        "```",
        command,
        "```",
        "",
        f"- git commit: `{git_commit(repo)}`",
        f"- steps: {steps}",
        f"- wall time: {wall_seconds / 60:.1f} min",
        "",
        "## Data",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in data.items()]
    lines += ["", "## Losses (mean of the first / last 50 steps)", ""]
    lines += [f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in train_summary.items()]
    lines += ["", "## Evaluation", ""]
    for name, res in eval_results.items():
        lines += [f"### {name}", ""]
        if isinstance(res, dict) and "acc_base" in res:
            K1 = len(res["acc_base"])
            lines += ["| position | " + " | ".join(str(k + 1) for k in range(K1)) + " |",
                      "|---|" + "---|" * K1,
                      "| top-1 base | " + " | ".join(f"{a:.3f}" for a in res["acc_base"]) + " |",
                      "| top-1 corrected | " + " | ".join(f"{a:.3f}" for a in res["acc_corr"]) + " |", ""]
            rest = {k: v for k, v in res.items() if k not in ("acc_base", "acc_corr")}
        else:
            rest = res if isinstance(res, dict) else {"value": res}
        lines += [f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in rest.items()]
        lines.append("")
    lines += ["## Configuration", "", "```json", json.dumps(preset_config, indent=1), "```", ""]
    if extra:
        lines += ["## Notes", ""] + [f"- {k}: {v}" for k, v in extra.items()] + [""]
    path = folder / "TRAINING.md"
    path.write_text("\n".join(lines))
    return path
