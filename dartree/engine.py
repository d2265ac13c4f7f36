"""The decoder as explicit steps: prefill, then rounds of draft -> depth... -> prune -> verify -> commit.

Each step returns a trace record (dartree.trace), so the explorer can stop after any of them and draw
what it produced, while `generate` simply loops over the same steps. Every method shares the target
pass, the walk and the cache handling; they differ only in how the tree is built:

- ``ar``: plain decoding, the tree is the root alone (one target forward per token);
- ``chain``: one path, the best corrected child at each depth (a DFlash chain when the drafter has no
  correction head, a Domino chain when it has one);
- ``ddtree``: DDTree's best-first heap over the uncorrected marginals, B nodes;
- ``dartree-fixed``: depth-batched corrected expansion with a per-depth quota summing to B;
- ``dartree``: the W-wide corrected supertree, then deferred pruning to the best B nodes.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import torch

from . import METHODS, TREE_METHODS
from .cache import compact_cache, new_cache
from .continuity import continuity_term, round_continuity
from .defaults import (AUTO_BUDGET_CAP, RETRIEVAL_DEFAULT, RETRIEVAL_PRIOR_WEIGHT, RETRIEVAL_PRIORS,
                       SCORE_TEMPERATURE_SCALE, default_shape, score_temperature)
from .draft import DrafterContext, PathCorrector, draft_block
from .errors import UserError
from .methods import METHODS as REGISTRY
from .sampling import next_tokens
from .trace import (STAGE_KEYS, CommitRecord, DepthRecord, DraftRecord, PrefillRecord, RoundRecord,
                    TreeRecord, VerifyRecord)
from .retrieval import RETRIEVAL_MODES, Retriever, source_counts
from .tree import Tree, prune_top_b, tree_threads
from .verify import verify_tree, walk_tree

MAX_WIDTH = 64
MAX_BUDGET = 1024
MAX_CANDIDATES = 512
MAX_NEW_TOKENS = 8192
MAX_TEMPERATURE = 2.0
MAX_SCORE_TEMPERATURE = SCORE_TEMPERATURE_SCALE * MAX_TEMPERATURE  # the default scores' at the hottest T
MIN_DEPTH_BONUS = -1.0
MAX_CONTINUITY = 2.0  # the n-gram term's weight: DART's default is 0.5


@dataclass(frozen=True)
class DecodeSettings:
    """Everything that shapes one generation; `validated` checks ranges against the models.

    The tree shape (width, budget, candidates, depth_bonus, auto_budget) left at None takes the measured
    default of the device the target is on (dartree.defaults.default_shape), resolved by `validated`; an
    explicit value wins. A GenerationResult's `settings` shows the resolved values.
    """

    method: str = "dartree"
    width: int | None = None
    budget: int | None = None  # None: the device's B (an automatic budget's default: AUTO_BUDGET_CAP)
    depth: int | None = None  # None: the drafter's block size - 1
    candidates: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    # dartree: choose each round's budget (at most `budget`), see dartree.budget; None: the device's
    # default where a calibrated policy is given (`policy_given` of `resolved`), else off
    auto_budget: bool | None = None
    # dartree's top-B cut ranks nodes by path score + depth_bonus * depth (<= 0; dartree.tree.cut_scores)
    depth_bonus: float | None = None
    # retrieved branches (dartree.retrieval) for the methods that take them (dartree.methods: `retrieval`):
    # none, ngram, table or both; None: dartree.defaults.RETRIEVAL_DEFAULT. Other methods resolve it to none.
    retrieval: str | None = None
    # the temperature the tree's scores are processed at (dartree.tree.child_log_probs): 0 leaves them as
    # drafted (greedy); None: dartree.defaults.score_temperature of the decoding temperature
    score_temperature: float | None = None
    # weight of DART's n-gram term in the tree scores (dartree.continuity; methods with `continuity`, else 0);
    # 0: off; None: the device's default (0 on a target without committed answers to count)
    continuity: float | None = None

    def resolved(self, device_type: str = "cpu", policy_given: bool = False) -> "DecodeSettings":
        """Unset tree-shape fields filled with the device's measured defaults (dartree.defaults)."""
        if self.method not in METHODS:
            raise UserError(f"unknown method {self.method!r}: choose one of {', '.join(METHODS)}")
        shape = default_shape(device_type, self.temperature)
        auto = self.auto_budget
        if auto is None:
            auto = bool(shape.get("auto_budget")) and policy_given and REGISTRY[self.method].auto_budget
        budget = self.budget if self.budget is not None else (AUTO_BUDGET_CAP if auto else shape["budget"])
        unset = {k: shape[k] for k in ("width", "candidates", "depth_bonus") if getattr(self, k) is None}
        retrieval = RETRIEVAL_DEFAULT if self.retrieval is None else self.retrieval
        if retrieval not in RETRIEVAL_MODES:
            raise UserError(f"unknown retrieval {retrieval!r}: choose one of {', '.join(RETRIEVAL_MODES)}")
        retrieval = retrieval if REGISTRY[self.method].retrieval else "none"
        continuity = shape["continuity"] if self.continuity is None else self.continuity
        continuity = continuity if REGISTRY[self.method].continuity else 0.0
        scoring = score_temperature(self.temperature) if self.score_temperature is None else self.score_temperature
        return replace(self, budget=budget, auto_budget=auto, retrieval=retrieval, continuity=continuity,
                       score_temperature=scoring, **unset)

    def validated(self, max_depth: int | None, vocab_size: int, device_type: str = "cpu",
                  policy_given: bool = False) -> "DecodeSettings":
        """`resolved` for the device, then checked against the models (max_depth None: no drafter)."""
        s = self.resolved(device_type, policy_given)
        if s.method in TREE_METHODS and max_depth is None:
            raise UserError(f"method {s.method!r} needs a drafter; only 'ar' runs without one")
        checks = [
            (1 <= s.width <= MAX_WIDTH, f"width W must be between 1 and {MAX_WIDTH}, got {s.width}"),
            (1 <= s.budget <= MAX_BUDGET, f"budget B must be between 1 and {MAX_BUDGET}, got {s.budget}"),
            (s.method == "ar" or 1 <= s.candidates <= min(MAX_CANDIDATES, vocab_size),
             f"candidates C must be between 1 and {min(MAX_CANDIDATES, vocab_size)}, got {s.candidates}"),
            (0.0 <= s.temperature <= MAX_TEMPERATURE,
             f"temperature must be between 0 and {MAX_TEMPERATURE}, got {s.temperature}"),
            (0.0 < s.top_p <= 1.0, f"top-p must be in (0, 1], got {s.top_p}"),
            (0.0 <= s.score_temperature <= MAX_SCORE_TEMPERATURE,
             f"score temperature must be between 0 and {MAX_SCORE_TEMPERATURE}, got {s.score_temperature}"),
            (MIN_DEPTH_BONUS <= s.depth_bonus <= 0.0,
             f"depth bonus must be between {MIN_DEPTH_BONUS} and 0, got {s.depth_bonus}"),
            (0.0 <= s.continuity <= MAX_CONTINUITY,
             f"the n-gram continuity weight must be between 0 and {MAX_CONTINUITY}, got {s.continuity}"),
            (not s.auto_budget or REGISTRY[s.method].auto_budget,
             f"an automatic budget applies to {', '.join(n for n, m in REGISTRY.items() if m.auto_budget)} "
             f"only, not {s.method!r}"),
            (1 <= s.max_new_tokens <= MAX_NEW_TOKENS,
             f"max new tokens must be between 1 and {MAX_NEW_TOKENS}, got {s.max_new_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        depth = s.depth
        if max_depth is not None:
            depth = max_depth if depth is None else depth
            if not 1 <= depth <= max_depth:
                raise UserError(f"depth D must be between 1 and the drafter's {max_depth}, got {depth}")
        return replace(s, depth=depth)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    rounds: int
    tau: float
    prefill_seconds: float
    decode_seconds: float
    stage_seconds: dict
    finished: str | None
    settings: dict
    round_records: list[RoundRecord] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens committed by rounds per second of rounds (prefill excluded)."""
        decoded = max(len(self.token_ids) - 1, 0)
        return decoded / self.decode_seconds if self.decode_seconds > 0 else 0.0


def make_builder(settings: DecodeSettings, block, corrector, continuity=None):
    """The method's tree builder for this round's block (the protocol of dartree.tree); `continuity`: the
    round's (ContinuityTerm, root tails) from `round_continuity`, or None."""
    return REGISTRY[settings.method].make_builder(settings, block.draft, corrector, continuity)


def sibling_count(settings: DecodeSettings) -> int:
    """Tokens per depth the drafter must rank beyond the C candidates: DDTree's heap takes up to B siblings
    per depth from the whole vocabulary (dartree.tree.ddtree_heap); 0 where the C candidates suffice."""
    wide = REGISTRY[settings.method].whole_vocab_siblings
    return settings.budget if wide and settings.budget > settings.candidates else 0


def round_budget(settings: DecodeSettings, supertree: Tree, budget_policy=None) -> int:
    """B, or in auto mode the policy's choice for this supertree (capped by B; one host sync)."""
    if budget_policy is None or not settings.auto_budget:
        return settings.budget
    return min(settings.budget, max(1, budget_policy.choose(supertree.scores[1:])))


def finish_tree(settings: DecodeSettings, builder, budget_policy=None, retriever: Retriever | None = None):
    """The round's cut: (supertree, tree, kept indices or None, budget).

    Without retrieval, the builder's own `finish`. With it, the retrieved chains join the grown supertree
    first (dartree.retrieval.merge) and the one top-B cut (`prune_top_b`, ranked by `cut_scores` with the
    settings' depth bonus) picks the B nodes to verify from drafted and retrieved nodes alike; for
    dartree-fixed, whose quota already spent B, this cut decides which nodes retrieval displaces.
    """
    if retriever is None:
        budget = round_budget(settings, builder.tree(), budget_policy)
        supertree, tree, kept = builder.finish(budget)
        return supertree, tree, kept, budget
    auto = budget_policy is not None and settings.auto_budget
    supertree = retriever.round_tree(builder.tree(), None if auto else settings.budget)
    budget = round_budget(settings, supertree, budget_policy)
    tree, kept = prune_top_b(supertree, budget, settings.depth_bonus)
    return supertree, tree, kept, budget


def make_retriever(settings: DecodeSettings, target, depth: int) -> Retriever | None:
    """One generation's retrieval state, or None where the settings' retrieval is none (resolved settings)."""
    if settings.retrieval in (None, "none"):
        return None
    return Retriever(settings.retrieval, target.vocab_size, depth, target.max_context, RETRIEVAL_PRIORS,
                     RETRIEVAL_PRIOR_WEIGHT, target.device)


def build_round_tree(settings: DecodeSettings, block, corrector, budget_policy=None,
                     retriever: Retriever | None = None, continuity=None) -> tuple[Tree, Tree, torch.Tensor | None]:
    """A whole round's tree at once, as the Decoder's depth and prune steps build it: (supertree, tree,
    kept indices or None).

    Used where nobody watches the depths (the replay sweep); the Decoder runs the same builders step
    by step so that the explorer can draw each depth. `retriever`: the replay's own (dartree.replay),
    None for a tree without retrieval; `continuity`: the round's n-gram term (`round_continuity`) or None.
    """
    device = block.draft.cand_tokens.device
    settings = settings.resolved(device.type, budget_policy is not None)  # a no-op on validated settings
    builder = make_builder(settings, block, corrector, continuity)
    with tree_threads(device):
        builder.run()
    supertree, tree, kept, _ = finish_tree(settings, builder, budget_policy, retriever)
    return supertree, tree, kept


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # stage boundaries only: timings must cover the GPU work


@dataclass
class Stopwatch:
    seconds: float = 0.0


@contextmanager
def timed(device: torch.device, totals: dict | None, stage: str | None, sync: bool = True):
    """Time the block into a Stopwatch and add its seconds to `totals[stage]` (a STAGE_KEYS name).

    `sync` waits for the device at both ends, so the time covers the GPU work. The depth steps pass
    sync=False and read the host clock only: a device sync per depth would stall the pipeline D times a
    round; the tree stage's total is settled by the synced prune step.
    """
    if sync:
        _sync(device)
    watch = Stopwatch()
    t0 = time.perf_counter()
    yield watch
    if sync:
        _sync(device)
    watch.seconds = time.perf_counter() - t0
    if stage is not None:
        totals[stage] += watch.seconds


class Decoder:
    """One generation for one prompt, advanced step by step.

    `next_stage` names what `step()` will do next: "prefill", "draft", "depth", "prune", "verify",
    "commit" or "done". The decoder owns the target KV cache (prefix rows only, between rounds), the
    drafter's context cache and the committed tokens; nothing in it is shared between decoders, so
    each browser session or benchmark run has its own.
    """

    def __init__(self, target, drafter, prompt_ids: list[int], settings: DecodeSettings, budget_policy=None):
        self.target = target
        self.drafter = drafter if settings.method in TREE_METHODS else None
        max_depth = drafter.max_depth if drafter is not None else None
        self.settings = settings.validated(max_depth, target.vocab_size, target.device.type, budget_policy is not None)
        self.settings, self.continuity = continuity_term(self.settings, target)
        if self.settings.auto_budget and budget_policy is None:
            raise UserError("an automatic budget needs a calibrated policy (dartree.budget.policy_for)")
        self.budget_policy = budget_policy if self.settings.auto_budget else None
        if not prompt_ids:
            raise UserError("the prompt is empty: type something for the model to answer")
        reserve = self.settings.max_new_tokens + (drafter.max_depth + 1 if drafter is not None else 1)
        if len(prompt_ids) + reserve > target.max_context:
            raise UserError(f"the prompt has {len(prompt_ids)} tokens; with {self.settings.max_new_tokens} new tokens "
                            f"it exceeds the target's context of {target.max_context} tokens")
        self.device = target.device
        self.prompt_ids = list(prompt_ids)
        self.feature_layers = tuple(self.drafter.cfg.target_layer_ids) if self.drafter is not None else ()
        self.generator = torch.Generator(device=self.device).manual_seed(int(self.settings.seed))
        # room for the prompt, the output and one round's tree: decoding never grows or copies the caches
        self.prefix_room = len(prompt_ids) + self.settings.max_new_tokens
        self.cache = new_cache(target, self.prefix_room + self.settings.budget + 2)
        self.context: DrafterContext | None = None  # the drafter's, from the prefill on
        self.output: list[int] = []
        self.prefix_len = 0
        self.anchor: torch.Tensor | None = None
        self.finished: str | None = None
        self.round = 0
        self.rounds: list[RoundRecord] = []
        self.prefill_seconds = 0.0
        self.next_stage = "prefill"
        self.retriever = make_retriever(self.settings, target, self.settings.depth) if self.drafter is not None else None
        self._reset_round()

    # ------------------------------------------------------------------ helpers
    def _reset_round(self):
        self.block = None
        self.builder = None
        self.supertree: Tree | None = None
        self.tree: Tree | None = None
        self.kept: torch.Tensor | None = None
        self.verification = None
        self.walk = None
        self.round_seconds = {k: 0.0 for k in STAGE_KEYS}

    @property
    def eos(self) -> tuple[int, ...]:
        return self.target.eos_token_ids

    def _append(self, tokens: list[int]) -> list[int]:
        """Commit tokens, stopping exactly at EOS or at max_new_tokens; returns what was committed."""
        room = self.settings.max_new_tokens - len(self.output)
        taken = []
        for tok in tokens[:room]:
            taken.append(tok)
            if tok in self.eos:
                self.finished = "eos"
                break
        self.output.extend(taken)
        if self.finished is None and len(self.output) >= self.settings.max_new_tokens:
            self.finished = "length"
        return taken

    def _timed(self, stage: str | None, sync: bool = True):
        """`with self._timed("verify") as t:` adds the block's seconds to this round's stage total."""
        assert stage is None or stage in STAGE_KEYS, stage
        return timed(self.device, self.round_seconds, stage, sync)

    # ------------------------------------------------------------------ steps
    def step(self):
        """Run the next stage and return its record."""
        stage = self.next_stage
        if stage == "done":
            raise UserError("this generation has finished: reset or start a new prompt")
        return getattr(self, stage if stage != "depth" else "expand")()

    @torch.inference_mode()
    def prefill(self) -> PrefillRecord:
        with self._timed(None) as t:
            out = self.target.prefill(self.prompt_ids, self.cache, self.feature_layers)
            first = next_tokens(out.logits, self.settings.temperature, self.settings.top_p, self.generator)
            if self.drafter is not None:
                self.context = DrafterContext.from_prefill(self.drafter, out.features,
                                                           capacity=self.prefix_room)
            self.prefix_len = len(self.prompt_ids)
            self.anchor = first[0]
            self._append([int(first[0])])
            if self.retriever is not None:
                self.retriever.start(self.prompt_ids, first[:1], out.logits[-1])
        self.prefill_seconds = t.seconds
        self.next_stage = "done" if self.finished else ("verify" if self.drafter is None else "draft")
        if self.drafter is None and not self.finished:
            self.tree = Tree.root_only(self.anchor)
        return PrefillRecord(len(self.prompt_ids), int(first[0]), self.prefill_seconds)

    @torch.inference_mode()
    def draft(self) -> DraftRecord:
        s = self.settings
        with self._timed("draft") as t:
            self.block = draft_block(self.drafter, self.target, self.context, self.anchor, self.prefix_len,
                                     s.depth, s.candidates, sibling_count(s))
            self.builder = make_builder(s, self.block, PathCorrector(self.drafter, self.target, self.block),
                                        round_continuity(self.continuity, self.device, self.prompt_ids, self.output))
        self.next_stage = "depth"
        d = self.block.draft
        return DraftRecord(self.round, int(self.anchor), self.prefix_len, d.cand_tokens, d.cand_marginal_lp,
                           t.seconds)

    @torch.inference_mode()
    def expand(self):
        """One depth of the tree (ddtree's builder grows its whole heap in this one step).

        Timed on the host clock without a device sync (see `timed`).
        """
        with self._timed("tree", sync=False) as t:
            with tree_threads(self.device):
                grown = self.builder.step()
            if self.builder.done:
                self.supertree = self.builder.tree()
                self.next_stage = "prune"
        if isinstance(grown, Tree):  # a builder of one step hands over its whole tree, drawn as one
            return TreeRecord(self.round, grown.tokens, grown.parents, grown.depths, grown.scores, None,
                              self.settings.budget, t.seconds, stage="depth")
        return DepthRecord(self.round, grown.depth, grown.frontier, grown.parent, grown.token, grown.marginal_lp,
                           grown.corrected_lp, grown.score, grown.rank, grown.survived, grown.node_index, t.seconds,
                           settled=self.builder.settled, continuity_lp=grown.continuity_lp)

    @torch.inference_mode()
    def prune(self) -> TreeRecord:
        """The builder's finish: dartree's deferred top-B cut; the other builders already respect B. With
        retrieval, its chains join the supertree first and one top-B cut picks from both (`finish_tree`)."""
        with self._timed("tree") as t:
            with tree_threads(self.device):
                self.supertree, self.tree, kept, budget = finish_tree(self.settings, self.builder, self.budget_policy,
                                                                      self.retriever)
        self.kept = kept
        self.next_stage = "verify"
        tree = self.tree
        return TreeRecord(self.round, tree.tokens, tree.parents, tree.depths, tree.scores, kept, budget, t.seconds,
                          sources=tree.sources, supertree=self.supertree if self.retriever is not None else None)

    @torch.inference_mode()
    def verify(self) -> VerifyRecord:
        tree = self.tree
        with self._timed("verify") as t:
            self.verification = verify_tree(self.target, tree, self.cache, self.prefix_len, self.feature_layers)
            self.walk = walk_tree(tree, self.verification, self.settings.temperature, self.settings.top_p,
                                  self.generator)
            bonus = int(self.walk.bonus)  # the one host sync of a round: the path's length decides the commit
        self.next_stage = "commit"
        w = self.walk
        return VerifyRecord(self.round, self.prefix_len, tree.tokens, tree.parents, tree.depths,
                            self.verification.visible, w.target_tokens, w.accepted, w.path, bonus, t.seconds,
                            sources=tree.sources)

    @torch.inference_mode()
    def commit(self) -> CommitRecord:
        path, tree = self.walk.path, self.tree
        with self._timed("commit") as t:
            path_tokens = torch.cat([tree.tokens[path[1:]], self.walk.bonus.reshape(1)])  # accepted + bonus
            proposed = path_tokens.tolist()
            committed = self._append(proposed)
            accepted = min(len(committed), len(proposed) - 1)
            counts = source_counts(self.supertree, tree, self.walk.accepted, len(path) - 1) \
                if self.supertree is not None else {}
            if self.retriever is not None:
                self.retriever.observe(self.kept, tree, self.walk.accepted, self.verification.logits)
                self.retriever.extend(path_tokens[:len(committed)])
            if self.finished is None:
                if self.context is not None:
                    feats = self.verification.features[path]
                    self.context.append(feats, tree.depths[path] + self.prefix_len)
                self.prefix_len = compact_cache(self.cache, self.prefix_len, path)
                self.anchor = self.walk.bonus
        record = CommitRecord(self.round, committed, accepted, self.prefix_len, self.finished, t.seconds)
        self.rounds.append(RoundRecord(self.round, tree.num_nodes, len(committed), dict(self.round_seconds), counts))
        self.round += 1
        self._reset_round()
        if self.finished:
            self.next_stage = "done"
        elif self.drafter is None:
            self.tree = Tree.root_only(self.anchor)
            self.next_stage = "verify"
        else:
            self.next_stage = "draft"
        return record

    def run_round(self) -> list:
        """Finish the current round (from whatever stage it is at) and return its records."""
        records = []
        if self.next_stage == "prefill":
            records.append(self.prefill())
        while self.next_stage not in ("done",):
            records.append(self.step())
            if records[-1].stage == "commit":
                break
        return records

    def run(self) -> GenerationResult:
        """Run to the end; returns the result with per-stage timings."""
        if self.next_stage == "prefill":
            self.prefill()
        while self.next_stage != "done":
            self.step()
        return self.result()

    def result(self) -> GenerationResult:
        stage_seconds = {k: sum(r.seconds.get(k, 0.0) for r in self.rounds) for k in STAGE_KEYS}
        decode = sum(stage_seconds.values())
        committed_by_rounds = sum(r.committed for r in self.rounds)
        tau = committed_by_rounds / len(self.rounds) if self.rounds else 0.0
        return GenerationResult(
            prompt_ids=self.prompt_ids, token_ids=list(self.output), text=self.target.decode(self.output)
            if self.target.tokenizer is not None else "", rounds=len(self.rounds), tau=tau,
            prefill_seconds=self.prefill_seconds, decode_seconds=decode, stage_seconds=stage_seconds,
            finished=self.finished, settings=asdict(self.settings), round_records=list(self.rounds))


def generate(target, drafter, prompt_ids: list[int], settings: DecodeSettings | None = None,
             budget_policy=None) -> GenerationResult:
    """Decode one prompt to the end (`settings` None: DecodeSettings(), the device's defaults;
    `budget_policy` for settings.auto_budget)."""
    settings = DecodeSettings() if settings is None else settings
    return Decoder(target, drafter, prompt_ids, settings, budget_policy).run()
