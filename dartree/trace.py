"""Plain records of what each decoding step produced, for the UI, the CLI and trace downloads.

Records may hold device tensors: they are only copied to the host when a consumer asks
(`to_frame`, `to_dict`), so tracing adds no host synchronisation to the hot path. Every record turns
into a pandas DataFrame; `to_dict` gives JSON-ready data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .retrieval import source_label


def _host(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    return x


def source_names(sources, n: int) -> list[str]:
    """Each node's source label (draft / ngram / table / both); all drafted when `sources` is None."""
    return [source_label(b) for b in _host(sources)] if sources is not None else ["draft"] * n


def _frame(columns: dict):
    import pandas as pd

    return pd.DataFrame({k: _host(v) for k, v in columns.items()})


@dataclass
class PrefillRecord:
    prompt_tokens: int
    first_token: int
    seconds: float
    stage: str = "prefill"

    def to_frame(self):
        return _frame({"prompt_tokens": [self.prompt_tokens], "first_token": [self.first_token],
                       "seconds": [self.seconds]})

    def to_dict(self):
        return {"stage": self.stage, "prompt_tokens": self.prompt_tokens, "first_token": self.first_token,
                "seconds": self.seconds}


@dataclass
class DraftRecord:
    """The drafter's top candidates per future position, with their marginal probabilities."""

    round: int
    anchor: int
    position: int
    cand_tokens: torch.Tensor  # [D, C]
    marginal_lp: torch.Tensor  # [D, C] full-vocabulary log-probs
    seconds: float
    stage: str = "draft"

    def to_frame(self, top: int = 8):
        tokens = self.cand_tokens[:, :top]
        probs = self.marginal_lp[:, :top].exp()
        depth, rank = torch.meshgrid(torch.arange(tokens.shape[0]) + 1, torch.arange(tokens.shape[1]), indexing="ij")
        return _frame({"depth": depth.reshape(-1), "rank": rank.reshape(-1), "token": tokens.reshape(-1),
                       "marginal_prob": probs.reshape(-1)})

    def to_dict(self, top: int = 8):
        return {"stage": self.stage, "round": self.round, "anchor": self.anchor, "position": self.position,
                "seconds": self.seconds, "candidates": self.to_frame(top).to_dict("records")}


@dataclass
class DepthRecord:
    """One depth of tree building: the frontier and every candidate child examined, with survival."""

    round: int
    depth: int
    frontier: torch.Tensor
    parent: torch.Tensor
    token: torch.Tensor
    marginal_lp: torch.Tensor
    corrected_lp: torch.Tensor
    score: torch.Tensor
    rank: torch.Tensor
    survived: torch.Tensor
    node_index: torch.Tensor
    seconds: float
    stage: str = "depth"
    settled: bool = False  # the builder stops here: no deeper node could make the top-B cut (dartree.tree)
    continuity_lp: torch.Tensor | None = None  # the n-gram term included in corrected_lp (None: off)

    def to_frame(self):
        cont = {} if self.continuity_lp is None else {"continuity_lp": self.continuity_lp}
        return _frame({"depth": [self.depth] * int(self.token.shape[0]), "parent": self.parent, "token": self.token,
                       "marginal_lp": self.marginal_lp, "corrected_lp": self.corrected_lp, **cont, "score": self.score,
                       "rank": self.rank, "survived": self.survived, "node_index": self.node_index})

    def to_dict(self):
        return {"stage": self.stage, "round": self.round, "depth": self.depth, "seconds": self.seconds,
                "frontier": _host(self.frontier), "candidates": self.to_frame().to_dict("records")}


@dataclass
class TreeRecord:
    """A whole tree (the supertree after building, or the verification tree after pruning)."""

    round: int
    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    kept: torch.Tensor | None  # for pruning: indices of the supertree nodes kept
    budget: int
    seconds: float
    stage: str = "prune"
    sources: torch.Tensor | None = None  # [N] bit mask of who proposed each node (dartree.retrieval); None: drafted
    supertree: object | None = None  # with retrieval: the merged supertree (a dartree.tree.Tree) the cut picked from

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0]) - 1

    def to_frame(self):
        n = int(self.tokens.shape[0])
        return _frame({"node": list(range(n)), "token": self.tokens, "parent": self.parents, "depth": self.depths,
                       "score": self.scores,
                       "source_node": self.kept if self.kept is not None else list(range(n)),
                       "source": source_names(self.sources, n)})

    def to_dict(self):
        return {"stage": self.stage, "round": self.round, "budget": self.budget, "seconds": self.seconds,
                "nodes": self.to_frame().to_dict("records")}


@dataclass
class VerifyRecord:
    """The target's verdict on the tree: its token at every node, the accepted path, the bonus token."""

    round: int
    prefix_len: int
    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    visible: torch.Tensor  # [N, N] bool: the tree part of the attention mask
    target_tokens: torch.Tensor
    accepted: torch.Tensor
    path: torch.Tensor
    bonus: int
    seconds: float
    stage: str = "verify"
    sources: torch.Tensor | None = None  # [N] bit mask of who proposed each node; None: drafted

    def to_frame(self):
        return _frame({"node": list(range(int(self.tokens.shape[0]))), "token": self.tokens, "parent": self.parents,
                       "depth": self.depths, "position": self.depths + self.prefix_len,
                       "target_token": self.target_tokens, "accepted": self.accepted,
                       "source": source_names(self.sources, int(self.tokens.shape[0]))})

    def to_dict(self):
        return {"stage": self.stage, "round": self.round, "prefix_len": self.prefix_len, "seconds": self.seconds,
                "path": _host(self.path), "bonus": self.bonus, "mask": _host(self.visible.int()),
                "nodes": self.to_frame().to_dict("records")}


@dataclass
class CommitRecord:
    round: int
    new_tokens: list[int]
    accepted: int  # draft tokens accepted (the bonus token excluded)
    cache_length: int
    finished: str | None  # None, "eos" or "length"
    seconds: float
    stage: str = "commit"

    def to_frame(self):
        return _frame({"position": list(range(len(self.new_tokens))), "token": self.new_tokens})

    def to_dict(self):
        return {"stage": self.stage, "round": self.round, "new_tokens": self.new_tokens, "accepted": self.accepted,
                "cache_length": self.cache_length, "finished": self.finished, "seconds": self.seconds}


STAGE_KEYS = ("draft", "tree", "verify", "commit")


@dataclass
class RoundRecord:
    """Summary of one round: committed tokens, tree size and the time of each stage."""

    round: int
    tree_nodes: int
    committed: int  # tokens committed this round, the bonus token included
    seconds: dict = field(default_factory=dict)  # draft / tree / verify / commit
    # per source (draft, ngram, table): nodes proposed, verified and accepted (dartree.retrieval.source_counts)
    sources: dict = field(default_factory=dict)

    def to_dict(self):
        counts = {f"{src}_{k}": v for src, c in self.sources.items() for k, v in c.items()}
        return {"round": self.round, "tree_nodes": self.tree_nodes, "committed": self.committed, **self.seconds,
                **counts}


def rounds_frame(rounds: list[RoundRecord]):
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in rounds])
