"""The decoding methods, one entry each: what builds its tree, which knobs apply, how it is captioned.

Everything that lists or labels methods (the engine, bench and sweep tables, the CLI's --method help,
the UI's radio and race) reads this table. Adding a method is one entry here plus its tree builder in
dartree.tree (a builder follows the protocol there: `step()`, `done`, `finish(budget)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .tree import DepthwiseBuilder, HeapBuilder, fixed_quota_schedule, width_schedule


@dataclass(frozen=True)
class Method:
    name: str
    label: str  # short caption (tables, radio buttons)
    description: str  # one line (CLI help, UI captions)
    # (settings, draft, corrector, cut_bonus, continuity) -> builder; None: plain decoding, no tree
    builder: Callable | None = None
    prunes: bool = False  # deferred top-B cut of a wider supertree (its builder's `finish` does it)
    knobs: tuple[str, ...] = ()  # which of "W", "B" shape its tree
    auto_budget: bool = False  # whether the cost-aware per-round budget applies
    in_race: bool = True  # shown in the UI's Race tab
    whole_vocab_siblings: bool = False  # ranks up to B siblings per depth over the whole vocabulary, not C
    depth_caption: str = ""  # what one depth step kept, with {kept} and {width} filled in (the UI's narration)
    retrieval: bool = False  # takes retrieved branches (dartree.retrieval) into its tree before a top-B cut
    continuity: bool = False  # scores with DART's n-gram continuity term (dartree.continuity) where it is on

    def make_builder(self, settings, draft, corrector, continuity=None):
        """This method's builder for one round's draft (dartree's cut ranks with settings.depth_bonus).
        `continuity`: the round's (ContinuityTerm, root tails [1, n - 1]) or None; only the methods that
        take it score with it."""
        return self.builder(settings, draft, corrector, settings.depth_bonus if self.prunes else None,
                            continuity if self.continuity else None)


def _depthwise(schedule):
    """A DepthwiseBuilder keeping `schedule(settings)` per depth. A pruning method's builder knows a fixed B
    (`cut_budget`), so it stops growing once no deeper node could make its cut; an automatic budget is chosen
    from the whole supertree's scores, so that one grows every depth."""
    def make(s, draft, corrector, cut_bonus, continuity):
        cut_budget = None if s.auto_budget else s.budget  # used only with a cut (cut_bonus)
        term, tails = continuity or (None, None)
        return DepthwiseBuilder(draft, corrector, schedule(s), s.depth, cut_bonus, s.score_temperature, s.top_p,
                                cut_budget, term, tails)
    return make


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "plain", "plain decoding: one target forward per token (the reference)"),
    Method("chain", "chain", "one path, the best corrected child at each depth (DFlash / Domino chain)",
           _depthwise(lambda s: width_schedule(1)), depth_caption="kept the single best child (a chain)"),
    Method("ddtree", "DDTree", "DDTree's best-first heap over the uncorrected marginals, B nodes",
           lambda s, draft, corrector, cut_bonus, continuity: HeapBuilder(draft, s.budget, s.depth,
                                                                          s.score_temperature, s.top_p),
           knobs=("B",),
           whole_vocab_siblings=True),
    Method("dartree-fixed", "DARTree fixed", "corrected depth-batched expansion, a per-depth quota summing to B",
           _depthwise(lambda s: fixed_quota_schedule(s.budget, s.depth)), knobs=("B",), in_race=False,
           depth_caption="kept its quota of the {kept} best", retrieval=True, continuity=True),
    Method("dartree", "DARTree", "the W-wide corrected supertree, then deferred pruning to the best B nodes",
           _depthwise(lambda s: width_schedule(s.width)), prunes=True, knobs=("W", "B"), auto_budget=True,
           depth_caption="kept the global top {kept} (W = {width})", retrieval=True, continuity=True),
)}


def method_help() -> str:
    """One line per method, for --help texts."""
    return "; ".join(f"{m.name}: {m.description}" for m in METHODS.values())
