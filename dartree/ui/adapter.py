"""Trace records -> plain lists and dicts for `dartree.ui.figures`.

This is the only place in the UI that touches the records' tensors (through `.tolist()`), once per
step, so figures stay torch-free and cheap to rebuild.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..trace import source_names


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the tree panels draw it. `id` is the node's index in the round's supertree, or a
    string for a cut candidate (it has none); `order` sorts siblings (rank at its depth); `marginal`
    and `corrected` are the step probabilities before and after the correction head; `continuity` is
    the n-gram term the step's score added beside them (dartree.continuity; None: off)."""

    id: int | str
    parent: int | None
    depth: int
    token: int
    text: str
    score: float  # path log-score
    marginal: float | None = None
    corrected: float | None = None
    continuity: float | None = None
    rank: int | None = None
    order: float = 0  # sorts siblings: rank at its depth (or minus the path score)
    survived: bool = True  # False: cut by the global top-W at its depth
    source: str = "draft"  # who proposed it: draft, ngram, table or both (dartree.retrieval)


def _list(x):
    return x.detach().cpu().tolist() if hasattr(x, "detach") else list(x)


class TokenTexts:
    """Token id -> text, cached (the tokenizer is shared by every session)."""

    def __init__(self, target):
        self.target = target
        self.cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        token = int(token)
        text = self.cache.get(token)
        if text is None:
            text = self.target.token_text(token)
            if len(self.cache) < 200_000:
                self.cache[token] = text
        return text

    def many(self, tokens) -> list[str]:
        return [self(t) for t in tokens]


def draft_view(rec, texts: TokenTexts, top: int = 8) -> dict:
    tokens = _list(rec.cand_tokens[:, :top])
    probs = _list(rec.marginal_lp[:, :top].exp())
    return {"round": rec.round, "anchor": rec.anchor, "anchor_text": texts(rec.anchor), "position": rec.position,
            "tokens": tokens, "texts": [texts.many(row) for row in tokens], "probs": probs, "seconds": rec.seconds}


def depth_view(rec, texts: TokenTexts, cut_per_parent: int = 3, correction_parents: int = 16) -> dict:
    """One depth: its survivors, a few of the cut candidates per parent, and the rank comparison."""
    frontier = _list(rec.frontier)
    f = len(frontier)
    n = int(rec.token.shape[0])
    c = n // max(f, 1)
    parent, token = _list(rec.parent), _list(rec.token)
    head_lp = rec.corrected_lp if rec.continuity_lp is None else rec.corrected_lp - rec.continuity_lp  # the head's own
    marginal, corrected = _list(rec.marginal_lp), _list(head_lp)
    cont = None if rec.continuity_lp is None else _list(rec.continuity_lp)
    score, rank, survived, node_index = _list(rec.score), _list(rec.rank), _list(rec.survived), _list(rec.node_index)
    rows = head_lp.reshape(f, c)
    order = rows.argsort(dim=-1, descending=True, stable=True)
    corrected_rank = order.argsort(dim=-1).reshape(-1).tolist()

    def node(i, nid):
        return NodeView(id=nid, parent=parent[i], depth=rec.depth, token=token[i], text=texts(token[i]),
                        score=score[i], marginal=math.exp(marginal[i]), corrected=math.exp(corrected[i]),
                        continuity=None if cont is None else cont[i], rank=rank[i], order=rank[i],
                        survived=bool(survived[i]))

    survivors = [node(i, node_index[i]) for i in range(n) if survived[i]]
    per_parent = max(0, min(cut_per_parent, 48 // max(f, 1)))
    cut = []
    if per_parent:
        for slot in range(f):
            row = [slot * c + j for j in order[slot].tolist() if not survived[slot * c + j]][:per_parent]
            cut += [node(i, f"cut{rec.depth}.{i}") for i in row]
    active = bool((head_lp - rec.marginal_lp).abs().max() > 1e-6) if n else False
    shown = min(f, correction_parents)
    idx = list(range(shown * c))
    correction = {"marginal_rank": [i % c for i in idx], "corrected_rank": [corrected_rank[i] for i in idx],
                  "survived": [bool(survived[i]) for i in idx], "parent": [parent[i] for i in idx],
                  "texts": [texts(token[i]) for i in idx], "active": active, "shown": shown}
    return {"round": rec.round, "depth": rec.depth, "frontier": frontier, "survivors": survivors, "cut": cut,
            "examined": n, "kept": len(survivors), "candidates": c, "correction": correction, "seconds": rec.seconds}


def root_node(anchor: int, texts: TokenTexts) -> NodeView:
    return NodeView(id=0, parent=None, depth=0, token=int(anchor), text=texts(anchor), score=0.0)


def tree_view(rec, texts: TokenTexts) -> dict:
    tokens = _list(rec.tokens)
    merged = getattr(rec, "supertree", None)
    return {"stage": rec.stage, "tokens": tokens, "texts": texts.many(tokens), "parents": _list(rec.parents),
            "depths": _list(rec.depths), "scores": _list(rec.scores),
            "sources": source_names(getattr(rec, "sources", None), len(tokens)),
            "kept": _list(rec.kept) if rec.kept is not None else None, "budget": rec.budget, "seconds": rec.seconds,
            "supertree": None if merged is None else {
                "tokens": _list(merged.tokens), "parents": _list(merged.parents), "depths": _list(merged.depths),
                "scores": _list(merged.scores), "sources": source_names(merged.sources, int(merged.tokens.shape[0])),
                "bits": _list(merged.sources)}}


def with_retrieved(nodes: list[NodeView], merged: dict, texts: TokenTexts) -> list[NodeView]:
    """The supertree's nodes once retrieval merged its chains in (`merged`: tree_view's "supertree"): drafted
    nodes get their source (both, where a retrieved chain ran through them), retrieved nodes are appended
    with their merged index as id; cut candidates stay as they were. Slots without a source bit are the
    padding of a merge without host reads (dartree.retrieval.merge_padded): not nodes, not drawn."""
    sources, n = merged["sources"], len(merged["tokens"])
    out = [replace(v, source=sources[v.id]) if v.survived and isinstance(v.id, int) and v.id < n else v for v in nodes]
    known = {v.id for v in nodes if v.survived}
    for i in range(n):
        if i in known or not merged["bits"][i]:
            continue
        p = merged["parents"][i]
        step = math.exp(merged["scores"][i] - merged["scores"][p]) if p >= 0 else None
        out.append(NodeView(id=i, parent=p, depth=merged["depths"][i], token=merged["tokens"][i],
                            text=texts(merged["tokens"][i]), score=merged["scores"][i], corrected=step,
                            order=1000 + i, source=sources[i]))
    return out


def nodes_from_tree(tree: dict) -> list[NodeView]:
    """Supertree nodes from a whole-tree record (ddtree builds its heap in one step)."""
    nodes = []
    by_depth: dict[int, list[int]] = {}
    for i, d in enumerate(tree["depths"]):
        by_depth.setdefault(d, []).append(i)
    rank = {}
    for d, idx in by_depth.items():
        for r, i in enumerate(sorted(idx, key=lambda i: -tree["scores"][i])):
            rank[i] = r
    for i, (tok, text, p, d, s) in enumerate(zip(tree["tokens"], tree["texts"], tree["parents"], tree["depths"],
                                                 tree["scores"])):
        step = math.exp(s - tree["scores"][p]) if p >= 0 else None
        nodes.append(NodeView(id=i, parent=p if p >= 0 else None, depth=d, token=tok, text=text, score=s,
                              marginal=step, corrected=step, rank=rank[i] if d else None, order=rank[i]))
    return nodes


def verify_view(rec, texts: TokenTexts, scores: list[float]) -> dict:
    tokens, parents = _list(rec.tokens), _list(rec.parents)
    target_tokens = _list(rec.target_tokens)
    path = _list(rec.path)
    matched = [i == 0 or tokens[i] == target_tokens[parents[i]] for i in range(len(tokens))]
    return {"round": rec.round, "prefix_len": rec.prefix_len, "tokens": tokens, "texts": texts.many(tokens),
            "parents": parents, "depths": _list(rec.depths), "scores": scores, "target_tokens": target_tokens,
            "target_texts": texts.many(target_tokens), "matched": matched, "accepted": _list(rec.accepted),
            "sources": source_names(getattr(rec, "sources", None), len(tokens)),
            "bits": _list(rec.sources) if getattr(rec, "sources", None) is not None else None,
            "path": path, "bonus": rec.bonus, "bonus_text": texts(rec.bonus), "mask": _list(rec.visible),
            "seconds": rec.seconds}


def text_segments(target, output: list[int], rounds: list[tuple[int | None, int]],
                  pending: list[int] | None = None, pending_round: int | None = None) -> list[dict]:
    """Split the committed output into per-round pieces of text (decoded by prefix, so multi-byte
    characters split over rounds still come out right); `rounds` lists (round, token count)."""
    segments, start, done = [], 0, ""
    ids = list(output) + list(pending or [])
    marks = list(rounds) + ([(pending_round, len(pending))] if pending else [])
    for k, (r, count) in enumerate(marks):
        end = start + count
        full = target.decode(ids[:end])
        segments.append({"round": r, "text": full[len(done):], "count": count,
                         "pending": bool(pending) and k == len(marks) - 1})
        start, done = end, full
    return segments
