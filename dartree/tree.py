"""Draft trees and the builders that grow them, as batched tensor code.

A `Tree` lists its nodes in topological order (a parent always precedes its children). Node 0 is the
root: the anchor token, already committed but not yet seen by the target. Node scores are path
log-scores (0 at the root); since every log-prob is <= 0, scores never rise along a path.

Builders, one per method the app compares (dartree.methods maps each method to its builder). Every
builder follows one protocol: `step()` grows the next depth (or, for DDTree, the whole tree), `done`
says when it is grown, and `finish(budget) -> (supertree, tree, kept)` hands over the tree to verify:
- `DepthwiseBuilder`: expands every frontier node of a depth in one batched call and keeps the
  global best children. With `keep = W` at every depth it builds DARTree's W-wide supertree; with
  `fixed_quota_schedule(B, D)` it is `dartree-fixed`; with W = 1 it is the single draft `chain`.
- `prune_top_b`: DARTree's deferred best-first pruning of the supertree to a budget B, ranking nodes by
  `cut_keys` (path score + depth bonus x depth), the one ranking the cut uses. Knowing B, the builder stops
  growing once no deeper node could make that cut (`DepthwiseBuilder`, "settled").
- `ddtree_heap`: DDTree's exact best-first heap over the uncorrected marginals (`HeapBuilder`: its
  builder of one step).

Scores come from a `Draft` (one drafter pass: the top-C candidates per position with their base logits)
and a corrector (the GRU head; see dartree.draft), plus, where it is on, DART's n-gram term (dartree.continuity).
Nothing here knows about models or files.
"""

from __future__ import annotations

import heapq
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from .sampling import processed_log_probs


@dataclass
class Tree:
    """Tokens, parents, depths and path scores of a draft tree, node 0 being the root."""

    tokens: torch.Tensor  # [N] long
    parents: torch.Tensor  # [N] long, -1 at the root
    depths: torch.Tensor  # [N] long, 0 at the root
    scores: torch.Tensor  # [N] float, 0 at the root
    max_depth: int  # deepest depth the builder may have produced (host int: no sync to read it)
    sources: torch.Tensor | None = None  # [N] long bit mask of who proposed each node (dartree.retrieval); None: the drafter

    @property
    def num_nodes(self) -> int:
        """Nodes excluding the root (the verification budget they use)."""
        return int(self.tokens.shape[0]) - 1

    def subset(self, keep: torch.Tensor) -> "Tree":
        """The nodes at sorted indices `keep` (which must contain 0 and be ancestor-closed), re-indexed."""
        remap = torch.full_like(self.parents, -1)
        remap[keep] = torch.arange(keep.shape[0], device=keep.device)
        parents = self.parents[keep]
        new_parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], parents)
        sources = self.sources[keep] if self.sources is not None else None
        return Tree(self.tokens[keep], new_parents, self.depths[keep], self.scores[keep], self.max_depth, sources)

    @staticmethod
    def root_only(anchor: torch.Tensor) -> "Tree":
        dev = anchor.device
        return Tree(anchor.reshape(1).long(), torch.full((1,), -1, dtype=torch.long, device=dev),
                    torch.zeros(1, dtype=torch.long, device=dev), torch.zeros(1, device=dev), 0)


@dataclass
class Draft:
    """What one drafter pass offers the tree builders, for depths 1..D (row d-1 is depth d)."""

    anchor: torch.Tensor  # [] long: the root token
    cand_tokens: torch.Tensor  # [D, C] top-C token ids by base logit, best first
    cand_base_logits: torch.Tensor  # [D, C] base logits of those tokens
    cand_marginal_lp: torch.Tensor  # [D, C] full-vocabulary log-softmax of the base logits
    # DDTree's siblings when it needs more than C: the top-S tokens per depth with their full-vocabulary
    # log-probs, best first, S = min(B, V) > C (V: the drafter's vocabulary); None: the candidates suffice
    sibling_tokens: torch.Tensor | None = None  # [D, S]
    sibling_marginal_lp: torch.Tensor | None = None  # [D, S]

    @property
    def depth(self) -> int:
        return int(self.cand_tokens.shape[0])

    @property
    def num_candidates(self) -> int:
        return int(self.cand_tokens.shape[1])

    def ranked_siblings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and marginal log-probs [D, S] of the widest ranking drafted (DDTree's heap reads this)."""
        if self.sibling_tokens is None:
            return self.cand_tokens, self.cand_marginal_lp
        return self.sibling_tokens, self.sibling_marginal_lp


class Corrector(Protocol):
    """The causal correction head seen by the builders: path states and logit residuals."""

    def root_state(self) -> torch.Tensor:  # [1, g]: state after the anchor
        ...

    def residual(self, depth: int, states: torch.Tensor) -> torch.Tensor | None:  # [F, C] or None
        ...

    def advance(self, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:  # [F, g]
        ...


class NoCorrection:
    """Corrector of a drafter without a head: the builders then score with the marginals alone."""

    def root_state(self) -> torch.Tensor:
        return torch.zeros(1, 1)

    def residual(self, depth: int, states: torch.Tensor):
        return None

    def advance(self, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        return states


@dataclass
class DepthExpansion:
    """Every candidate child examined at one depth, in frontier-major order (F frontier nodes x C)."""

    depth: int
    frontier: torch.Tensor  # [F] node indices being expanded
    parent: torch.Tensor  # [F*C] node index of each candidate's parent
    token: torch.Tensor  # [F*C]
    marginal_lp: torch.Tensor  # [F*C] full-vocabulary log-softmax of the base logits
    corrected_lp: torch.Tensor  # [F*C] `child_log_probs`: what the score adds
    score: torch.Tensor  # [F*C] parent score + corrected_lp
    rank: torch.Tensor  # [F*C] 0 = best candidate of this depth
    survived: torch.Tensor  # [F*C] bool: kept by the global cut
    node_index: torch.Tensor  # [F*C] index of the new node when survived, else -1
    keep: int  # how many survived
    continuity_lp: torch.Tensor | None = None  # [F*C] the n-gram term inside corrected_lp (None: off)


def child_log_probs(draft: Draft, depth: int, residual: torch.Tensor | None, temperature: float = 0.0,
                    top_p: float = 1.0, continuity: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probs of depth `depth`'s C candidates under F paths ([F, C]; [C] without a residual or a
    continuity term): the one scoring function of every tree builder.

    Where the head corrects (a residual [F, C]), the log-softmax of base + residual over the C candidates:
    the residual exists only on them. Where it does not (pure-draft depths, a drafter without a head), the
    full-vocabulary log-softmax of the base logits, as the reference scores them: normalised over the C
    candidates alone they would be inflated, and the cut would favour deeper nodes.

    `temperature` > 0 processes those log-probs as the target's sampler processes its logits
    (`processed_log_probs`: temperature, then top-p); 0 leaves them exactly as they are (greedy decoding).
    Derivation: at T > 0 the walk draws the target's token at a node from its processed distribution p_T
    and moves to the child carrying it, so a child is reached with probability p_T(child | its path) times
    its parent's chance, and a deterministic tree's expected accepted length is the sum over its nodes of
    the product of p_T along each node's path. A path score, a sum of log-probs, is the log of that product
    when each log-prob estimates log p_T, so the global top-W and the top-B cut then maximise the expected
    accepted length. The drafter learnt greedy labels, so its corrected probabilities q estimate
    P(argmax = token), sharper than the target's p_1: if q ~ p_1^k, then p_T ~ q^(1 / (k T)), a temperature
    of k T applied to the drafter's log-probs. Measured by τ on sampled continuations of train prompts
    (dartree.defaults, SCORE_TEMPERATURE_SCALE), k = 1.5 beats both the drafted scores (k = 1 at T = 1) and
    the target's own T (k = 1), so the settings' `score_temperature` is 1.5 T (dartree.defaults.score_temperature).

    `continuity` [F, C] (DART's n-gram term, w x log P_ngram <= 0: dartree.continuity) is added last, not
    renormalised, as DART adds it.
    """
    if residual is None:
        lp = draft.cand_marginal_lp[depth - 1]
    else:
        lp = torch.log_softmax(draft.cand_base_logits[depth - 1] + residual, dim=-1)
    lp = lp if temperature <= 0 else processed_log_probs(lp, temperature, top_p)
    return lp if continuity is None else lp + continuity


def fixed_quota_schedule(budget: int, depth: int):
    """dartree-fixed: at depth d keep ceil(remaining / remaining depths) nodes of the budget B."""
    state = {"remaining": budget}

    def keep(d: int, available: int) -> int:
        quota = math.ceil(state["remaining"] / (depth - d + 1))
        kept = min(quota, available)
        state["remaining"] -= kept
        return kept

    return keep


def width_schedule(width: int):
    """DARTree's supertree (and, with width 1, the chain): keep the global top-W at every depth."""
    return lambda d, available: min(width, available)


@contextmanager
def tree_threads(device: torch.device):
    """Build trees with one CPU thread: their ops are tiny ([W, C] scores, a GRU step), and handing each of
    them to a second thread costs more than it saves (a W = 8 supertree: 26 ms with 2 threads, 10 ms with 1,
    measured on this 2-core machine). The target and the drafter pass keep every thread."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


HOST_READ_FREE = ("cpu",)  # device types where reading a tensor's value costs no sync (the builder's early stop)


class DepthwiseBuilder:
    """Grow a tree depth by depth; each depth is one batched expansion of the whole frontier.

    At depth d the F frontier nodes each take the C candidates of position d. A candidate's log-prob is
    `child_log_probs` (corrected by the head for that node's path where the head applies); its score is
    the parent's score plus that. The global best `keep(d, F*C)` candidates
    survive, and the GRU states of the survivors are advanced by their tokens for the next depth.
    No host synchronisation happens inside a depth: keep counts are host ints.
    `cut_bonus` (dartree) makes `finish` cut the grown supertree to its best B by `prune_top_b` with
    that depth bonus; None keeps it whole (the keep schedule already respected the budget).
    `score_temperature` and `top_p` process the log-probs for sampling (`child_log_probs`; 0: greedy).
    `continuity` (a dartree.continuity.ContinuityTerm) adds DART's n-gram term to every score, from each frontier
    path's last n - 1 tokens (`root_tails` [1, n - 1] at the root, then carried beside the GRU states).

    `cut_budget` (dartree with a fixed B): stop growing once the cut is settled, i.e. when every frontier
    node's cut key is strictly below the B-th best key of the nodes grown so far. A descendant's key never
    exceeds its ancestor's (`prune_top_b`'s proof), so no deeper node could enter the top B, and the cut of
    the smaller supertree keeps exactly the nodes the whole one would (retrieved nodes only raise the
    bar). It costs one host read between depths (a bool), so it runs only where such a read is free
    (`HOST_READ_FREE`: the CPU, where the saved depths are time the round pays); on a GPU the depths queue
    without a sync and every one is grown.
    """

    def __init__(self, draft: Draft, corrector: Corrector, keep, depth: int | None = None,
                 cut_bonus: float | None = None, score_temperature: float = 0.0, top_p: float = 1.0,
                 cut_budget: int | None = None, continuity=None, root_tails: torch.Tensor | None = None):
        self.draft = draft
        self.continuity, self.frontier_tails = continuity, root_tails  # [F, n - 1]: the paths' last tokens
        self.score_temperature, self.top_p = score_temperature, top_p
        self.cut_bonus = cut_bonus
        dev = draft.cand_tokens.device
        self.cut_budget = cut_budget if cut_bonus is not None and dev.type in HOST_READ_FREE else None
        self.settled = False  # no deeper node could enter the top-B cut (`cut_budget`)
        self.corrector = corrector
        self.keep = keep
        self.depth = draft.depth if depth is None else min(depth, draft.depth)
        self._tokens = [draft.anchor.reshape(1).long()]
        self._parents = [torch.full((1,), -1, dtype=torch.long, device=dev)]
        self._depths = [torch.zeros(1, dtype=torch.long, device=dev)]
        self._scores = [torch.zeros(1, dtype=draft.cand_base_logits.dtype, device=dev)]
        self._size = 1
        self.frontier = torch.zeros(1, dtype=torch.long, device=dev)
        self.frontier_scores = self._scores[0]
        self.frontier_states = corrector.root_state()
        self.current_depth = 0
        self._best_keys = self._scores[0][:0]  # [<= cut_budget] the best cut keys grown so far, descending

    @property
    def done(self) -> bool:
        return self.current_depth >= self.depth or self.frontier.shape[0] == 0 or self.settled

    def _settle(self) -> None:
        """After a depth: is the top-B cut settled? (See the class docstring; the frontier is that depth's nodes.)"""
        keys = cut_keys(self.frontier_scores, self._depths[-1], self.cut_bonus)
        best = torch.cat([self._best_keys, keys])
        self._best_keys = best.topk(min(self.cut_budget, best.shape[0])).values
        if self._best_keys.shape[0] == self.cut_budget:
            self.settled = bool(keys.max() < self._best_keys[-1])  # the one host read, between depths

    def step(self) -> DepthExpansion:
        """Expand the next depth."""
        d = self.current_depth + 1
        draft = self.draft
        frontier = self.frontier
        n_frontier, n_cand = int(self.frontier.shape[0]), draft.num_candidates
        marginal = draft.cand_marginal_lp[d - 1].expand(n_frontier, n_cand)
        residual = self.corrector.residual(d, self.frontier_states)
        term = None if self.continuity is None else \
            self.continuity(self.frontier_tails, draft.cand_tokens[d - 1].expand(n_frontier, n_cand))
        corrected = child_log_probs(draft, d, residual, self.score_temperature, self.top_p, term)
        corrected = corrected.expand(n_frontier, n_cand)
        score = (self.frontier_scores[:, None] + corrected).reshape(-1)
        order = torch.sort(score, descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.shape[0], device=order.device)
        keep = self.keep(d, n_frontier * n_cand)
        kept = order[:keep]
        survived = torch.zeros_like(score, dtype=torch.bool)
        survived[kept] = True
        node_index = torch.full_like(order, -1)
        node_index[kept] = torch.arange(self._size, self._size + keep, device=order.device)

        parent_slot = kept // n_cand
        tokens = draft.cand_tokens[d - 1].repeat(n_frontier)
        parents_all = self.frontier.repeat_interleave(n_cand)
        new_tokens = tokens[kept]
        self._tokens.append(new_tokens)
        self._parents.append(self.frontier[parent_slot])
        self._depths.append(torch.full((keep,), d, dtype=torch.long, device=order.device))
        self._scores.append(score[kept])
        self.frontier = node_index[kept]
        self.frontier_scores = score[kept]
        self._size += keep
        self.current_depth = d
        if self.cut_budget is not None and d < self.depth and keep > 0:
            self._settle()
        if not self.done:
            self.frontier_states = self.corrector.advance(new_tokens, self.frontier_states[parent_slot])
            if self.continuity is not None:
                self.frontier_tails = self.continuity.advance(self.frontier_tails, parent_slot, new_tokens)
        return DepthExpansion(
            depth=d, frontier=frontier, parent=parents_all, token=tokens,
            marginal_lp=marginal.reshape(-1), corrected_lp=corrected.reshape(-1), score=score, rank=rank,
            survived=survived, node_index=node_index, keep=keep,
            continuity_lp=None if term is None else term.reshape(-1),
        )

    def run(self) -> list[DepthExpansion]:
        steps = []
        while not self.done:
            steps.append(self.step())
        return steps

    def tree(self) -> Tree:
        """The tree grown so far (the supertree once `done`)."""
        return Tree(torch.cat(self._tokens), torch.cat(self._parents), torch.cat(self._depths),
                    torch.cat(self._scores), self.current_depth)

    def finish(self, budget: int) -> tuple[Tree, Tree, torch.Tensor | None]:
        """(supertree, the tree to verify, the kept node indices into the supertree or None: all)."""
        supertree = self.tree()
        if self.cut_bonus is None:
            return supertree, supertree, None
        tree, kept = prune_top_b(supertree, budget, self.cut_bonus)
        return supertree, tree, kept


class HeapBuilder:
    """DDTree as a builder of one step: `ddtree_heap` grows its whole best-B tree in that step.

    Same protocol as DepthwiseBuilder (`step()`, `done`, `tree()`, `finish(budget)`), so the decoder and
    the replay drive every method alike; its one step returns the Tree itself rather than a depth.
    """

    def __init__(self, draft: Draft, budget: int, depth: int | None = None, score_temperature: float = 0.0,
                 top_p: float = 1.0):
        self.draft, self.budget, self.depth = draft, budget, depth
        self.score_temperature, self.top_p = score_temperature, top_p
        self._tree: Tree | None = None

    @property
    def done(self) -> bool:
        return self._tree is not None

    def step(self) -> Tree:
        self._tree = ddtree_heap(self.draft, self.budget, self.depth, self.score_temperature, self.top_p)
        return self._tree

    def run(self) -> list[Tree]:
        return [self.step()]

    def tree(self) -> Tree:
        return self._tree

    def finish(self, budget: int) -> tuple[Tree, Tree, None]:
        return self._tree, self._tree, None


def cut_keys(scores: torch.Tensor, depths: torch.Tensor, depth_bonus: float = 0.0) -> torch.Tensor:
    """How the deferred top-B cut ranks nodes: path score + depth_bonus x depth (the reference's rule).

    The one place that ranks nodes for the cut (the builder's early stop reads it too, so both compute the
    same keys bit for bit). A bonus below 0 trades depth for width: it charges every extra level, so a
    shallow sibling beats a deep node of about the same path score.
    """
    return scores + depth_bonus * depths.to(scores.dtype)


def cut_scores(tree: Tree, depth_bonus: float = 0.0) -> torch.Tensor:
    """`cut_keys` of every node of `tree` [N]."""
    return cut_keys(tree.scores, tree.depths, depth_bonus)


def prune_top_b(tree: Tree, budget: int, depth_bonus: float = 0.0) -> tuple[Tree, torch.Tensor]:
    """Deferred best-first pruning: the root plus the `budget` best nodes by `cut_scores`.

    The kept set is closed under taking parents for any depth_bonus <= 0. Proof: let c be a child of p.
    Its path score is s(p) + lp with lp <= 0 (a log-prob), so s(c) <= s(p), also after rounding (rounding
    is monotone). With b <= 0, b x depth(c) = b x depth(p) + b <= b x depth(p). So
    key(c) = s(c) + b x depth(c) <= s(p) + b x depth(p) = key(p), rounded or not. Nodes are ranked by
    (key descending, index ascending), a total order (a stable sort over the topological order), and p's
    index is below c's, so p precedes c in it. The kept nodes are a prefix of that order, hence every kept
    node's parent is kept, ties included. A positive bonus could rank a child above its parent, so it is
    refused. Returns the pruned tree and the kept node indices (sorted, into `tree`).
    """
    if depth_bonus > 0:
        raise ValueError(f"a depth bonus above 0 ({depth_bonus}) could keep a node without its parent")
    n = tree.num_nodes
    if budget >= n:
        keep = torch.arange(n + 1, device=tree.tokens.device)
        return tree, keep
    order = torch.sort(cut_scores(tree, depth_bonus)[1:], descending=True, stable=True).indices + 1
    keep = torch.cat([torch.zeros(1, dtype=torch.long, device=order.device), order[:budget]]).sort().values
    return tree.subset(keep), keep


def ddtree_heap(draft: Draft, budget: int, depth: int | None = None, score_temperature: float = 0.0,
                top_p: float = 1.0) -> Tree:
    """DDTree: the exact top-`budget` nodes under path score = sum of marginal log-probs.

    The marginals do not depend on the path, so a node's best unexplored relatives are its next sibling
    (same parent, next rank) and its first child (rank 0 one depth down). Popping the best from a heap
    of those B times yields the exact best-B set, in an order where parents precede children. A best-B
    tree has at most B children per node, so siblings come from the top min(B, V) tokens of the whole
    vocabulary, as DDTree's own builder takes them (`Draft.ranked_siblings`: wider than C when B > C).
    The heap runs on the host (one copy of the [D, S] marginals), as in the DDTree reference. At T > 0
    the marginals are processed like every builder's scores (`processed_log_probs`, the sampler's rule).
    """
    depth = draft.depth if depth is None else min(depth, draft.depth)
    ranked_tokens, ranked_lp = draft.ranked_siblings()
    if score_temperature > 0:
        ranked_lp = processed_log_probs(ranked_lp, score_temperature, top_p)
    lp = ranked_lp[:depth].double().cpu().tolist()
    toks = ranked_tokens[:depth].cpu().tolist()
    n_cand = int(ranked_tokens.shape[1])
    tokens, parents, depths, scores = [int(draft.anchor)], [-1], [0], [0.0]
    heap = [(-lp[0][0], 0, 1, 0, 0)] if depth >= 1 else []  # (-score, tiebreak, depth, rank, parent)
    counter = 1
    while heap and len(tokens) <= budget:
        neg, _, d, r, parent = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(toks[d - 1][r])
        parents.append(parent)
        depths.append(d)
        scores.append(-neg)
        if r + 1 < n_cand:
            heapq.heappush(heap, (-(scores[parent] + lp[d - 1][r + 1]), counter, d, r + 1, parent))
            counter += 1
        if d < depth:
            heapq.heappush(heap, (-(-neg + lp[d][0]), counter, d + 1, 0, node))
            counter += 1
    dev = draft.cand_tokens.device
    return Tree(torch.tensor(tokens, device=dev), torch.tensor(parents, device=dev),
                torch.tensor(depths, device=dev),
                torch.tensor(scores, dtype=draft.cand_base_logits.dtype, device=dev), depth)


def sequential_corrected_heap(draft: Draft, corrector: Corrector, budget: int, depth: int | None = None) -> Tree:
    """The exact best-`budget` tree under corrected path scores, grown one node at a time.

    This is what a DDTree-style best-first heap must do once scores depend on the path: every popped
    node needs its own correction-head call (a GRU step and a residual, batch of one) and a host round
    trip before its children can enter the heap. It has no width limit, so it is the reference DARTree's
    depth-batched supertree approximates, and the baseline its build time is compared with
    (`dartree.bench.tree_build_comparison`). Not used for decoding.
    """
    depth = draft.depth if depth is None else min(depth, draft.depth)
    tokens, parents, depths, scores, states = [int(draft.anchor)], [-1], [0], [0.0], [corrector.root_state()]
    children = {}  # node -> (sorted corrected log-probs, their candidate columns), on the host

    def expand(node: int):
        d = depths[node] + 1
        lp = child_log_probs(draft, d, corrector.residual(d, states[node])).reshape(-1)
        order = torch.sort(lp, descending=True, stable=True)
        children[node] = (order.values.double().tolist(), order.indices.tolist())

    heap = []
    counter = 0
    if depth >= 1 and budget >= 1:
        expand(0)
        heap.append((-children[0][0][0], 0, 0, 0))  # (-score, tiebreak, parent, rank)
    cand = draft.cand_tokens[:depth].tolist()
    while heap and len(tokens) <= budget:
        neg, _, parent, rank = heapq.heappop(heap)
        d = depths[parent] + 1
        column = children[parent][1][rank]
        node = len(tokens)
        tokens.append(cand[d - 1][column])
        parents.append(parent)
        depths.append(d)
        scores.append(-neg)
        if rank + 1 < len(children[parent][0]):
            counter += 1
            heapq.heappush(heap, (-(scores[parent] + children[parent][0][rank + 1]), counter, parent, rank + 1))
        if d < depth:
            tok = torch.tensor([tokens[node]], device=draft.cand_tokens.device)
            states.append(corrector.advance(tok, states[parent]))
            expand(node)
            counter += 1
            heapq.heappush(heap, (-(scores[node] + children[node][0][0]), counter, node, 0))
        else:
            states.append(None)
    dev = draft.cand_tokens.device
    return Tree(torch.tensor(tokens, device=dev), torch.tensor(parents, device=dev), torch.tensor(depths, device=dev),
                torch.tensor(scores, dtype=draft.cand_base_logits.dtype, device=dev), depth)
