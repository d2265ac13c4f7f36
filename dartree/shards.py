"""Token shards: the committed sequences of a data preset, read without the training package.

A shard ``tokens-KKKKK.npz`` (written by :mod:`dartree.train.datagen`) holds its sequences concatenated:
``ids`` uint16 [sum len_i], ``offsets`` int64 [n + 1] (sequence i is ``ids[offsets[i]:offsets[i+1]]``),
``prompt_len`` int32 [n] (its first tokens are the chat-templated prompt, the rest the target's response),
``prompt_index`` int32 [n], and, in mixed presets, ``source`` [n] (real / magpie / long / document) and
``stats`` (a JSON string).

The engine reads them too (the n-gram continuity corpus), and the engine does not import the training package,
so the reader lives here and the training side imports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np


class Sequence(NamedTuple):
    ids: np.ndarray  # [len] int64: prompt then response
    prompt_len: int
    source: str  # "v1" in presets that record no source

    @property
    def response(self) -> np.ndarray:
        return self.ids[self.prompt_len:]


def tokens_path(folder: Path, shard: int) -> Path:
    return Path(folder) / f"tokens-{shard:05d}.npz"


def list_shards(folder: Path, first: int = 0, stop: int | None = None) -> list[int]:
    """The data stage's shard numbers in `folder`, those in [first, stop) when given (a training window:
    data keeps growing across sessions, and a recorded run must see exactly the data it trained on)."""
    ks = sorted(int(p.stem.split("-")[1]) for p in Path(folder).glob("tokens-*.npz"))
    return [k for k in ks if first <= k and (stop is None or k < stop)]


def read_tokens(path: Path) -> dict:
    """The arrays of a token shard (``stats``, when present, as a dict)."""
    with np.load(path) as z:
        out = {k: z[k] for k in z.files}
    if "stats" in out:
        out["stats"] = json.loads(str(out["stats"]))
    return out


def sources(shard: dict) -> list[str]:
    """[n] where each sequence's prompt came from; "v1" for every sequence of a preset that records none."""
    return [str(s) for s in shard.get("source", ["v1"] * len(shard["prompt_len"]))]


def sequences(shard: dict) -> Iterator[Sequence]:
    """The sequences of a shard read by :func:`read_tokens`, in order."""
    ids, offsets, prompt_len = shard["ids"], shard["offsets"], shard["prompt_len"]
    for a, b, p, s in zip(offsets[:-1].tolist(), offsets[1:].tolist(), prompt_len.tolist(), sources(shard)):
        yield Sequence(ids[a:b].astype(np.int64), p, s)


def response_lengths(shard: dict) -> np.ndarray:
    """[n] response tokens of each sequence, without slicing them."""
    return np.diff(shard["offsets"]) - shard["prompt_len"]


def folder_responses(folders) -> list[np.ndarray]:
    """The response tokens (prompt removed) of every sequence of the token shards in `folders`."""
    return [s.response for folder in folders for k in list_shards(folder)
            for s in sequences(read_tokens(tokens_path(folder, k)))]
