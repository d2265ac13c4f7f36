"""Greedy (or sampled) generation with the target for training data: continuous batching on in-place KV buffers.

Why not HF ``generate``, on 2 shared CPU cores: the stock DynamicCache concatenates the whole cache every
step, so the KV buffers here are preallocated and written in place; finished rows leave the batch and new
prompts are prefilled and merged in, so the batch stays full (continuous batching); logits are computed
for the last row only. Features (the hidden states of a few target layers, which the drafter reads) fall
out of the same forwards for free (``output_hidden_states``).

Long prompts: a batch's KV buffers are as wide as its longest row, so ``max_batch_tokens`` bounds
rows x (width + new tokens) when new rows are admitted, and a prefill is split into pieces of at most
``max_prefill_tokens`` (every layer's hidden states of a prefill are held at once).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..models.target import Target
from ..sampling import next_tokens

Chooser = Callable[[torch.Tensor], torch.Tensor]  # logits [b, V] -> next token ids [b]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


def sampler(temperature: float, top_p: float, generator: torch.Generator) -> Chooser:
    """A Chooser that draws from the target's processed distribution, as the app samples at T > 0."""
    return lambda logits: next_tokens(logits, temperature, top_p, generator)


# ---------------------------------------------------------------------------------------------- cache
def _preallocated_cache(num_layers: int, capacity: int):
    """A DynamicCache whose layers write into preallocated buffers.

    The stock DynamicLayer concatenates the whole cache every step (O(n^2) copying, ~1 GB of memory
    traffic a step at batch 48 on SmolLM2); writing in place removes that cost.
    """
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
def _prefill(target: Target, items, max_new_tokens: int, feature_layers, pad: int, eos: set,
             choose: Chooser) -> "_Batch":
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
    nxt = choose(model.lm_head(out.last_hidden_state[:, -1]))
    for r, ((key, p), t) in enumerate(zip(items, nxt.tolist())):
        row = _Row(key=key, prompt=list(p), gen=[int(t)], feats=[f[r, width - lens[r]:]] if feature_layers else [])
        row.done = int(t) in eos or max_new_tokens <= 1
        batch.rows.append(row)
    batch.absorb(cache)
    batch.mask, batch.last_pos, batch.nxt = mask, pos[:, -1], nxt
    return batch


class _Pending:
    """The prompts still to admit, read lazily: a caller may produce them on the fly, or stop early."""

    def __init__(self, items: Iterable):
        self._it = iter(items)
        self._buf: collections.deque = collections.deque()

    def _peek(self, i: int):
        while len(self._buf) <= i:
            item = next(self._it, None)
            if item is None:
                return None
            self._buf.append(item)
        return self._buf[i]

    def __bool__(self) -> bool:
        return self._peek(0) is not None

    def admissible(self, free: int, live: int, width: int, max_new_tokens: int, max_batch_tokens: int | None) -> int:
        """How many of the next prompts fit: at most `free` rows, and (rows) x (width + new tokens) within
        `max_batch_tokens` (the KV buffers are as wide as the widest row). An empty batch takes one row."""
        n = 0
        while n < free and (item := self._peek(n)) is not None:
            w = max(width, len(item[1]))
            if max_batch_tokens and live + n > 0 and (live + n + 1) * (w + max_new_tokens) > max_batch_tokens:
                break
            width, n = w, n + 1
        return n

    def take(self, n: int) -> list:
        return [self._buf.popleft() for _ in range(n)]


def _pieces(chunk: list, max_tokens: int | None) -> list[list]:
    """Consecutive pieces of a prefill chunk with (rows) x (longest prompt) <= max_tokens each."""
    out: list[list] = []
    for item in chunk:
        if out and (not max_tokens or (len(out[-1]) + 1) * max(len(p) for _, p in out[-1] + [item]) <= max_tokens):
            out[-1].append(item)
        else:
            out.append([item])
    return out


@torch.inference_mode()
def generate_stream(target: Target, items: Iterable, max_new_tokens: int, feature_layers=(), batch_size: int = 96,
                    refill_frac: float = 0.125, pad_id: int | None = None, on_done=None, choose: Chooser = greedy,
                    max_batch_tokens: int | None = None, max_prefill_tokens: int | None = None) -> None:
    """Continuations of `items` ((key, prompt ids) pairs, in order, read lazily) with continuous batching.

    Finished rows leave the batch and new prompts take their place (prefilled as a small left-padded
    batch and merged in) whenever a `refill_frac` share of the slots is free, so the batch stays full
    instead of ending with a few long answers running at batch size 1. Features of every token whose
    KV enters the cache are collected on the way. `on_done(key, Generated)` is called per sequence.
    `choose` picks the next tokens from the logits (greedy by default; Magpie samples its prompts).
    """
    model = target.model
    eos = set(int(e) for e in target.eos_token_ids)
    pad = int(pad_id if pad_id is not None else (min(eos) if eos else 0))
    want = bool(feature_layers)
    L = model.config.num_hidden_layers
    pending = _Pending(items)
    batch = _Batch(L)
    threshold = max(1, int(refill_frac * batch_size))
    while pending or batch.rows:
        done = [i for i, r in enumerate(batch.rows) if r.done]
        live = len(batch.rows) - len(done)
        free = batch_size - live
        n_new = pending.admissible(free, live, batch.n, max_new_tokens, max_batch_tokens) \
            if free >= threshold or live == 0 else 0
        if n_new or len(done) >= threshold or (batch.rows and live == 0):
            for i in done:
                on_done(batch.rows[i].key, _finish(batch.rows[i], want))
            keep = [i for i, r in enumerate(batch.rows) if not r.done]
            parts = [(batch, keep)] if batch.rows else []
            for piece in _pieces(pending.take(n_new), max_prefill_tokens):
                new = _prefill(target, piece, max_new_tokens, feature_layers, pad, eos, choose)
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
        batch.nxt = choose(model.lm_head(out.last_hidden_state[:, -1]))
        for i, (row, t) in enumerate(zip(batch.rows, batch.nxt.tolist())):
            if row.done:
                continue
            if want:
                row.feats.append(f[i:i + 1])
            row.gen.append(int(t))
            if int(t) in eos or len(row.gen) >= max_new_tokens:
                row.done = True


def generate_batch(target: Target, prompts: list[list[int]], max_new_tokens: int, feature_layers=(),
                   batch_size: int | None = None, **stream_kw) -> list[Generated]:
    """Continuations of `prompts` (results in prompt order); see :func:`generate_stream`."""
    results: dict[int, Generated] = {}
    generate_stream(target, list(enumerate(prompts)), max_new_tokens, feature_layers,
                    batch_size=batch_size or len(prompts), on_done=lambda k, g: results.__setitem__(k, g),
                    **stream_kw)
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


