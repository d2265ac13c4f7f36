"""Retrieval branches: context n-grams and an online successor table, merged into the draft tree.

The drafter guesses; much of what a model writes can be looked up instead (a name copied from the prompt,
a code identifier, the model's own recurring phrases). Two sources propose extra branches each round,
and they join the drafted supertree *before* the top-B cut, so drafted and retrieved nodes compete for
the same budget B under the one ranking `dartree.tree.cut_scores`:

- **context n-grams** (`ngram_proposals`): the longest suffix (n <= 4) of the committed ids (prompt +
  output, the anchor last) is matched earlier in the context; the tokens that followed each of the most
  recent few matches become chains of up to D nodes hanging off the root;
- **a successor table** (`SuccessorTable`, after Graft, "Draft Less, Retrieve More"): M[V, k] holds,
  per token, the target's top-k next tokens the last time a node with that token was verified
  (accepted or not). A walk of M from the root proposes a small subtree: M[anchor]'s k entries at depth
  1, each continued by its row's first entry down to depth D.

**Merging** (`merge`): a node is its path from the root. A retrieved node whose path is already in the
tree IS that node (no duplicate siblings): it keeps its index, takes the better of the two scores and
gains the source's bit; the other retrieved nodes are appended, depth by depth, under their merged
parents. Every node carries `sources`, a bit mask of DRAFT / NGRAM / TABLE (`source_label` names it:
draft, ngram, table, or both when two sources proposed it).

**Scores** (`AcceptanceRates`): a retrieved node's score is a path log-score like a drafted one's, the
sum along its proposal path of log r(source, slot), where r is the rate at which such nodes were accepted
when their parent was (so the sum estimates log P(node on the accepted path)). The slot is the n-gram's
match length and depth, or the table entry's column at depth 1 and the depth below it. The rates are
learned online, per generation: Beta-prior counts (`RETRIEVAL_PRIORS` in dartree.defaults, each worth
`PRIOR_WEIGHT` observations) plus the nodes of this generation's verified trees whose parent was
accepted. Drafted scores are on the same scale: the shipped auto-budget calibration
(assets/benchmarks/auto-budget.json, P(on path | draft path score), dartree.budget) gives rates close
to exp(score): 0.13 in the bin [-2, -1.5), 0.24 in [-1.5, -1), 0.42 in [-1, -0.5), 0.83 above -0.5;
so log P compares with a draft score without a conversion. Since every log-rate is <= 0, a retrieved
child scores at most its parent, the merge takes maxima of such chains, and the cut's prefix-closure
proof (`prune_top_b`) holds for the merged tree.

**Costs.** Everything is batched tensor code: the n-gram match is max_n shifted comparisons over the
context (at 2,048 tokens: 4 x 2,047 element comparisons, a cumulative product over them and one top-k,
no per-position loop; a median 0.15 ms on this loaded 2-core CPU); the table walk is D gathers (0.1 ms);
the merge is a sort per depth to give equal paths one id (`path_ids`) and a few scatters (0.7 ms for a
W = 4 supertree plus both sources' chains, D = 7; a CPU round is ~60 ms). Retrieval runs once per round,
between the last depth and the cut, and reads nothing back to the host there: the merged tree has a static
size (`merge_padded`: every proposal slot keeps its place, repeated paths and invalid slots become dead
nodes the cut ranks last), which works whenever B is at most the drafted supertree's size; only a larger B
or the auto budget compacts it to its live nodes (`compact`, one read). The committed tokens join the
n-gram context from the device (`Retriever.extend`). Nothing here knows about models: tensors in, nodes out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import Tree

RETRIEVAL_MODES = ("none", "ngram", "table", "both")
DRAFT, NGRAM, TABLE = 1, 2, 4  # a node's `sources` bits
SOURCE_BITS = {"draft": DRAFT, "ngram": NGRAM, "table": TABLE}
RETRIEVED = ("ngram", "table")
MAX_NGRAM = 4  # longest suffix matched
NGRAM_BRANCHES = 3  # most recent matches proposed as branches
TABLE_WIDTH = 4  # k: successors kept per token


def source_label(bits: int) -> str:
    """draft / ngram / table, or both when more than one source proposed the node."""
    names = [name for name, bit in SOURCE_BITS.items() if bits & bit]
    return names[0] if len(names) == 1 else "both"


def mode_sources(mode: str) -> tuple[str, ...]:
    """The retrieval sources a --retrieval mode turns on."""
    return {"none": (), "ngram": ("ngram",), "table": ("table",), "both": RETRIEVED}[mode]


def max_retrieved(mode: str, depth: int) -> int:
    """The most nodes a round's retrieval can add to the supertree: every source's chains, D nodes each."""
    chains = {"ngram": NGRAM_BRANCHES, "table": TABLE_WIDTH}
    return sum(chains[s] for s in mode_sources(mode)) * depth


@dataclass
class Proposals:
    """Retrieved nodes as chains hanging off the root: R chains of up to D nodes ([R, D] each)."""

    tokens: torch.Tensor  # [R, D] long
    valid: torch.Tensor  # [R, D] bool, a prefix of every chain
    slots: torch.Tensor  # [R, D] long: the calibration slot of each node within its source
    source: str  # "ngram" or "table"


# ---------------------------------------------------------------------------------------------- n-grams
def ngram_matches(seq: torch.Tensor, max_n: int = MAX_NGRAM, branches: int = NGRAM_BRANCHES):
    """The most recent earlier occurrences of the longest suffix of `seq` ([L] long), n <= max_n.

    Returns (ends [R], n [R], valid [R]): the index of each match's last token (most recent first), the
    match length n (the same for all: the longest with any match), and whether the slot holds a match.
    Vectorised: for each candidate end j < L - 1 and each k < max_n, seq[j - k] == seq[L - 1 - k]; the
    cumulative product over k gives each end's match length; one top-k over (length, recency) picks them.
    """
    L = int(seq.shape[0])
    dev = seq.device
    n_max = min(max_n, L)
    ends = torch.arange(max(L - 1, 0), device=dev)  # a match must end before the suffix's own last token
    if ends.numel() == 0 or n_max == 0:
        z = torch.zeros(0, dtype=torch.long, device=dev)
        return z, z, z.bool()
    back = torch.arange(n_max, device=dev)
    idx = ends[None, :] - back[:, None]  # [n, L-1]
    eq = (seq[idx.clamp(min=0)] == seq[L - 1 - back][:, None]) & (idx >= 0)
    length = torch.cumprod(eq.long(), dim=0).sum(0)  # [L-1] matched suffix length at each end
    r = min(branches, ends.numel())
    top = torch.topk(length * L + ends, r).indices  # longest first, then most recent
    n = length[top]
    return ends[top], n, (n == length.max()) & (n > 0)


def ngram_proposals(seq: torch.Tensor, depth: int, max_n: int = MAX_NGRAM,
                    branches: int = NGRAM_BRANCHES) -> Proposals:
    """Chains of the tokens that followed the latest matches of the committed suffix (slot: (n - 1) x D + d - 1)."""
    ends, n, ok = ngram_matches(seq, max_n, branches)
    L = int(seq.shape[0])
    steps = torch.arange(depth, device=seq.device)
    pos = ends[:, None] + 1 + steps[None, :]  # [R, D]
    valid = ok[:, None] & (pos <= L - 1)
    tokens = seq[pos.clamp(max=max(L - 1, 0))] if L else torch.zeros_like(pos)
    slots = (n.clamp(min=1) - 1)[:, None] * depth + steps[None, :]
    return Proposals(tokens, valid, slots, "ngram")


def ngram_slots(depth: int, max_n: int = MAX_NGRAM) -> int:
    return max_n * depth


# ------------------------------------------------------------------------------------- successor table
class SuccessorTable:
    """M[V, k]: each token's top-k successors as the target last saw them (-1: unknown).

    Initialisation from the prefill: the prefill computes the logits of its last row only (49k-wide
    logits for every prompt row would cost more than the prefill's own layers on a CPU: at 2,048 tokens
    2,048 x 49,152 x 576 multiply-adds, ~58 GFLOP), so the last prompt token's row takes the top-k of
    those logits, and every other prompt token's row takes, in its first column, the token that followed
    its latest occurrence in the prompt (what the target's argmax there most often is, for free).
    After each verify, every verified node's row takes the target's top-k at that node (`update`).
    Row V is a scratch row that absorbs writes that lose a tie (so no write has duplicate indices).
    """

    def __init__(self, vocab_size: int, k: int = TABLE_WIDTH, device=None):
        self.vocab_size, self.k = vocab_size, k
        self.table = torch.full((vocab_size + 1, k), -1, dtype=torch.long, device=device)

    def _write(self, rows: torch.Tensor, values: torch.Tensor, priority: torch.Tensor) -> None:
        """table[rows[i]] = values[i], the highest priority winning among equal rows (deterministic)."""
        n = int(rows.shape[0])
        if n == 0:
            return
        order = torch.argsort(rows * (2 * n + 1) + priority)  # by row, then priority: the last of a run wins
        rows_sorted = rows[order]
        last = torch.ones_like(rows_sorted, dtype=torch.bool)
        last[:-1] = rows_sorted[:-1] != rows_sorted[1:]
        self.table[torch.where(last, rows_sorted, self.vocab_size)] = values[order]

    def seed(self, prompt: torch.Tensor, last_logits: torch.Tensor) -> None:
        """From the prefill: prompt successors in column 0, the last row's top-k for the last token."""
        rows, nxt = prompt[:-1], prompt[1:]
        values = torch.full((int(rows.shape[0]), self.k), -1, dtype=torch.long, device=prompt.device)
        values[:, 0] = nxt
        self._write(rows, values, torch.arange(rows.shape[0], device=prompt.device))  # latest occurrence wins
        self.table[prompt[-1]] = torch.topk(last_logits.reshape(-1), self.k).indices

    def update(self, tokens: torch.Tensor, logits: torch.Tensor, accepted: torch.Tensor) -> None:
        """After a verify: row tokens[i] = top-k of logits[i] for every verified node, accepted or not.

        Several nodes may carry one token; the accepted one wins (its context is the real one), then the
        later node in topological order.
        """
        n = int(tokens.shape[0])
        priority = accepted.long() * n + torch.arange(n, device=tokens.device)
        self._write(tokens, torch.topk(logits, self.k, dim=-1).indices, priority)

    def proposals(self, anchor: torch.Tensor, depth: int) -> Proposals:
        """The walk from the root: M[anchor]'s k entries at depth 1, each followed by its rows' first entry.

        Slots: the column c at depth 1, then k + d - 2 at depth d >= 2.
        """
        dev = self.table.device
        cols = [self.table[anchor.reshape(())]]  # [k]
        for _ in range(depth - 1):
            prev = cols[-1]
            cols.append(torch.where(prev >= 0, self.table[prev.clamp(min=0), 0], -1))
        tokens = torch.stack(cols, dim=1)  # [k, D]
        valid = torch.cumprod((tokens >= 0).long(), dim=1).bool()
        d = torch.arange(depth, device=dev)
        slots = torch.where(d[None, :] == 0, torch.arange(self.k, device=dev)[:, None], self.k + d[None, :] - 1)
        return Proposals(tokens.clamp(min=0), valid, slots, "table")


def table_slots(depth: int, k: int = TABLE_WIDTH) -> int:
    return k + depth - 1


# ------------------------------------------------------------------------------------ acceptance rates
def slot_priors(depth: int, priors: dict, k: int = TABLE_WIDTH, max_n: int = MAX_NGRAM, device=None) -> dict:
    """Per-slot prior rates from dartree.defaults.RETRIEVAL_PRIORS: n-grams by match length (every depth
    alike), the table by column at depth 1 and one rate for the chains below. Built once per generation."""
    f64 = {"dtype": torch.float64, "device": device}
    ngram = torch.tensor(priors["ngram"], **f64)[:max_n].repeat_interleave(depth)
    table = torch.cat([torch.tensor(priors["table"], **f64)[:k],
                       torch.full((depth - 1,), float(priors["table_chain"]), **f64)])
    assert ngram.shape[0] == ngram_slots(depth, max_n) and table.shape[0] == table_slots(depth, k)
    return {"ngram": ngram, "table": table}


class AcceptanceRates:
    """Online P(a retrieved node is accepted | its parent is), per source and slot, with a Beta prior.

    rate = (hits + w x prior) / (seen + w). `observe` counts, in a verified tree, every node a source
    proposed whose parent was accepted; a node the cut dropped is not seen.
    """

    def __init__(self, priors: dict, prior_weight: float, device=None):
        self.prior_weight = prior_weight
        self.prior = {s: p.to(device) for s, p in priors.items()}
        self.hits = {s: torch.zeros_like(p) for s, p in self.prior.items()}
        self.seen = {s: torch.zeros_like(p) for s, p in self.prior.items()}

    def log_rate(self, source: str) -> torch.Tensor:
        w = self.prior_weight
        return torch.log((self.hits[source] + w * self.prior[source]) / (self.seen[source] + w)).float()

    def scores(self, p: Proposals) -> torch.Tensor:
        """[R, D] path scores: the cumulative sum of the log-rates along each chain."""
        return torch.cumsum(self.log_rate(p.source)[p.slots], dim=1)

    def observe(self, p: Proposals, node: torch.Tensor, parents: torch.Tensor, accepted: torch.Tensor) -> None:
        """`node` [R, D]: each proposal's index in the verified tree (-1: invalid or cut)."""
        placed = node >= 0
        safe = node.clamp(min=0)
        seen = placed & accepted[parents[safe].clamp(min=0)]
        hit = seen & accepted[safe]
        self.seen[p.source].index_add_(0, p.slots.reshape(-1), seen.reshape(-1).double())
        self.hits[p.source].index_add_(0, p.slots.reshape(-1), hit.reshape(-1).double())


# ------------------------------------------------------------------------------------------- the merge
def path_ids(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[M] an id per node, equal for two nodes exactly when their paths from the root are equal.

    Depth by depth: a node's key is (its parent's id, its token); the ids of depth d are the ranks of the
    distinct keys of that depth (a sort and a cumulative sum: no host read), offset by d x M so that
    depths never share an id. The root (depth 0) is id 0.
    """
    m = int(tokens.shape[0])
    ids = torch.zeros(m, dtype=torch.long, device=tokens.device)
    span = (max_depth + 1) * m + 1
    for d in range(1, max_depth + 1):
        at = depths == d
        key = torch.where(at, ids[parents.clamp(min=0)] * span + tokens + 1, -1)
        sorted_key, order = torch.sort(key)
        first = torch.ones_like(at)
        first[1:] = sorted_key[1:] != sorted_key[:-1]
        rank = torch.empty_like(ids)
        rank[order] = torch.cumsum(first.long(), 0)
        ids = torch.where(at, d * m + rank, ids)
    return ids


def merge_padded(tree: Tree, proposals: list[Proposals], scores: list[torch.Tensor]) -> tuple[Tree, list[torch.Tensor]]:
    """The proposals' chains merged into `tree` without a host read: a tree of static size, N + sum(R x D).

    Tree nodes keep their indices; the chains follow, row-major, each slot at its own index. A slot whose
    path is new and valid is *live*: the first valid slot of its path (the lowest index) represents it, with
    the best score of the path's proposals and the OR of their sources; its parent is its chain parent's
    representative, at a lower index, so parents still precede children. Every other slot (invalid, or a
    path already present: in the tree or in an earlier chain) is *dead*: score -inf, sources 0, parent the
    root, so the cut ranks it last and `live_nodes` drops it. Returns the padded tree and each proposal's
    node index ([R, D], -1: invalid).
    """
    dev = tree.tokens.device
    n = int(tree.tokens.shape[0])
    src = tree.sources if tree.sources is not None else torch.full((n,), DRAFT, dtype=torch.long, device=dev)
    toks, pars, deps, scs, bits, valid = [tree.tokens], [tree.parents], [tree.depths], [tree.scores], [src], \
        [torch.ones(n, dtype=torch.bool, device=dev)]
    offset, max_depth = n, tree.max_depth
    for p, s in zip(proposals, scores):
        r, d = p.tokens.shape
        base = offset + torch.arange(r, device=dev)[:, None] * d
        chain_parent = torch.cat([torch.zeros(r, 1, dtype=torch.long, device=dev),
                                  base + torch.arange(d - 1, device=dev)[None, :]], dim=1)  # [R, D]
        toks.append(p.tokens.reshape(-1))
        pars.append(chain_parent.reshape(-1))
        deps.append(torch.arange(1, d + 1, device=dev).repeat(r))
        scs.append(s.reshape(-1).to(tree.scores.dtype))
        bits.append(torch.full((r * d,), SOURCE_BITS[p.source], dtype=torch.long, device=dev))
        valid.append(p.valid.reshape(-1))
        offset += r * d
        max_depth = max(max_depth, d)
    tokens, parents, depths = torch.cat(toks), torch.cat(pars), torch.cat(deps)
    node_scores, sources, valid = torch.cat(scs), torch.cat(bits), torch.cat(valid)
    m = int(tokens.shape[0])
    idx = torch.arange(m, device=dev)

    group = path_ids(tokens, parents, depths, max_depth)
    g = (max_depth + 1) * m + 1  # id space (most ids unused: the scatters below are over a few hundred slots)
    rep = torch.full((g,), m, dtype=torch.long, device=dev).scatter_reduce(
        0, group, torch.where(valid, idx, m), "amin")  # a path's representative: its first valid slot
    live = valid & (rep[group] == idx)  # tree nodes are valid and come first: each represents its path
    group_score = torch.full((g,), float("-inf"), dtype=node_scores.dtype, device=dev).scatter_reduce(
        0, group, torch.where(valid, node_scores, float("-inf")), "amax")
    shifts = torch.arange(3, device=dev)
    group_bits = torch.zeros((g, 3), dtype=torch.long, device=dev).scatter_reduce(
        0, group[:, None].expand(m, 3), (sources[:, None] >> shifts) & valid[:, None].long() & 1, "amax")
    group_bits = (group_bits << shifts).sum(1)

    rep_parent = torch.where(parents >= 0, rep[group[parents.clamp(min=0)]], -1)
    merged = Tree(tokens, torch.where(live, rep_parent, 0), depths,
                  torch.where(live, group_score[group], float("-inf")), max_depth,
                  torch.where(live, group_bits[group], 0))
    nodes, start = [], n
    for p in proposals:
        size = p.tokens.numel()
        at = rep[group[start:start + size]]
        nodes.append(torch.where(valid[start:start + size], at, -1).reshape(p.tokens.shape))
        start += size
    return merged, nodes


def live_nodes(tree: Tree) -> torch.Tensor:
    """[N] bool: the nodes of a padded merged tree (`merge_padded`) that are real (all of an unmerged tree's)."""
    if tree.sources is None:
        return torch.ones_like(tree.tokens, dtype=torch.bool)
    return tree.sources != 0


def compact(tree: Tree) -> tuple[Tree, torch.Tensor]:
    """A padded merged tree without its dead slots, and the old -> new index map ([N], -1: dropped).

    One host read (how many nodes live): used where the tree's size must be its live size (a cut that may
    keep every node, the tests' brute force); the decoder's usual cut reads nothing (`Retriever.round_tree`).
    """
    keep = torch.nonzero(live_nodes(tree)).squeeze(-1)
    remap = torch.full_like(tree.parents, -1)
    remap[keep] = torch.arange(keep.shape[0], device=keep.device)
    return tree.subset(keep), remap


def merge(tree: Tree, proposals: list[Proposals], scores: list[torch.Tensor]) -> tuple[Tree, list[torch.Tensor]]:
    """`merge_padded` with the dead slots dropped (`compact`): the merged tree at its live size."""
    padded, nodes = merge_padded(tree, proposals, scores)
    merged, remap = compact(padded)
    return merged, [torch.where(node >= 0, remap[node.clamp(min=0)], -1) for node in nodes]


# ------------------------------------------------------------------------------------------ one decoder's
class Retriever:
    """One generation's retrieval state: the committed ids, the successor table and the acceptance rates.

    The decoder calls `start` after the prefill, `round_tree` between building and cutting the tree,
    `observe` after each verify and `extend` with the committed tokens. Per generation, never shared.
    """

    def __init__(self, mode: str, vocab_size: int, depth: int, capacity: int, priors: dict, prior_weight: float,
                 device=None):
        self.sources = mode_sources(mode)
        self.depth = depth
        self.history = torch.zeros(capacity, dtype=torch.long, device=device)
        self.length = 0
        self.table = SuccessorTable(vocab_size, device=device) if "table" in self.sources else None
        self.rates = AcceptanceRates(slot_priors(depth, priors, device=device), prior_weight, device)
        self.round: list[tuple[Proposals, torch.Tensor]] = []  # this round's proposals and their merged nodes
        self.merged_size = 0

    def extend(self, tokens: torch.Tensor) -> None:
        """Append committed tokens ([n] long, on the device: no host copy) to the context the n-grams search."""
        n = int(tokens.shape[0])
        self.history[self.length:self.length + n] = tokens
        self.length += n

    def start(self, prompt_ids: list[int], first: torch.Tensor, last_logits: torch.Tensor) -> None:
        """After the prefill: the prompt and first token ([1] long) are the context; the table is seeded."""
        dev = self.history.device
        self.extend(torch.cat([torch.tensor(list(prompt_ids), dtype=torch.long, device=dev), first.reshape(1).to(dev)]))
        if self.table is not None:
            self.table.seed(self.history[:len(prompt_ids)], last_logits)

    def propose(self) -> list[Proposals]:
        """This round's chains from every source; the anchor is the context's last token."""
        out = []
        if "ngram" in self.sources:
            out.append(ngram_proposals(self.history[:self.length], self.depth))
        if "table" in self.sources:
            out.append(self.table.proposals(self.history[self.length - 1], self.depth))
        return out

    def round_tree(self, supertree: Tree, budget: int | None) -> Tree:
        """The supertree with this round's retrieved chains merged in, scored by the online rates.

        Padded (`merge_padded`, no host read) when the cut keeps `budget` <= the drafted nodes: those are live
        with finite scores, so the top B are live. Otherwise (a budget above the drafted supertree, or None:
        the auto budget chooses from the merged scores) the cut may reach past them, and the tree is
        compacted to its live nodes (one host read, where a small supertree or the auto budget asks for it).
        """
        proposals = self.propose()
        merged, nodes = merge_padded(supertree, proposals, [self.rates.scores(p) for p in proposals])
        if budget is None or budget > supertree.num_nodes:
            merged, remap = compact(merged)
            nodes = [torch.where(node >= 0, remap[node.clamp(min=0)], -1) for node in nodes]
        self.round = list(zip(proposals, nodes))
        self.merged_size = int(merged.tokens.shape[0])
        return merged

    def observe(self, kept: torch.Tensor | None, tree: Tree, accepted: torch.Tensor,
                logits: torch.Tensor | None = None) -> None:
        """After a verify: count the proposals' outcomes (`kept`: the cut's indices into the merged tree,
        None: all kept) and write the target's top-k at every verified node into the table."""
        if self.round:
            remap = torch.arange(tree.tokens.shape[0], device=tree.tokens.device)
            if kept is not None:
                remap = torch.full((self.merged_size,), -1, dtype=torch.long, device=kept.device)
                remap[kept] = torch.arange(kept.shape[0], device=kept.device)
            for p, node in self.round:
                self.rates.observe(p, torch.where(node >= 0, remap[node.clamp(min=0)], -1), tree.parents, accepted)
        if self.table is not None and logits is not None:
            self.table.update(tree.tokens, logits, accepted)
        self.round = []


def source_counts(supertree: Tree, tree: Tree, accepted: torch.Tensor, accepted_count: int) -> dict:
    """Per source: nodes proposed (in the merged supertree), verified (kept by the cut) and accepted, root
    excluded; a node two sources proposed counts for each. One small host copy (the commit's)."""
    if supertree.sources is None or tree.sources is None:  # drafted only: sizes are host ints already
        return {"draft": {"proposed": supertree.num_nodes, "verified": tree.num_nodes, "accepted": accepted_count}}
    bits = 1 << torch.arange(len(SOURCE_BITS), device=tree.tokens.device)  # DRAFT, NGRAM, TABLE
    sup = (supertree.sources[1:, None] & bits) > 0
    mine = (tree.sources[1:, None] & bits) > 0
    table = torch.stack([sup.sum(0), mine.sum(0), (mine & accepted[1:, None]).sum(0)]).tolist()
    return {name: {"proposed": table[0][i], "verified": table[1][i], "accepted": table[2][i]}
            for i, name in enumerate(SOURCE_BITS)}
