"""On-policy training data: the target's own greedy answers to the training prompts, with its features.

Why on-policy: at decode time the drafter has to predict what *this* target says next, so the best
training text is the target's greedy output, not the datasets' reference answers.

Why features are saved during generation: the drafter reads the hidden states of a few target layers.
They fall out of the generation forward for free (``output_hidden_states``), while a second pass would
cost as much as the prefill of every sequence again. They are large (2880 fp16 values a token), so they
live in the cache dir and are never committed; the token ids are small and ARE committed, so a fresh
checkout can rebuild the features with one teacher-forced pass (:func:`recompute_features`).

Layout (``K`` = shard number, ``S`` = shard size in prompts; shard K holds prompts [K*S, (K+1)*S) of the
file order):

- ``assets/train_data/<preset>/tokens-KKKKK.npz``: ``ids`` uint16 (all sequences concatenated),
  ``offsets`` int64 [n+1], ``prompt_index`` int32 [n], ``prompt_len`` int32 [n];
- ``$DARTREE_CACHE/train/<preset>/features-KKKKK.npy``: fp16 [sum(len_i - 1), L*h], sequence i's rows at
  ``offsets[i] - i : offsets[i+1] - i - 1`` (every token except the last one, i.e. every token whose KV
  entered the cache); see :func:`feature_offsets`.

Every file is written to a temporary name and renamed, so a killed run never leaves a half shard and a
restart simply skips finished shards.

Which prompts a shard holds is a *plan*: :class:`PromptList` (shard K = prompts [K*S, (K+1)*S) of the
training file, the first preset) or :class:`.mix.MixPlan` (real, long-context and Magpie shards). The
generation loop itself is in :mod:`.stream`. Run it with ``OMP_WAIT_POLICY=PASSIVE`` when the cores are
shared: with the default spinning OpenMP threads, steps sometimes took 6 s instead of 0.7 s under contention.

Rows from :data:`RESERVED_FROM_ROW` on of ``train_prompts.jsonl`` are reserved for measurement
(``dev_long_prompts.jsonl`` is made of them): :func:`load_prompts` never returns them and
:func:`guard_rows` refuses them wherever a shard records its rows.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm import tqdm

from ..models.cache_dir import cache_root
from ..models.target import Target
from ..shards import list_shards, read_tokens, sequences, tokens_path
from .stream import Generated, generate_stream, recompute_features

REPO_ROOT = Path(__file__).resolve().parents[2]
RESERVED_FROM_ROW = 18_515  # train_prompts.jsonl rows >= this are measurement prompts: never trained on


# ---------------------------------------------------------------------------------------------- paths
def data_dir() -> Path:
    """The shared prompt sets: ``../shared/data`` beside the repo unless ``$DARTREE_DATA`` says otherwise."""
    return Path(os.environ.get("DARTREE_DATA", REPO_ROOT.parent / "shared" / "data")).expanduser()


def tokens_dir(preset: str) -> Path:
    """Committed token ids (small)."""
    return Path(os.environ.get("DARTREE_TRAIN_TOKENS", REPO_ROOT / "assets" / "train_data")) / preset


def features_dir(preset: str) -> Path:
    """Uncommitted fp16 features (large)."""
    return cache_root() / "train" / preset


def features_path(folder: Path, shard: int) -> Path:
    return Path(folder) / f"features-{shard:05d}.npy"


def load_prompts(path: Path | None = None) -> list[str]:
    """Prompts of the training file in file order (the file is pre-shuffled, so a prefix is a fair mix),
    up to the reserved rows."""
    path = Path(path) if path is not None else data_dir() / "train_prompts.jsonl"
    if path.name.startswith("dev_"):
        raise ValueError("refusing to generate training data from a dev prompt file")
    with open(path) as fh:
        return [json.loads(line)["prompt"] for line in fh if line.strip()][:RESERVED_FROM_ROW]


def guard_rows(rows) -> None:
    """Refuse training-file rows from the reserved range (-1 marks a prompt that is not a file row)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and rows.max() >= RESERVED_FROM_ROW:
        raise ValueError(f"train_prompts.jsonl row {int(rows.max())} is reserved for measurement "
                         f"(rows >= {RESERVED_FROM_ROW}); it must never become training data")


def truncate_prompt(ids: list[int], max_tokens: int) -> list[int]:
    """Drop the middle of an over-long prompt: the start (system/user opening) and the end (the question
    and the assistant header the target must see last) are what matter for the answer."""
    if len(ids) <= max_tokens:
        return list(ids)
    head = max_tokens // 2
    return list(ids[:head]) + list(ids[len(ids) - (max_tokens - head):])
def tokenize_prompts(target: Target, texts: list[str], max_prompt_tokens: int) -> list[list[int] | None]:
    """Chat-template ids of each prompt, cut to `max_prompt_tokens` (None: an empty prompt, skipped)."""
    return [truncate_prompt(target.chat_ids(t), max_prompt_tokens) if t and str(t).strip() else None for t in texts]


# ---------------------------------------------------------------------------------------------- shards
def _atomic_save(path: Path, save_fn) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}" + path.suffix)
    try:
        save_fn(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_tokens(path: Path, seqs: list[Generated], prompt_index: list[int], extra: dict | None = None,
                 stats: dict | None = None) -> None:
    """A token shard; `extra` holds more per-sequence arrays (e.g. ``train_row``, ``source``), `stats` a
    JSON record of how the shard was made (e.g. the Magpie filter's counts)."""
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s.ids) for s in seqs])
    ids = np.concatenate([np.asarray(s.ids, dtype=np.uint16) for s in seqs]) if seqs else np.zeros(0, np.uint16)
    arrays = {"ids": ids, "offsets": offsets, "prompt_index": np.asarray(prompt_index, np.int32),
              "prompt_len": np.asarray([s.prompt_len for s in seqs], np.int32), **(extra or {})}
    if "train_row" in arrays:
        guard_rows(arrays["train_row"])
    if stats is not None:
        arrays["stats"] = np.array(json.dumps(stats))

    def save(tmp):
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)
    _atomic_save(Path(path), save)


def feature_offsets(offsets: np.ndarray) -> np.ndarray:
    """Row offsets into a features shard: sequence i has len_i - 1 rows."""
    return offsets - np.arange(len(offsets))


def write_features(path: Path, feats: list[np.ndarray]) -> None:
    def save(tmp):
        with open(tmp, "wb") as fh:
            np.save(fh, np.concatenate(feats).astype(np.float16) if feats else np.zeros((0, 0), np.float16))
    _atomic_save(Path(path), save)


def check_manifest(folder: Path, manifest: dict) -> None:
    """Resuming with other settings would mix incompatible shards: refuse instead."""
    path = Path(folder) / "manifest.json"
    if path.is_file():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in manifest.items() if old.get(k) != v}
        if diff:
            raise SystemExit(f"{path} was written with other settings {diff}; use another --out or delete it")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- plans
@dataclass
class ShardPrompts:
    """What one shard holds: prompt token ids, their `prompt_index`, more per-prompt arrays, and stats."""
    prompts: list[list[int]]
    index: list[int]
    extra: dict[str, list] = field(default_factory=dict)
    stats: dict | None = None


class Plan(Protocol):
    n_shards: int

    def shard(self, k: int) -> ShardPrompts: ...


class PromptList:
    """Shard K = prompts [K*S, (K+1)*S) of a list (None: a skipped prompt)."""

    def __init__(self, prompts: list[list[int] | None], shard_size: int):
        self.prompts, self.shard_size = prompts, shard_size
        self.n_shards = (len(prompts) + shard_size - 1) // shard_size

    def shard(self, k: int) -> ShardPrompts:
        S = self.shard_size
        idx = [i for i in range(k * S, min(len(self.prompts), (k + 1) * S)) if self.prompts[i] is not None]
        return ShardPrompts([self.prompts[i] for i in idx], idx)


def generate_shards(target: Target, plan: Plan, *, tok_dir: Path, feat_dir: Path | None, batch_size: int,
                    max_new_tokens: int, feature_layers=(), deadline: float | None = None, progress=True,
                    log=print, on_shard=None, **stream_kw) -> dict:
    """Generate every missing shard of `plan`, in shard order, through one continuous batch.

    A shard's prompts are asked of the plan only when the batch needs them (Magpie shards sample theirs
    then), length-sorted inside the shard; a shard is written as soon as its last sequence is done. After
    `deadline` (a time.time() value) no new shard is started, and the started ones are finished: a stage
    of a bounded length that loses no work. `on_shard(k)` runs after each written shard.
    """
    have = set(list_shards(tok_dir))
    todo = [k for k in range(plan.n_shards) if k not in have]
    stats = {"shards": 0, "sequences": 0, "new_tokens": 0, "seconds": 0.0}
    bar = tqdm(unit="seq", disable=not progress, mininterval=5 if sys.stderr.isatty() else 60, dynamic_ncols=True)
    t0 = time.time()
    planned: dict[int, ShardPrompts] = {}
    results: dict[int, dict[int, Generated]] = {}

    def write_shard(k: int) -> None:
        sp = planned.pop(k)
        seqs = [results[k][j] for j in range(len(sp.prompts))]
        if feat_dir is not None and feature_layers:
            write_features(features_path(feat_dir, k), [g.features for g in seqs])
        write_tokens(tokens_path(tok_dir, k), seqs, sp.index, {key: np.asarray(v) for key, v in sp.extra.items()},
                     sp.stats)  # written last: marks the shard done
        new_tok = sum(len(g.ids) - g.prompt_len for g in seqs)
        stats["shards"] += 1
        stats["sequences"] += len(seqs)
        el = time.time() - t0
        log(f"[datagen] shard {k:05d}: {len(seqs)} seqs, {new_tok} new tokens; total {stats['sequences']} seqs, "
            f"{stats['new_tokens']} new tokens in {el:.0f}s ({stats['new_tokens'] / max(el, 1e-9):.0f} tok/s)")
        sys.stdout.flush()
        del results[k]
        if on_shard is not None:
            on_shard(k)

    def items():
        for k in todo:
            if deadline is not None and time.time() > deadline:
                log(f"[datagen] time is up: no new shard after {k - 1:05d}")
                return
            sp = planned[k] = plan.shard(k)
            results[k] = {}
            if not sp.prompts:
                write_shard(k)
                continue
            bar.total = (bar.total or 0) + len(sp.prompts)
            for j in sorted(range(len(sp.prompts)), key=lambda j: (len(sp.prompts[j]), j)):  # little padding
                yield (k, j), sp.prompts[j]

    def on_done(key, g: Generated) -> None:
        k, j = key
        results[k][j] = g
        stats["new_tokens"] += len(g.ids) - g.prompt_len
        bar.update(1)
        bar.set_postfix(tok_s=f"{stats['new_tokens'] / (time.time() - t0):.0f}", refresh=False)
        if len(results[k]) == len(planned[k].prompts):
            write_shard(k)

    generate_stream(target, items(), max_new_tokens, feature_layers, batch_size=batch_size, on_done=on_done,
                    **stream_kw)
    bar.close()
    stats["seconds"] = time.time() - t0
    return stats


def fill_missing_features(target: Target, tok_dir: Path, feat_dir: Path, feature_layers, batch_size=8,
                          progress=True, log=print, max_shards: int | None = None, first_shard: int = 0) -> int:
    """Teacher-forced pass for shards whose features are absent (e.g. a fresh checkout); only shards
    [first_shard, max_shards) when given (features take ~6 kB a token: all of a preset may not fit the disk)."""
    shards = list_shards(tok_dir, first_shard, max_shards)
    missing = [k for k in shards if not features_path(feat_dir, k).is_file()]
    for k in tqdm(missing, unit="shard", disable=not progress):
        t = read_tokens(tokens_path(tok_dir, k))
        seqs = [s.ids.tolist() for s in sequences(t)]
        write_features(features_path(feat_dir, k), recompute_features(target, seqs, feature_layers, batch_size))
    if missing:
        log(f"[datagen] recomputed features of {len(missing)} shards")
    return len(missing)

