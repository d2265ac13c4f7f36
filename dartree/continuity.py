"""DART's n-gram continuity term: how often the target itself followed a path's last tokens with a candidate.

The DARTree reference can add DART's term to its tree scores: a node's score gains w x log(P_ngram(token |
the path's last n - 1 tokens) + eps), where P_ngram counts a corpus. Here the corpus is the target's own
greedy answers, the committed drafter training data (`assets/train_data/<preset>/tokens-*.npz`: train prompts
below row 18,515 and Magpie prompts, never dev), so the counts say what this target writes after those tokens.
The drafter's GRU head already conditions on the path; the counts add what a small head forgets.

P follows DART's rule (`NgramTable.log_probs`): the longest context suffix the corpus has seen (up to n - 1
tokens) answers alone, with its raw frequency; a candidate never seen after it gets log(eps). The term is
clamped at 0, so a path score still never rises along a path and the top-B cut stays prefix-closed
(dartree.tree.prune_top_b). It only reorders what the builders rank; the target still verifies every
token, so decoding stays lossless.

The table is two sorted int64 key arrays searched with `torch.searchsorted`, on the device the tree is built
on, without a host read: every k-gram of the corpus (its tokens 16 bits each, every vocabulary here being
below 2^16, and k in the top bits, so all orders share one array) with its log(P + eps) precomputed, and every
context seen. A depth then costs one lookup of each path's n contexts and one of its [C] candidates' grams,
some 25 tensor ops, whatever n. NumPy's `unique` counts the 6 M tokens in a few seconds, once a process.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .defaults import CONTINUITY_EPS, CONTINUITY_ORDER
from .errors import UserError
from .prompts import REPO_ROOT
from .shards import folder_responses

BITS = 16  # bits a token id takes in a key
MAX_ORDER = 3  # 3 x 16 bits, and the order in bits 60 up: an int64
ORDER_SHIFT = 60
LOW = (1 << ORDER_SHIFT) - 1  # the token bits of a key


def gram_keys(seq: np.ndarray, k: int) -> np.ndarray:
    """Keys of every k-gram of `seq` [len - k + 1]: token j of the gram in bits (k - 1 - j) x 16 up."""
    key = np.zeros(max(len(seq) - k + 1, 0), dtype=np.int64)
    for j in range(k):
        key = (key << BITS) | seq[j:len(seq) - k + 1 + j]
    return key


class NgramTable:
    """The 1..n-grams of a corpus with their continuity log-probs, and the lookup of a batch of paths."""

    def __init__(self, gram_keys_: torch.Tensor, gram_lp: torch.Tensor, ctx_keys: torch.Tensor, order: int,
                 eps: float, tokens: int):
        self.gram_keys = gram_keys_  # [G] sorted: k << 60 | (k-gram tokens), every order
        self.gram_lp = gram_lp  # [G] float32: log(count(gram) / count(its context) + eps), clamped at 0
        self.ctx_keys = ctx_keys  # [X] sorted: k << 60 | (the k-gram's first k - 1 tokens), the contexts seen
        self.order, self.eps, self.tokens = order, eps, tokens
        self.unseen = min(math.log(eps), 0.0)  # a candidate its context never had

    @classmethod
    def build(cls, sequences: list[np.ndarray], order: int = 3, eps: float = 1e-10) -> "NgramTable":
        if not 1 <= order <= MAX_ORDER:
            raise UserError(f"n-gram order must be between 1 and {MAX_ORDER}, got {order}")
        if any(int(s.max(initial=0)) >= 1 << BITS for s in sequences):
            raise UserError(f"token ids of 2^{BITS} and above do not fit the n-gram keys")
        if not sum(len(s) for s in sequences):
            raise UserError("an n-gram table needs a corpus of at least one token")
        grams, lps, contexts = [], [], []
        for k in range(1, order + 1):
            keys, counts = np.unique(np.concatenate([gram_keys(s, k) for s in sequences] or [np.zeros(0, np.int64)]),
                                     return_counts=True)
            ctx_keys, which = np.unique(keys >> BITS, return_inverse=True)  # a gram's context: its first k - 1 tokens
            totals = np.bincount(which, weights=counts, minlength=len(ctx_keys))
            grams.append(keys | (k << ORDER_SHIFT))
            lps.append(np.minimum(np.log(counts / totals[which] + eps), 0.0))
            contexts.append(ctx_keys | (k << ORDER_SHIFT))
        # each order's keys are sorted and the order bits rise with k, so the concatenations are sorted
        return cls(torch.from_numpy(np.concatenate(grams)), torch.from_numpy(np.concatenate(lps)).float(),
                   torch.from_numpy(np.concatenate(contexts)), order, eps, sum(len(s) for s in sequences))

    def to(self, device) -> "NgramTable":
        return NgramTable(self.gram_keys.to(device), self.gram_lp.to(device), self.ctx_keys.to(device), self.order,
                          self.eps, self.tokens)

    def log_probs(self, tails: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """log(P(cand | tail) + eps) [F, C], clamped at 0, for paths ending in `tails` [F, n - 1] (oldest first).

        DART's rule: the longest suffix of the tail the corpus has seen as a context decides, with the raw
        frequency count(context, cand) / count(context); the empty context (unigram frequencies) always has."""
        dev = cand.device
        context = torch.zeros(tails.shape[0], dtype=torch.long, device=dev)
        contexts = [context]  # [F] each: the last k - 1 tail tokens, k = 1..n
        for j in range(1, self.order):
            context = context | (tails[:, -j] << (BITS * (j - 1)))
            contexts.append(context)
        orders = torch.arange(self.order, 0, -1, device=dev) << ORDER_SHIFT  # longest first
        query = torch.stack(contexts[::-1], dim=1) | orders  # [F, n]
        seen = _found(self.ctx_keys, query)[0]
        chosen = query.gather(1, seen.to(torch.uint8).argmax(dim=1, keepdim=True))  # [F, 1]: the first seen
        order = chosen >> ORDER_SHIFT
        grams = (((chosen & LOW) << BITS) | cand) | (order << ORDER_SHIFT)  # [F, C]
        hit, at = _found(self.gram_keys, grams)
        return self.gram_lp[at].masked_fill(~hit, self.unseen)


def _found(keys: torch.Tensor, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(query is in `keys` (sorted), its index there, clamped into range) elementwise; keys must be non-empty."""
    at = torch.searchsorted(keys, query).clamp(max=keys.shape[0] - 1)
    return keys[at] == query, at


PAD = (1 << BITS) - 1  # fills a tail shorter than n - 1 tokens: no token has this id, so no context holds it


class ContinuityTerm:
    """w x `NgramTable.log_probs` for the tree builders: what a path's next candidates add to its score.

    A builder keeps the last n - 1 tokens of each frontier path (`root_tails`, then `advance`) and asks
    `__call__` for the [F, C] term of a depth's candidates (dartree.tree.child_log_probs adds it)."""

    def __init__(self, table: NgramTable, weight: float):
        self.table, self.weight = table, float(weight)

    def root_tails(self, device, *committed) -> torch.Tensor:
        """[1, n - 1]: the last n - 1 committed tokens (the anchor last), padded on the left. `committed` comes in
        pieces (a prompt, an output) read from their ends only, so a round never copies the whole text."""
        n = self.table.order - 1
        tail: list[int] = []
        for part in reversed(committed):
            take = n - len(tail)
            if take <= 0:
                break
            tail = list(part[max(len(part) - take, 0):]) + tail
        return torch.tensor([[PAD] * (n - len(tail)) + tail], dtype=torch.long, device=device)

    def __call__(self, tails: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return self.weight * self.table.log_probs(tails, cand)

    @staticmethod
    def advance(tails: torch.Tensor, parent_slot: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The survivors' tails [K, n - 1]: each parent's tail shifted by the survivor's token."""
        return torch.cat([tails[parent_slot], tokens[:, None]], dim=1)[:, 1:]


def corpus_folders(target_name: str, root: Path | None = None) -> list[Path]:
    """The committed greedy answers of `target_name`: the data folders whose manifest names it and records no
    sampling temperature (a sampled answer is not what the target writes at T = 0)."""
    root = REPO_ROOT / "assets" / "train_data" if root is None else root
    found = []
    for manifest in sorted(root.glob("*/manifest.json")):
        info = json.loads(manifest.read_text())
        if info.get("target") == target_name and not info.get("response_temperature"):
            found.append(manifest.parent)
    return found


_TABLES: dict = {}


def table_for(target_name: str, order: int, device) -> NgramTable | None:
    """The n-gram table of the target's committed answers (None: the target has none), built once a process."""
    key = (target_name, order, str(device))
    if key not in _TABLES:
        folders = corpus_folders(target_name)
        _TABLES[key] = NgramTable.build(folder_responses(folders), order, CONTINUITY_EPS).to(device) \
            if folders else None
    return _TABLES[key]


def continuity_term(settings, target):
    """(settings, the generation's ContinuityTerm or None) for validated `settings`.

    The term counts the target's own committed answers (dartree.continuity.table_for); on a target without
    any the weight resolves to 0, and the returned settings say so (the CLI refuses to ask for one there)."""
    if not settings.continuity:
        return settings, None
    table = table_for(target.name, CONTINUITY_ORDER, target.device)
    if table is None:
        return replace(settings, continuity=0.0), None
    return settings, ContinuityTerm(table, settings.continuity)


def round_continuity(term: ContinuityTerm | None, device, *committed):
    """What a round's builder needs of the term: (term, `root_tails` of the committed pieces), or None."""
    return None if term is None else (term, term.root_tails(device, *committed))
