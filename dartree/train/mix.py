"""The second data mix (issue #21): which prompts each shard holds, when the real prompts have run out.

Shard kinds repeat in a fixed cycle (``mix["cycle"]``, e.g. real, magpie, long, magpie), so any prefix of
the shards is a fair mix and a shard's content is a function of its number (a resumed run fills the same
holes with the same kind of data):

- ``real``: training-file rows the earlier preset (``mix["after"]``) has not used, up to the prompt cap
  of that preset; when they run out, the shard is a Magpie shard;
- ``long``: training-file rows longer than that cap, with their whole text (the earlier preset cut their
  middle out), then, when they run out, documents made of earlier committed responses followed by a
  summary or question request (:mod:`.longctx`);
- ``magpie``: user turns the target writes itself (:mod:`.magpie`), filtered.

Every row is below ``RESERVED_FROM_ROW``; each shard records its rows (``train_row``, -1 for generated
prompts), its kinds (``source``) and, for Magpie, the filter's counts; ``stats.json`` sums them up.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from ..models.target import Target
from ..shards import list_shards, read_tokens, response_lengths, sequences, sources, tokens_path
from .datagen import RESERVED_FROM_ROW, ShardPrompts, data_dir, guard_rows, load_prompts, tokens_dir, truncate_prompt
from .longctx import long_prompts
from .magpie import normalize, sample_user_turns, user_text

KINDS = ("real", "long", "magpie")


def measurement_prompts() -> frozenset[str]:
    """Normalised texts of every measurement prompt (dev files and reserved rows): Magpie must not hit one."""
    out = set()
    for name in ("dev_prompts.jsonl", "dev_long_prompts.jsonl"):
        path = data_dir() / name
        if path.is_file():
            out |= {normalize(json.loads(line)["prompt"]) for line in path.read_text().splitlines() if line.strip()}
    with open(data_dir() / "train_prompts.jsonl") as fh:
        rows = [json.loads(line)["prompt"] for line in fh if line.strip()]
    return frozenset(out | {normalize(p) for p in rows[RESERVED_FROM_ROW:]})


def split_rows(lengths: list[int | None], used: set[int], cap: int) -> tuple[list[int], list[int]]:
    """(real rows, long rows) of the training file: unused rows that fit `cap` tokens, and every row longer
    than `cap` (used or not: the earlier data saw only a cut-down copy of a used one). None: empty prompt."""
    real = [r for r, n in enumerate(lengths) if n is not None and r not in used and n <= cap]
    long = [r for r, n in enumerate(lengths) if n is not None and n > cap]
    guard_rows(real + long)
    return real, long


def kind_of(k: int, cycle: list[str]) -> tuple[str, int]:
    """Shard k's kind in the cycle, and how many shards of that kind come before it."""
    kind = cycle[k % len(cycle)]
    per_cycle = cycle.count(kind)
    return kind, (k // len(cycle)) * per_cycle + cycle[:k % len(cycle)].count(kind)


class MixPlan:
    """The shards of a mixed preset (see the module docstring); `data` is the preset's data section."""

    def __init__(self, target: Target, data: dict, n_shards: int, tok_dir: Path):
        self.target, self.data, self.mix = target, data, data["mix"]
        self.n_shards, self.tok_dir, self.S = n_shards, Path(tok_dir), data["shard_size"]
        self.cap = data["max_prompt_tokens"]
        texts = load_prompts()
        self.ids = [target.chat_ids(t) if t and t.strip() else None for t in texts]
        earlier = tokens_dir(self.mix["after"])
        self.earlier_shards = [read_tokens(tokens_path(earlier, k)) for k in list_shards(earlier)]
        used = {int(i) for t in self.earlier_shards for i in t["prompt_index"]}
        earlier_cap = json.loads((earlier / "manifest.json").read_text())["max_prompt_tokens"]
        self.real_rows, self.long_rows = split_rows([None if x is None else len(x) for x in self.ids], used, earlier_cap)
        self.seen = {normalize(t) for t in texts if t}  # Magpie turns that copy a training prompt are duplicates
        self.forbidden = measurement_prompts()
        self._sources = None
        self._scanned: set[int] = set()

    def shard(self, k: int) -> ShardPrompts:
        kind, i = kind_of(k, self.mix["cycle"])
        if kind == "real" and i * self.S < len(self.real_rows):
            return self._rows(k, self.real_rows[i * self.S:(i + 1) * self.S], "real")
        if kind == "long":
            if i * self.S < len(self.long_rows):
                return self._rows(k, self.long_rows[i * self.S:(i + 1) * self.S], "long")
            return self._documents(k)
        return self._magpie(k)

    def _shard(self, k: int, prompts: list[list[int]], rows: list[int], sources: list[str], stats: dict) -> ShardPrompts:
        guard_rows(rows)
        return ShardPrompts([truncate_prompt(p, self.cap) for p in prompts], [k * self.S + j for j in range(len(prompts))],
                            {"train_row": np.asarray(rows, np.int32), "source": np.asarray(sources)}, stats)

    def _rows(self, k: int, rows: list[int], kind: str) -> ShardPrompts:
        return self._shard(k, [self.ids[r] for r in rows], rows, [kind] * len(rows), {"kind": kind})

    def _documents(self, k: int) -> ShardPrompts:
        texts, lengths = self._document_sources()
        rng = np.random.default_rng([self.mix["seed"], k])
        prompts = long_prompts(texts, lengths, self.S, rng, self.mix["long_min_tokens"], self.mix["long_max_tokens"])
        return self._shard(k, [self.target.chat_ids(p) for p in prompts], [-1] * len(prompts),
                           ["document"] * len(prompts), {"kind": "document"})

    def _document_sources(self) -> tuple[list[str], np.ndarray]:
        """Complete responses (ending in an end-of-turn token, 40+ tokens) of the earlier preset, as text."""
        if self._sources is None:
            eos = set(self.target.eos_token_ids)
            texts, lengths = [], []
            for t in self.earlier_shards:
                for s in sequences(t):
                    resp = s.response.tolist()
                    if len(resp) > 40 and resp[-1] in eos:
                        texts.append(self.target.tokenizer.decode(resp[:-1], skip_special_tokens=True))
                        lengths.append(len(resp) - 1)
            self._sources = (texts, np.asarray(lengths))
        return self._sources

    def _magpie(self, k: int) -> ShardPrompts:
        for j in sorted(set(list_shards(self.tok_dir)) - self._scanned):  # this preset's earlier Magpie turns
            self._scanned.add(j)
            t = read_tokens(tokens_path(self.tok_dir, j))
            for s in sequences(t):
                if s.source == "magpie":
                    self.seen.add(normalize(user_text(self.target, s.ids[:s.prompt_len])))
        m = self.mix["magpie"]
        turns, stats = sample_user_turns(self.target, self.S, seed=self.mix["seed"] * 1_000_003 + k, seen=self.seen,
                                         forbidden=self.forbidden, temperature=m["temperature"], top_p=m["top_p"],
                                         max_tokens=m["max_tokens"], round_size=m["round_size"])
        return self._shard(k, [self.target.chat_ids(t) for t in turns], [-1] * len(turns), ["magpie"] * len(turns),
                           {"kind": "magpie", "magpie": stats.as_dict()})


def mix_stats(tok_dir: Path) -> dict:
    """Totals over the shards: sequences and response tokens by kind, and the Magpie filter's counts."""
    seqs, tokens, rejected = Counter(), Counter(), Counter()
    sampled = accepted = 0
    for k in list_shards(tok_dir):
        t = read_tokens(tokens_path(tok_dir, k))
        resp = response_lengths(t)
        for src, n in zip(sources(t), resp.tolist()):
            seqs[src] += 1
            tokens[src] += n
        m = t.get("stats", {}).get("magpie")
        if m:
            sampled, accepted = sampled + m["sampled"], accepted + m["accepted"]
            rejected.update(m["rejected"])
    return {"shards": len(list_shards(tok_dir)), "sequences": dict(seqs), "response_tokens": dict(tokens),
            "response_tokens_total": sum(tokens.values()),
            "magpie": {"sampled": sampled, "accepted": accepted, "rejected": dict(sorted(rejected.items())),
                       "rejection_rate": round(1 - accepted / sampled, 4) if sampled else None}}


def write_mix_stats(tok_dir: Path) -> None:
    (Path(tok_dir) / "stats.json").write_text(json.dumps(mix_stats(tok_dir), indent=1) + "\n")
