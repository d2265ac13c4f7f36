"""Replay: the acceptance of every (method, W, B) on the same prompts, without decoding each one.

At T = 0 a round's outcome is a function of the committed text alone: the drafter's block at
position p depends on the committed tokens before p (through the target features of its context)
and on the anchor token at p; the tree is a function of that block; and the accepted path is the
longest tree path that spells the greedy continuation, which is the plain-decoding output itself.
So one greedy continuation per prompt, one teacher-forced target pass for its features, and one
drafter block per position (shared by all configurations) give every configuration's rounds
exactly as the decoder would run them, up to floating-point noise in the features. The builders
are the engine's own (`build_round_tree`), so the replay cannot drift from what the engine does.

At T > 0 the same replay holds in distribution, on a continuation sampled by plain decoding at the
settings' temperature and top-p. The walk draws the target's token at the root from its processed
distribution, moves to the child carrying it, draws again there, and so on: that is plain sampling of
the continuation, one token at a time, followed down the tree for as long as the tree spells it. So
"the longest tree path that spells a sampled continuation" has exactly the distribution of the accepted
path, and the tokens committed (accepted + bonus) are the continuation's next ones. Every configuration
is replayed on the same samples (common random numbers), so their τ differ by less noise than separate
decodes would.

Retrieval (dartree.retrieval): context n-grams are replayed too. Their proposals depend on the committed
text alone and their scores on the acceptance counts of earlier rounds, which are the nodes on the
continuation's path (`matched_nodes`), so the replay runs the decoder's own `Retriever` beside the rounds.
The successor table reads the target's logits at every verified node, which a replay of one continuation
does not have: configurations with it (`table`, `both`) are decoded instead (`decoded_rounds`), their τ as
exact (at T > 0: on their own sample); they only cost a real decode each. `replay` refuses them rather
than replay another mode than asked.

What a replay does not measure is the target's verify time: that comes from the measured cost
curve (dartree.bench.cost_curve), so replayed speeds are predictions, reported as such, and the
benchmark proper (`run_bench`, interleaved real decoding) checks them on the best configurations.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .cache import new_cache
from .draft import DrafterContext, PathCorrector, draft_block
from .continuity import continuity_term, round_continuity
from .engine import DecodeSettings, build_round_tree, generate, make_retriever, sibling_count
from .methods import METHODS
from .retrieval import live_nodes


@dataclass
class Continuation:
    """A prompt, its greedy continuation and everything a replayed round needs to know about it."""

    prompt_ids: list[int]
    output_ids: list[int]  # plain decoding's continuation (what every lossless method commits at T = 0; a sample at T > 0)
    context: DrafterContext  # drafter context K/V of every position of prompt + output
    blocks: dict = field(default_factory=dict)  # position -> BlockDraft
    draft_seconds: list = field(default_factory=list)

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@torch.inference_mode()
def make_continuation(target, drafter, prompt_ids: list[int], output_ids: list[int]) -> Continuation:
    """Teacher-force prompt + output through the target once and project every position's features."""
    seq = prompt_ids + output_ids
    layers = tuple(drafter.cfg.target_layer_ids)
    out = target.prefill(seq, new_cache(target, len(seq)), layers)
    return Continuation(list(prompt_ids), list(output_ids), DrafterContext.from_prefill(drafter, out.features))


def _block_at(cont: Continuation, drafter, target, position: int, s: DecodeSettings):
    key = (position, s.depth, s.candidates, sibling_count(s))
    if key not in cont.blocks:
        t0 = time.perf_counter()
        anchor = torch.tensor(cont.sequence[position], device=target.device)
        cont.blocks[key] = draft_block(drafter, target, cont.context.prefix(position), anchor, position,
                                       *key[1:])
        cont.draft_seconds.append(time.perf_counter() - t0)
    return cont.blocks[key]


def matched_nodes(tree, sequence: list[int], position: int) -> torch.Tensor:
    """[N] bool: the nodes whose whole path spells sequence[position + 1 : ...] (the root always does).

    Level by level on tensors: a node at depth d matches when its token is the continuation's token
    d places after the anchor and its parent matched. Siblings carry distinct tokens, so the matched
    nodes are one path: the one the target accepts at T = 0.
    """
    dev = tree.tokens.device
    ahead = torch.tensor(sequence[position + 1:position + 1 + tree.max_depth] or [-1], device=dev)
    depth = tree.depths
    want = ahead[(depth - 1).clamp(min=0, max=ahead.shape[0] - 1)]
    ok = (tree.tokens == want) & (depth <= ahead.shape[0])
    ok[0] = True
    matched = ok.clone()
    for _ in range(tree.max_depth):  # propagate "all ancestors match" down at most D levels
        matched = ok & matched[tree.parents.clamp(min=0)]
        matched[0] = True
    return matched


def accepted_depth(tree, sequence: list[int], position: int) -> int:
    """Depth of the deepest matched node: the number of draft tokens the target accepts."""
    return int(torch.where(matched_nodes(tree, sequence, position), tree.depths, 0).max())


@dataclass
class ReplayRounds:
    """One configuration replayed on one continuation."""

    committed: list[int]  # tokens committed per round (accepted + bonus, cut at EOS/length)
    nodes: list[int]  # tree size (excluding the root) per round
    tree_seconds: list[float]  # measured tree-build time per round
    supertree_scores: list = field(default_factory=list)  # (scores [n], on_path [n] bool) for calibration


@torch.inference_mode()
def replay(target, drafter, cont: Continuation, settings: DecodeSettings, keep_scores: bool = False,
           budget_policy=None) -> ReplayRounds:
    """Rounds of one configuration on one continuation, as the decoder would run them (at T > 0: on this
    sample), its resolved retrieval included (none or ngram; see the module docstring for the table)."""
    s = settings.validated(drafter.max_depth, target.vocab_size, target.device.type, budget_policy is not None)
    s, term = continuity_term(s, target)
    if not replayable(s):
        raise ValueError(f"retrieval {s.retrieval!r} reads the target's logits at every verified node: "
                         "decode it (decoded_rounds), a replay cannot")
    seq = cont.sequence
    position = len(cont.prompt_ids)  # the first output token is the first anchor (prefill made it)
    produced = 1
    total = len(cont.output_ids)
    dev = target.device
    retriever = make_retriever(s, target, s.depth)
    if retriever is not None:  # the prompt and the prefill's token; no logits: the n-grams do not read them
        retriever.start(cont.prompt_ids, torch.tensor(seq[position:position + 1], device=dev), None)
    out = ReplayRounds([], [], [])
    while produced < total:
        block = _block_at(cont, drafter, target, position, s)
        done = cont.output_ids[:position + 1 - len(cont.prompt_ids)]  # the output committed before this round
        continuity = round_continuity(term, dev, cont.prompt_ids, done)
        t0 = time.perf_counter()
        supertree, tree, kept = build_round_tree(s, block, PathCorrector(drafter, target, block), budget_policy,
                                                 retriever, continuity)
        out.tree_seconds.append(time.perf_counter() - t0)
        on_tree_path = matched_nodes(tree, seq, position)  # at T = 0: the nodes the target accepts
        accepted = int(torch.where(on_tree_path, tree.depths, 0).max())
        if keep_scores:
            live = live_nodes(supertree)
            on_path = matched_nodes(supertree, seq, position) & live
            out.supertree_scores.append((supertree.scores[1:][live[1:]].cpu(), on_path[1:][live[1:]].cpu()))
        committed = min(accepted + 1, total - produced)
        if retriever is not None:
            retriever.observe(kept, tree, on_tree_path)
            retriever.extend(torch.tensor(seq[position + 1:position + 1 + committed], device=dev))
        out.committed.append(committed)
        out.nodes.append(tree.num_nodes)
        produced += committed
        position += committed
    return out


@torch.inference_mode()
def replayable(settings: DecodeSettings) -> bool:
    """Whether `replay` reproduces these (resolved) settings: every retrieval mode but the successor table's."""
    return settings.retrieval in (None, "none", "ngram")


@torch.inference_mode()
def decoded_rounds(target, drafter, cont: Continuation, settings: DecodeSettings) -> ReplayRounds:
    """One configuration's rounds by real decoding, for configurations a replay cannot reproduce (at T > 0 its
    own sample, of the same distribution as the continuation's)."""
    result = generate(target, drafter, cont.prompt_ids, replace(settings, max_new_tokens=len(cont.output_ids)))
    exact = target.dtype == torch.float32 and settings.temperature == 0
    if exact and result.token_ids != cont.output_ids:  # fp32, T = 0: exactly plain's
        raise RuntimeError(f"{settings.method} with retrieval {settings.retrieval!r} decoded other tokens than plain "
                           "decoding: retrieval broke the lossless guarantee")
    records = result.round_records
    return ReplayRounds([r.committed for r in records], [r.tree_nodes for r in records],
                        [r.seconds["tree"] for r in records])


def plain_outputs(models, prompts: list[str], max_new_tokens: int, progress=True, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, continuation) per prompt, decoded by plain AR with the engine: greedy at T = 0, else
    sampled (the temperature, top-p and seed of the settings being replayed)."""
    from tqdm import tqdm

    target = models.target
    pairs = []
    settings = DecodeSettings(method="ar", max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              seed=seed)
    for p in tqdm(prompts, desc="plain continuations", disable=not progress, unit="prompt"):
        ids = target.chat_ids(p)
        result = generate(target, None, ids, settings)
        pairs.append((ids, result.token_ids))
    return pairs


def predicted_round_seconds(nodes: int, costs: dict, drafted: bool = True) -> float:
    """t_draft + t_verify(nodes + 1) + t_commit from the measured cost curve (tree time is added apart)."""
    return (costs["draft_seconds"] if drafted else 0.0) + interpolate_verify(costs, nodes + 1) \
        + costs.get("commit_seconds", 0.0)


def interpolate_verify(costs: dict, n: int) -> float:
    """t_verify(n) from the measured cost curve: linear between measured sizes (numpy.interp), below the
    first the first, and past the last the last segment's slope continued (np.interp would clamp there,
    and a verify of more tokens than measured is not free)."""
    ns, ts = zip(*sorted((int(k), float(v)) for k, v in costs["verify_seconds"].items()))
    if n <= ns[-1] or len(ns) == 1:
        return float(np.interp(n, ns, ts))
    return ts[-1] + (ts[-1] - ts[-2]) * (n - ns[-1]) / (ns[-1] - ns[-2])


def config_key(method: str, width, budget, retrieval: str | None = None) -> str:
    """How a sweep row names its tree shape (`costs["tree_seconds"]` is keyed by it; retrieval adds its merge)."""
    key = f"{method}:W={width}:B={budget}"
    return key if retrieval in (None, "none") else f"{key}:retrieval={retrieval}"


def sweep(models, continuations: list[Continuation], configs, base: DecodeSettings, costs: dict,
          progress=True, budget_policy=None) -> list[dict]:
    """Replay every configuration on every continuation; τ exact, speed predicted from `costs`.

    A config's tree-build time is the median measured here, unless `costs["tree_seconds"]` (committed
    figures, dartree.sweep.committed_costs) has its shape: the depth bonus changes which nodes the cut
    keeps, not what building and cutting cost."""
    from tqdm import tqdm

    target, drafter = models.target, models.drafter
    rows = []
    t_ar = interpolate_verify(costs, 1) + costs.get("ar_commit_seconds", 0.0)
    bar = tqdm(total=len(configs) * len(continuations), desc="replay", disable=not progress, unit="run")
    for cfg in configs:
        if cfg.method == "ar":
            bar.update(len(continuations))
            rows.append({"method": "ar", "width": None, "budget": None, "tau": 1.0, "predicted_speedup": 1.0,
                         "predicted_tokens_per_second": 1.0 / t_ar, "mean_nodes": 1.0, "tree_ms": 0.0})
            continue
        s = cfg.settings(base).resolved(target.device.type, budget_policy is not None)
        s, _ = continuity_term(s, target)  # the weight the replays run (0 on a target without a corpus)
        committed, seconds, nodes, tree_times = 0, 0.0, [], []
        for cont in continuations:
            if replayable(s):
                r = replay(target, drafter, cont, s, budget_policy=budget_policy)  # used only where s.auto_budget
            else:
                r = decoded_rounds(target, drafter, cont, s)
            committed += sum(r.committed)
            tree_times += r.tree_seconds
            nodes += r.nodes
            bar.update(1)
        measured = statistics.median(tree_times) if tree_times else 0.0
        budget = "auto" if cfg.auto else cfg.budget
        tree_s = costs.get("tree_seconds", {}).get(config_key(cfg.method, cfg.width, budget, s.retrieval), measured)
        seconds = sum(predicted_round_seconds(n, costs) + tree_s for n in nodes)
        rounds = len(nodes)
        tau = committed / rounds if rounds else 0.0
        tps = committed / seconds if seconds else 0.0
        rows.append({"method": cfg.method, "width": cfg.width, "budget": budget,
                     "depth_bonus": s.depth_bonus if METHODS[cfg.method].prunes else None,
                     "retrieval": s.retrieval, "continuity": s.continuity, "tau": tau,
                     "predicted_tokens_per_second": tps, "predicted_speedup": tps * t_ar,
                     "mean_nodes": sum(nodes) / rounds if rounds else 0.0, "tree_ms": 1e3 * tree_s,
                     "rounds": rounds})
    bar.close()
    return rows
