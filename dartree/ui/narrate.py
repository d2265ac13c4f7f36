"""The words on the page: one function per trace record type, plus the captions of the panels.

`narrate(rec, session)` is called after the session has folded `rec` into its views
(`dartree.ui.session.absorb`), so it reads numbers from those views and from the settings; it changes
nothing. Method names and stage names appear here only as prose.
"""

from __future__ import annotations

from functools import singledispatch

from ..methods import METHODS
from ..retrieval import RETRIEVED, SOURCE_BITS
from ..trace import CommitRecord, DepthRecord, DraftRecord, PrefillRecord, TreeRecord, VerifyRecord


@singledispatch
def narrate(rec, session) -> str:
    """One plain-language sentence about a step that just ran."""
    return f"{rec.stage} done."


@narrate.register
def _prefill(rec: PrefillRecord, session) -> str:
    return (f"Prefill: the target read the prompt ({rec.prompt_tokens} tokens) in one pass and chose the first "
            f"token “{session.texts(rec.first_token)}”. It becomes the root of round 0's tree.")


@narrate.register
def _draft(rec: DraftRecord, session) -> str:
    s = session.decoder.settings
    return (f"Round {rec.round}: one drafter pass after “{session.texts(rec.anchor)}” proposed its top {s.candidates} "
            f"candidates for each of the next {s.depth} positions ({rec.seconds:.2f} s). "
            "Nothing is a tree yet: the next steps grow one.")


@narrate.register
def _depth(rec: DepthRecord, session) -> str:
    s, dv = session.decoder.settings, session.round.depths[-1]
    how = METHODS[s.method].depth_caption.format(kept=dv["kept"], width=s.width)
    sentence = (f"Depth {rec.depth}: expanded {len(dv['frontier'])} frontier node(s) × {dv['candidates']} "
                f"candidates = {dv['examined']} children, re-scored them with the correction head and {how}.")
    if rec.settled:
        sentence += (f" It stops before depth {s.depth}: every frontier node already ranks below the B-th best node "
                     "for the cut, and a child never ranks above its parent, so nothing deeper could be kept.")
    if session.decoder.next_stage == "prune":
        sentence += f" The tree is complete with {len(session.round.alive) - 1} nodes: press Prune."
    return sentence


@narrate.register
def _tree(rec: TreeRecord, session) -> str:
    s = session.decoder.settings
    if rec.stage == "depth":  # ddtree builds its whole heap in one step
        return (f"DDTree's best-first heap picked the {int(rec.tokens.shape[0]) - 1} best nodes by the drafter's "
                f"marginal path score in one step (budget B = {s.budget}, no correction). Press Prune.")
    prune = session.round.prune
    total, budget = prune["total"], prune["budget"]  # B, or the auto budget's choice for this round
    if not prune["deferred"]:
        return f"{s.method} already built its tree within the budget: nothing to prune ({total} nodes)."
    how = (f"the auto budget chose B = {budget} (at most {s.budget}) by expected tokens per second; "
           if s.auto_budget else "")
    if total <= budget:
        return f"{how}The supertree has only {total} nodes (≤ B = {budget}), so pruning keeps them all."
    return (f"Deferred pruning: {how}it kept the {budget} best of the supertree's {total} nodes by "
            f"{_ranking(prune['bonus'])}, across all depths at once; the tree to verify has "
            f"{len(prune['kept']) - 1} nodes.")


@narrate.register
def _verify(rec: VerifyRecord, session) -> str:
    vv = session.round.verify
    return (f"Verify: the target read all {len(vv['tokens'])} tree nodes in one forward pass ({rec.seconds:.2f} s); "
            f"it agrees with {len(vv['path']) - 1} draft token(s) along one path and adds its own bonus token "
            f"“{vv['bonus_text']}”." + sampling_note(session.decoder.settings))


def sampling_note(settings) -> str:
    """Why sampling (T > 0) accepts fewer draft tokens than greedy decoding; empty at T = 0."""
    if settings.temperature <= 0:
        return ""
    return (f" At temperature {settings.temperature:g} the target does not take its most likely token: at every "
            "node it draws one from its own distribution, and the walk goes on only where a child carries the "
            "draw. A draft token that is the target's top choice is accepted only with the target's probability "
            "of it (always at T = 0), so fewer tokens are accepted per round, and a higher temperature flattens "
            "that probability further. The tree's scores estimate it: the drafter's log-probs processed at "
            f"temperature {settings.score_temperature:g}. The output still has exactly plain sampling's distribution.")


@narrate.register
def _commit(rec: CommitRecord, session) -> str:
    sentence = (f"Commit: {len(rec.new_tokens)} token(s) appended ({rec.accepted} from the draft + the bonus) "
                f"and the target's cache compacted to the accepted path ({rec.cache_length} tokens).")
    if rec.finished == "eos":
        sentence += " The model ended its answer."
    elif rec.finished == "length":
        sentence += " The maximum number of new tokens is reached."
    return sentence


# ---------------------------------------------------------------------------------------- captions
# the tree panels' markers (dartree.ui.figures.SOURCE_SYMBOLS) in words
SOURCE_LEGEND = "● drafted · ◆ context n-gram · ■ successor table · ✦ proposed by two sources"

def _ranking(bonus: float) -> str:
    return "path score" if bonus == 0 else f"path score {bonus:+.2f} × depth (the depth bonus)"


def supertree_caption(settings, alive: int, built: int, prune: dict | None = None) -> str:
    if settings.method == "ddtree":
        return f"DDTree heap: {alive} nodes by marginal path score (no correction, no per-depth cut)"
    caption = (f"{settings.method}, W = {settings.width}: {alive} nodes over {built} of {settings.depth} depths; "
               "faded = cut candidates (up to 3 per parent shown)")
    if settings.retrieval != "none":
        caption += ("; retrieved nodes join at Prune" if not prune or not prune.get("retrieved")
                    else f"; with {retrieved_caption(prune['retrieved'])}")
    return caption


def retrieved_caption(retrieved: dict) -> str:
    """How many supertree nodes each retrieval source proposed and how many the cut kept."""
    parts = [f"{src} proposed {c['proposed']} (kept {c['kept']})" for src, c in retrieved.items()]
    return "; ".join(parts) + f" — {SOURCE_LEGEND}"


def prune_caption(prune: dict, method: str) -> str:
    total, budget = prune["total"], prune["budget"]
    if not prune["deferred"]:
        return f"{method} grows within its budget: all {total} nodes kept, nothing pruned"
    if total <= budget:
        return f"the supertree has {total} ≤ B = {budget} nodes: all kept"
    caption = (f"kept the best {budget} of {total} supertree nodes; the lowest kept {_ranking(prune['bonus'])} is "
               f"{prune['lowest']:.2f}")
    return caption + (f"; {retrieved_caption(prune['retrieved'])}" if prune.get("retrieved") else "")


def rank_axis(bonus: float) -> str:
    return "path log-score" if bonus == 0 else f"path log-score {bonus:+.2f} × depth"


def correction_caption(depth: dict, first_corrected_depth: int) -> str:
    corr, d = depth["correction"], depth["depth"]
    if corr["active"]:
        return (f"depth {d}: {corr['shown']} of {len(depth['frontier'])} frontier node(s) × {depth['candidates']} "
                "candidates; off the diagonal = re-ranked by the head")
    if d < first_corrected_depth:
        return (f"depth {d} uses the marginals alone (correction starts at depth {first_corrected_depth}): "
                "all on the diagonal")
    return f"depth {d}: the correction head changed no ranking here"


NO_CORRECTION = ("DDTree ranks by the drafter's marginals alone: there is no correction head in this method, "
                 "so nothing to compare")


def verify_caption(verify: dict) -> str:
    accepted = [verify["texts"][i] for i in verify["path"][1:]]
    words = " ".join(f"“{t}”" for t in accepted)
    caption = (f"accepted {len(accepted)} draft token(s){' ' + words if words else ''} + bonus “{verify['bonus_text']}” "
               f"→ {len(accepted) + 1} token(s) this round from one target pass over {len(verify['tokens'])} nodes")
    if verify.get("bits") is None:
        return caption
    counts = []
    for src in RETRIEVED:
        bit = SOURCE_BITS[src]
        mine = [i for i, b in enumerate(verify["bits"]) if i and b & bit]
        counts.append(f"{src}: {sum(i in verify['path'] for i in mine)} of {len(mine)} accepted")
    return caption + " · retrieved nodes verified, " + ", ".join(counts) + f" — {SOURCE_LEGEND}"


def speed_caption(speed: dict) -> str:
    """The speed figure's subtitle (lines separated by newlines)."""
    m, ref = speed["measured"], speed["reference"]
    if m is None:
        return (f"per round, t_AR = {1e3 * speed['t_ar']:.1f} ms measured here\none round is not a speed-up"
                if speed["t_ar"] else "t_AR not measured yet")
    caption = f"{m['runs']} whole runs each, in turn (as bench)"
    if m["ratio"] is not None:
        caption += f": ratio {m['ratio']:.2f}×"
    if ref:
        caption += f"\nbench reference: {ref['speedup']:.2f}× over {ref['n_prompts']} prompts"
    return caption


def speed_markdown(speed: dict | None, drafter_description: str) -> str:
    if not speed:
        return "Speed appears after the first committed round."
    lines, m, ref, method = [], speed["measured"], speed["reference"], speed["method"]
    if speed["rounds"]:
        r = speed["rounds"][-1]
        lines.append(f"**Round {r['round']}, this round only:** τ = {r['tokens']} token(s) in "
                     f"{1e3 * r['seconds']:.0f} ms = **{r['steps']:.1f} plain steps** (t_AR = {1e3 * speed['t_ar']:.1f} ms, one plain decoding "
                     "step on this prompt, measured in this process). One round is not a speed-up: τ swings from "
                     "round to round, and a round stepped by hand runs colder than inside a whole run.")
    if m is None:
        lines.append(f"**Speed ratio:** shown when the run is complete (Run to end, or step to the end, or *Time whole "
                     f"runs*): plain decoding and {method} are then timed as whole runs of this prompt, in turn, as "
                     f"`bench` does, given at least {speed['min_tokens']} decoded tokens (fewer are a few rounds' "
                     "luck).")
    else:
        line = (f"**Whole runs** of this prompt ({m['tokens']} tokens; {m['runs']} runs each of plain decoding and "
                f"{method}, in turn, warm, as `bench` times them): {method} {m['tps']:.1f} tokens/s (τ = "
                f"{m['tau']:.2f}) · plain decoding {m['ar_tps']:.1f} tokens/s")
        if m["ratio"] is not None:
            line += f" · **speed ratio {m['ratio']:.2f}×**"
        elif method != "ar":
            line += f" · no ratio: {m['tokens'] - 1} decoded tokens are fewer than {speed['min_tokens']}"
        lines.append(line)
    if ref:
        lines.append(f"**This machine's reference** (`bench`, {ref['n_prompts']} dev prompts × "
                     f"{ref['max_new_tokens']} tokens, {ref['date']}, `{ref['file']}`): {method} with this shape runs at "
                     f"**{ref['speedup']:.2f}×** plain decoding, τ = {ref['tau']:.2f}"
                     + ("." if ref.get("same_drafter", True) else ", measured with another drafter than this one."))
    elif method != "ar":
        lines.append("*No bench result for this shape on this kind of machine in `assets/benchmarks/`.*")
    if m and m["ratio"] is not None and m["ratio"] < 1 and method != "ar":
        versus = f", against {ref['tau']:.2f} over the reference's prompts" if ref else ""
        lines.append(f"*A single short prompt can legitimately be slower than plain decoding: τ depends on the prompt "
                     f"(here {m['tau']:.2f}{versus}), and each round costs a draft and a wider verify.*")
    if drafter_description.startswith("UNTRAINED"):
        lines.append("*Measured with an UNTRAINED drafter: almost nothing is accepted, so the tree only costs time "
                     "here. The mechanics are real; the speed-up needs a trained drafter.*")
    return "\n\n".join(lines)


TEXT_NOTE = "Each colour is one round; hover for its round. A dashed box marks tokens accepted but not yet committed."
