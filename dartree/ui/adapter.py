"""Trace records -> plain lists and dicts for `dartree.ui.figures`.

This is the only place in the UI that touches the records' tensors (through `.tolist()`), once per
step, so figures stay torch-free and cheap to rebuild.
"""

from __future__ import annotations

import math


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


def depth_view(rec, texts: TokenTexts, cut_per_parent: int = 3, correction_parents: int = 16,
               first_corrected_depth: int | None = None) -> dict:
    """One depth: its survivors, a few of the cut candidates per parent, and the rank comparison."""
    frontier = _list(rec.frontier)
    f = len(frontier)
    n = int(rec.token.shape[0])
    c = n // max(f, 1)
    parent, token = _list(rec.parent), _list(rec.token)
    marginal, corrected = _list(rec.marginal_lp), _list(rec.corrected_lp)
    score, rank, survived, node_index = _list(rec.score), _list(rec.rank), _list(rec.survived), _list(rec.node_index)
    rows = rec.corrected_lp.reshape(f, c)
    order = rows.argsort(dim=-1, descending=True, stable=True)
    corrected_rank = order.argsort(dim=-1).reshape(-1).tolist()

    def node(i, nid):
        return {"id": nid, "parent": parent[i], "depth": rec.depth, "token": token[i], "text": texts(token[i]),
                "score": score[i], "marginal": math.exp(marginal[i]), "corrected": math.exp(corrected[i]),
                "rank": rank[i], "order": rank[i], "survived": bool(survived[i])}

    survivors = [node(i, node_index[i]) for i in range(n) if survived[i]]
    per_parent = max(0, min(cut_per_parent, 48 // max(f, 1)))
    cut = []
    if per_parent:
        for slot in range(f):
            row = [slot * c + j for j in order[slot].tolist() if not survived[slot * c + j]][:per_parent]
            cut += [node(i, f"cut{rec.depth}.{i}") for i in row]
    active = bool((rec.corrected_lp - rec.marginal_lp).abs().max() > 1e-6) if n else False
    shown = min(f, correction_parents)
    idx = list(range(shown * c))
    if active:
        caption = (f"depth {rec.depth}: {shown} of {f} frontier node(s) × {c} candidates; "
                   "off the diagonal = re-ranked by the head")
    elif first_corrected_depth is not None and rec.depth < first_corrected_depth:
        caption = (f"depth {rec.depth} uses the marginals alone (correction starts at depth "
                   f"{first_corrected_depth}): all on the diagonal")
    else:
        caption = f"depth {rec.depth}: the correction head changed no ranking here"
    correction = {"marginal_rank": [i % c for i in idx], "corrected_rank": [corrected_rank[i] for i in idx],
                  "survived": [bool(survived[i]) for i in idx], "parent": [parent[i] for i in idx],
                  "texts": [texts(token[i]) for i in idx], "caption": caption, "active": active}
    return {"round": rec.round, "depth": rec.depth, "frontier": frontier, "survivors": survivors, "cut": cut,
            "examined": n, "kept": len(survivors), "candidates": c, "correction": correction, "seconds": rec.seconds}


def root_node(anchor: int, texts: TokenTexts) -> dict:
    return {"id": 0, "parent": None, "depth": 0, "token": int(anchor), "text": texts(anchor), "score": 0.0,
            "marginal": None, "corrected": None, "rank": None, "order": 0, "survived": True}


def tree_view(rec, texts: TokenTexts) -> dict:
    tokens = _list(rec.tokens)
    return {"stage": rec.stage, "tokens": tokens, "texts": texts.many(tokens), "parents": _list(rec.parents),
            "depths": _list(rec.depths), "scores": _list(rec.scores),
            "kept": _list(rec.kept) if rec.kept is not None else None, "budget": rec.budget, "seconds": rec.seconds}


def nodes_from_tree(tree: dict) -> list[dict]:
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
        nodes.append({"id": i, "parent": p if p >= 0 else None, "depth": d, "token": tok, "text": text, "score": s,
                      "marginal": step, "corrected": step, "rank": rank[i] if d else None, "order": rank[i],
                      "survived": True})
    return nodes


def verify_view(rec, texts: TokenTexts, scores: list[float]) -> dict:
    tokens, parents = _list(rec.tokens), _list(rec.parents)
    target_tokens = _list(rec.target_tokens)
    path = _list(rec.path)
    matched = [i == 0 or tokens[i] == target_tokens[parents[i]] for i in range(len(tokens))]
    ptexts = texts.many(tokens)
    accepted = [ptexts[i] for i in path[1:]]
    bonus_text = texts(rec.bonus)
    words = " ".join(f"“{t}”" for t in accepted)
    caption = (f"accepted {len(accepted)} draft token(s){' ' + words if words else ''} + bonus “{bonus_text}” "
               f"→ {len(accepted) + 1} token(s) this round from one target pass over {len(tokens)} nodes")
    return {"round": rec.round, "prefix_len": rec.prefix_len, "tokens": tokens, "texts": ptexts, "parents": parents,
            "depths": _list(rec.depths), "scores": scores, "target_tokens": target_tokens,
            "target_texts": texts.many(target_tokens), "matched": matched, "accepted": _list(rec.accepted),
            "path": path, "bonus": rec.bonus, "bonus_text": bonus_text, "mask": _list(rec.visible),
            "caption": caption, "seconds": rec.seconds}


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
