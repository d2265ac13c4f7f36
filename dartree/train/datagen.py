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

Speed (2 shared CPU cores): a custom loop, not HF ``generate``: KV buffers written in place (the stock
DynamicCache concatenates the whole cache every step), continuous batching (finished rows leave, new
prompts are prefilled and merged in, so the batch stays full), bf16 weights (AMX: ~4x fp32 here) and
logits for the last row only. Run it with ``OMP_WAIT_POLICY=PASSIVE`` when the cores are shared: with
the default spinning OpenMP threads, steps sometimes took 6 s instead of 0.7 s under contention.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..models.target import Target, cache_root

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def tokens_path(folder: Path, shard: int) -> Path:
    return Path(folder) / f"tokens-{shard:05d}.npz"


def features_path(folder: Path, shard: int) -> Path:
    return Path(folder) / f"features-{shard:05d}.npy"


def load_prompts(path: Path | None = None) -> list[str]:
    """Prompts of the training file in file order (the file is pre-shuffled, so a prefix is a fair mix)."""
    path = Path(path) if path is not None else data_dir() / "train_prompts.jsonl"
    if path.name.startswith("dev_"):
        raise ValueError("refusing to generate training data from a dev prompt file")
    with open(path) as fh:
        return [json.loads(line)["prompt"] for line in fh if line.strip()]


def truncate_prompt(ids: list[int], max_tokens: int) -> list[int]:
    """Drop the middle of an over-long prompt: the start (system/user opening) and the end (the question
    and the assistant header the target must see last) are what matter for the answer."""
    if len(ids) <= max_tokens:
        return list(ids)
    head = max_tokens // 2
    return list(ids[:head]) + list(ids[len(ids) - (max_tokens - head):])


# ---------------------------------------------------------------------------------------------- cache
def _preallocated_cache(num_layers: int, capacity: int):
    """A DynamicCache whose layers write into preallocated buffers.

    The stock DynamicLayer concatenates the whole cache every step (O(n^2) copying, ~1 GB of memory
    traffic a step at batch 48 on SmolLM2); writing in place removes that cost.
    """
    from transformers.cache_utils import Cache, DynamicLayer

    class BufferLayer(DynamicLayer):
        def __init__(self):
            super().__init__()
            self.n = 0

        def lazy_initialization(self, key_states, value_states, *args, **kwargs):
            self.dtype, self.device = key_states.dtype, key_states.device
            b, h, _, d = key_states.shape
            self.kbuf = key_states.new_empty(b, h, capacity, d)
            self.vbuf = value_states.new_empty(b, h, capacity, d)
            self.keys, self.values = self.kbuf[:, :, :0], self.vbuf[:, :, :0]
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            q = key_states.shape[-2]
            if self.n + q > self.kbuf.shape[2]:
                raise RuntimeError("preallocated cache overflow")
            self.kbuf[:, :, self.n:self.n + q] = key_states
            self.vbuf[:, :, self.n:self.n + q] = value_states
            self.n += q
            self.keys, self.values = self.kbuf[:, :, :self.n], self.vbuf[:, :, :self.n]
            return self.keys, self.values

        def get_seq_length(self, *args, **kwargs) -> int:
            return self.n

        def adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, n: int) -> None:
            """View existing buffers holding `n` cached columns (continuous batching rebuilds them)."""
            self.kbuf, self.vbuf, self.n = kbuf, vbuf, n
            self.dtype, self.device = kbuf.dtype, kbuf.device
            self.keys, self.values = kbuf[:, :, :n], vbuf[:, :, :n]
            self.is_initialized = True

        def select(self, rows: torch.Tensor, start: int) -> None:
            """Keep batch `rows` and drop the first `start` columns (padding no kept row needs)."""
            self.kbuf = self.kbuf.index_select(0, rows)[:, :, start:]
            self.vbuf = self.vbuf.index_select(0, rows)[:, :, start:]
            self.n -= start
            self.keys, self.values = self.kbuf[:, :, :self.n], self.vbuf[:, :, :self.n]

    return Cache(layers=[BufferLayer() for _ in range(num_layers)])


# ---------------------------------------------------------------------------------------------- generation
@dataclass
class Generated:
    ids: list[int]  # prompt + response
    prompt_len: int
    features: np.ndarray | None  # fp16 [len(ids) - 1, L*h]


@dataclass
class _Row:
    key: object
    prompt: list[int]
    gen: list[int]
    feats: list[torch.Tensor]
    done: bool = False


class _Batch:
    """Live rows of a continuous batch: their KV buffers, 2D mask, last positions and next tokens.

    Rows are left-aligned to a common width with padding columns (mask 0); positions are explicit, so a
    row's padding never shifts its RoPE positions.
    """

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.rows: list[_Row] = []
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer, [b, h, capacity, d]
        self.n = 0
        self.mask = self.last_pos = self.nxt = None

    def cache(self, capacity_needed: int):
        """An HF cache object viewing this batch's buffers (written in place by the forward)."""
        cache = _preallocated_cache(self.num_layers, capacity_needed)
        for layer, (k, v) in zip(cache.layers, self.kv):
            layer.adopt(k, v, self.n)
        return cache

    def absorb(self, cache) -> None:
        self.kv = [(layer.kbuf, layer.vbuf) for layer in cache.layers]
        self.n = cache.layers[0].n


def _rebuild(parts: list[tuple["_Batch", list[int]]], max_new_tokens: int, num_layers: int) -> "_Batch":
    """One new batch from the kept rows of several batches (left-padded to a common width, all-padding
    leading columns dropped), with room for `max_new_tokens` more steps. One copy of the cache."""
    parts = [(b, keep) for b, keep in parts if keep]
    out = _Batch(num_layers)
    if not parts:
        return out
    widths = []
    for b, keep in parts:
        m = b.mask[keep]
        widths.append(b.n - int((m.cumsum(-1) == 0).sum(-1).min()))  # columns the kept rows need
    W = max(widths)
    total = sum(len(keep) for _, keep in parts)
    ref_k = parts[0][0].kv[0][0]
    dev = ref_k.device
    out.mask = torch.zeros((total, W), dtype=torch.long, device=dev)
    out.last_pos = torch.zeros(total, dtype=torch.long, device=dev)
    out.nxt = torch.zeros(total, dtype=torch.long, device=dev)
    for li in range(num_layers):
        h, d = ref_k.shape[1], ref_k.shape[3]
        kbuf = ref_k.new_zeros(total, h, W + max_new_tokens + 1, d)
        vbuf = ref_k.new_zeros(total, h, W + max_new_tokens + 1, d)
        out.kv.append((kbuf, vbuf))
    r0 = 0
    for (b, keep), w in zip(parts, widths):
        idx = torch.tensor(keep, device=dev)
        rows = slice(r0, r0 + len(keep))
        cols = slice(W - w, W)
        out.mask[rows, cols] = b.mask.index_select(0, idx)[:, b.n - w:]
        out.last_pos[rows] = b.last_pos.index_select(0, idx)
        out.nxt[rows] = b.nxt.index_select(0, idx)
        for (k_new, v_new), (k, v) in zip(out.kv, b.kv):
            k_new[rows, :, cols] = k.index_select(0, idx)[:, :, b.n - w:b.n]
            v_new[rows, :, cols] = v.index_select(0, idx)[:, :, b.n - w:b.n]
        out.rows.extend(b.rows[i] for i in keep)
        r0 += len(keep)
    out.n = W
    return out


def _finish(row: _Row, want: bool) -> Generated:
    full = list(row.prompt) + row.gen
    fr = torch.cat(row.feats).numpy() if want else None
    if fr is not None:
        assert fr.shape[0] == len(full) - 1, (fr.shape, len(full))
    return Generated(ids=full, prompt_len=len(row.prompt), features=fr)


@torch.inference_mode()
def _prefill(target: Target, items, max_new_tokens: int, feature_layers, pad: int, eos: set) -> "_Batch":
    model = target.model
    dev = target.device
    b = len(items)
    lens = [len(p) for _, p in items]
    width = max(lens)
    ids = torch.full((b, width), pad, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, (_, p) in enumerate(items):
        ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = _preallocated_cache(model.config.num_hidden_layers, width + max_new_tokens + 1)
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                      use_cache=True, output_hidden_states=bool(feature_layers))
    batch = _Batch(model.config.num_hidden_layers)
    if feature_layers:
        f = torch.cat([out.hidden_states[i + 1] for i in feature_layers], dim=-1).to(torch.float16).cpu()
    nxt = model.lm_head(out.last_hidden_state[:, -1]).argmax(-1)
    for r, ((key, p), t) in enumerate(zip(items, nxt.tolist())):
        row = _Row(key=key, prompt=list(p), gen=[int(t)], feats=[f[r, width - lens[r]:]] if feature_layers else [])
        row.done = int(t) in eos or max_new_tokens <= 1
        batch.rows.append(row)
    batch.absorb(cache)
    batch.mask, batch.last_pos, batch.nxt = mask, pos[:, -1], nxt
    return batch


@torch.inference_mode()
def generate_stream(target: Target, items, max_new_tokens: int, feature_layers=(), batch_size: int = 96,
                    refill_frac: float = 0.125, pad_id: int | None = None, on_done=None) -> None:
    """Greedy continuations of `items` ((key, prompt ids) pairs, in order) with continuous batching.

    Finished rows leave the batch and new prompts take their place (prefilled as a small left-padded
    batch and merged in) whenever a `refill_frac` share of the slots is free, so the batch stays full
    instead of ending with a few long answers running at batch size 1. Features of every token whose
    KV enters the cache are collected on the way. `on_done(key, Generated)` is called per sequence.
    """
    model = target.model
    eos = set(int(e) for e in target.eos_token_ids)
    pad = int(pad_id if pad_id is not None else (min(eos) if eos else 0))
    want = bool(feature_layers)
    L = model.config.num_hidden_layers
    pending = list(items)[::-1]  # pop() from the end = next in order
    batch = _Batch(L)
    threshold = max(1, int(refill_frac * batch_size))
    while pending or batch.rows:
        done = [i for i, r in enumerate(batch.rows) if r.done]
        free = batch_size - (len(batch.rows) - len(done))
        refill = bool(pending) and (free >= threshold or len(batch.rows) == len(done))
        if refill or len(done) >= threshold or (batch.rows and len(done) == len(batch.rows)):
            for i in done:
                on_done(batch.rows[i].key, _finish(batch.rows[i], want))
            keep = [i for i, r in enumerate(batch.rows) if not r.done]
            parts = [(batch, keep)] if batch.rows else []
            if refill:
                chunk = [pending.pop() for _ in range(min(free, len(pending)))]
                new = _prefill(target, chunk, max_new_tokens, feature_layers, pad, eos)
                parts.append((new, list(range(len(new.rows)))))
            batch = _rebuild(parts, max_new_tokens, L)
            continue  # rows finished at prefill are handled by the next pass
        cache = batch.cache(batch.n + 1)
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch.rows), 1), dtype=batch.mask.dtype,
                                                       device=batch.mask.device)], dim=1)
        batch.last_pos = batch.last_pos + 1
        out = model.model(input_ids=batch.nxt[:, None], attention_mask=batch.mask,
                          position_ids=batch.last_pos[:, None], past_key_values=cache, use_cache=True,
                          output_hidden_states=want)
        batch.absorb(cache)
        if want:
            f = torch.cat([out.hidden_states[i + 1][:, -1] for i in feature_layers], dim=-1).to(torch.float16).cpu()
        batch.nxt = model.lm_head(out.last_hidden_state[:, -1]).argmax(-1)
        for i, (row, t) in enumerate(zip(batch.rows, batch.nxt.tolist())):
            if row.done:
                continue
            if want:
                row.feats.append(f[i:i + 1])
            row.gen.append(int(t))
            if int(t) in eos or len(row.gen) >= max_new_tokens:
                row.done = True


def generate_batch(target: Target, prompts: list[list[int]], max_new_tokens: int, feature_layers=(),
                   batch_size: int | None = None, pad_id: int | None = None) -> list[Generated]:
    """Greedy continuations of `prompts` (results in prompt order); see :func:`generate_stream`."""
    results: dict[int, Generated] = {}
    generate_stream(target, list(enumerate(prompts)), max_new_tokens, feature_layers,
                    batch_size=batch_size or len(prompts), pad_id=pad_id,
                    on_done=lambda k, g: results.__setitem__(k, g))
    return [results[i] for i in range(len(prompts))]


@torch.inference_mode()
def recompute_features(target: Target, sequences: list[list[int]], feature_layers, batch_size: int = 8) -> list[np.ndarray]:
    """Teacher-forced features of committed sequences (all tokens but the last), right-padded batches.

    Right padding keeps every real token at its true position with plain causal attention, so the
    result matches what generation saved up to float rounding.
    """
    model = target.model
    out_feats: list[np.ndarray | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        inputs = [sequences[i][:-1] for i in idx]
        width = max(len(x) for x in inputs)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, x in enumerate(inputs):
            ids[r, :len(x)] = torch.tensor(x, dtype=torch.long)
            mask[r, :len(x)] = 1
        pos = torch.arange(width)[None].expand(len(idx), -1)
        out = model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                          position_ids=pos.to(target.device), use_cache=False, output_hidden_states=True)
        f = torch.cat([out.hidden_states[i + 1] for i in feature_layers], dim=-1).to(torch.float16).cpu().numpy()
        for r, i in enumerate(idx):
            out_feats[i] = f[r, :len(inputs[r])]
    return out_feats  # type: ignore[return-value]


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


def write_tokens(path: Path, seqs: list[Generated], prompt_index: list[int]) -> None:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s.ids) for s in seqs])
    ids = np.concatenate([np.asarray(s.ids, dtype=np.uint16) for s in seqs]) if seqs else np.zeros(0, np.uint16)

    def save(tmp):
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, ids=ids, offsets=offsets, prompt_index=np.asarray(prompt_index, np.int32),
                                prompt_len=np.asarray([s.prompt_len for s in seqs], np.int32))
    _atomic_save(Path(path), save)


def read_tokens(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in ("ids", "offsets", "prompt_index", "prompt_len")}


def feature_offsets(offsets: np.ndarray) -> np.ndarray:
    """Row offsets into a features shard: sequence i has len_i - 1 rows."""
    return offsets - np.arange(len(offsets))


def write_features(path: Path, feats: list[np.ndarray]) -> None:
    def save(tmp):
        with open(tmp, "wb") as fh:
            np.save(fh, np.concatenate(feats).astype(np.float16) if feats else np.zeros((0, 0), np.float16))
    _atomic_save(Path(path), save)


def list_shards(folder: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in Path(folder).glob("tokens-*.npz"))


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


def generate_shards(target: Target, prompts: list[list[int] | None], *, tok_dir: Path, feat_dir: Path | None,
                    shard_size: int, batch_size: int, max_new_tokens: int, feature_layers=(), progress=True,
                    log=print) -> dict:
    """Generate every missing shard; `prompts[i]` are prompt i's token ids (None: skipped prompt).

    One continuous batch streams through all missing shards (length-sorted inside each shard); a shard
    is written as soon as its last sequence is done.
    """
    from tqdm import tqdm

    n_shards = (len(prompts) + shard_size - 1) // shard_size
    have = set(list_shards(tok_dir))
    todo = [k for k in range(n_shards) if k not in have]
    members: dict[int, list[int]] = {}
    items = []
    for k in todo:
        idx = [i for i in range(k * shard_size, min(len(prompts), (k + 1) * shard_size)) if prompts[i] is not None]
        idx.sort(key=lambda i: (len(prompts[i]), i))  # similar lengths together: little padding
        members[k] = sorted(idx)
        items.extend((i, prompts[i]) for i in idx)
    stats = {"shards": 0, "sequences": 0, "new_tokens": 0, "seconds": 0.0}
    bar = tqdm(total=len(items), unit="seq", disable=not progress, mininterval=5 if sys.stderr.isatty() else 60,
               dynamic_ncols=True)
    t0 = time.time()
    results: dict[int, dict[int, Generated]] = {k: {} for k in todo}

    def write_shard(k: int) -> None:
        seqs = [results[k][i] for i in members[k]]
        if feat_dir is not None and feature_layers:
            write_features(features_path(feat_dir, k), [g.features for g in seqs])
        write_tokens(tokens_path(tok_dir, k), seqs, members[k])  # written last: marks the shard done
        new_tok = sum(len(g.ids) - g.prompt_len for g in seqs)
        stats["shards"] += 1
        stats["sequences"] += len(seqs)
        el = time.time() - t0
        log(f"[datagen] shard {k:05d}: {len(seqs)} seqs, {new_tok} new tokens; total {stats['sequences']} seqs, "
            f"{stats['new_tokens']} new tokens in {el:.0f}s ({stats['new_tokens'] / max(el, 1e-9):.0f} tok/s)")
        sys.stdout.flush()
        del results[k]

    def on_done(i: int, g: Generated) -> None:
        k = i // shard_size
        results[k][i] = g
        stats["new_tokens"] += len(g.ids) - g.prompt_len
        bar.update(1)
        bar.set_postfix(tok_s=f"{stats['new_tokens'] / (time.time() - t0):.0f}", refresh=False)
        if len(results[k]) == len(members[k]):
            write_shard(k)

    for k in todo:
        if not members[k]:
            results[k] = {}
            write_shard(k)
    generate_stream(target, items, max_new_tokens, feature_layers, batch_size=batch_size, on_done=on_done)
    bar.close()
    stats["seconds"] = time.time() - t0
    return stats


def fill_missing_features(target: Target, tok_dir: Path, feat_dir: Path, feature_layers, batch_size=8,
                          progress=True, log=print) -> int:
    """Teacher-forced pass for shards whose features are absent (e.g. a fresh checkout)."""
    from tqdm import tqdm

    missing = [k for k in list_shards(tok_dir) if not features_path(feat_dir, k).is_file()]
    for k in tqdm(missing, unit="shard", disable=not progress):
        t = read_tokens(tokens_path(tok_dir, k))
        seqs = [t["ids"][a:b].astype(np.int64).tolist() for a, b in zip(t["offsets"][:-1], t["offsets"][1:])]
        write_features(features_path(feat_dir, k), recompute_features(target, seqs, feature_layers, batch_size))
    if missing:
        log(f"[datagen] recomputed features of {len(missing)} shards")
    return len(missing)


# ---------------------------------------------------------------------------------------------- entry points
def tokenize_prompts(target: Target, texts: list[str], max_prompt_tokens: int) -> list[list[int] | None]:
    out: list[list[int] | None] = []
    for t in texts:
        if not t or not str(t).strip():
            out.append(None)
        else:
            out.append(truncate_prompt(target.chat_ids(t), max_prompt_tokens))
    return out


def add_datagen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="smollm2-cpu")
    p.add_argument("--max-prompts", type=int, default=None, help="use the first N training prompts")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--shard-size", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="generation precision (preset default bf16: AMX makes it ~4x faster than fp32 here)")
    p.add_argument("--features-only", action="store_true", help="only recompute missing features")
    p.add_argument("--no-features", action="store_true", help="do not save features (ids only)")
    p.add_argument("--no-progress", action="store_true")


def run_datagen(args) -> dict:
    from ..models.target import load_target
    from .presets import get_preset

    preset = get_preset(args.preset)
    d = dict(preset["data"])
    for key in ("max_prompts", "batch_size", "shard_size", "max_new_tokens", "dtype"):
        if getattr(args, key, None) is not None:
            d[key] = getattr(args, key)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = tuple(preset["drafter"]["target_layer_ids"])
    device = getattr(args, "device", "cpu")
    target = load_target(preset["target"], device=device, dtype="bf16" if device == "cuda" and d["dtype"] == "bf16" else None)
    if d["dtype"] == "bf16" and target.dtype != torch.bfloat16:
        # load_target refuses bf16 on CPU (inference must be exact); for data generation speed matters
        # more: bf16 greedy text is still the target's own text, and features differ by ~1.4% (relative).
        target.model.to(torch.bfloat16)
        target.dtype = torch.bfloat16
    tok_dir, feat_dir = tokens_dir(args.preset), features_dir(args.preset)
    progress = not args.no_progress
    if args.features_only:
        n = fill_missing_features(target, tok_dir, feat_dir, layers, progress=progress)
        return {"recomputed_shards": n}
    check_manifest(tok_dir, {"target": preset["target"], "shard_size": d["shard_size"],
                             "max_new_tokens": d["max_new_tokens"], "max_prompt_tokens": d["max_prompt_tokens"],
                             "prompt_file": "train_prompts.jsonl", "dtype": d["dtype"], "target_layer_ids": list(layers)})
    texts = load_prompts()[: d["max_prompts"]]
    prompts = tokenize_prompts(target, texts, d["max_prompt_tokens"])
    print(f"[datagen] {len(prompts)} prompts, batch {d['batch_size']}, shard {d['shard_size']}, "
          f"tokens -> {tok_dir}, features -> {feat_dir}", flush=True)
    stats = generate_shards(target, prompts, tok_dir=tok_dir, feat_dir=None if args.no_features else feat_dir,
                            shard_size=d["shard_size"], batch_size=d["batch_size"],
                            max_new_tokens=d["max_new_tokens"], feature_layers=layers, progress=progress)
    print(f"[datagen] done: {stats}", flush=True)
    return stats


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dartree.train.datagen", description=__doc__.splitlines()[0])
    add_datagen_arguments(p)
    run_datagen(p.parse_args(argv))


if __name__ == "__main__":
    main()
