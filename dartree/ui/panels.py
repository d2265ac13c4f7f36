"""The explorer's outputs by name: how each panel is drawn from a session's plain views (through
`dartree.ui.figures`), and which panels a step of each record type changes.

A panel is a function `name(session) -> value` registered with `@panel`; `PANELS` lists them in
definition order, and the layout gives each one a component of the same name.
"""

from __future__ import annotations

from dataclasses import asdict

from . import figures, narrate
from .adapter import text_segments
from .reference import bench_reference

MIN_RATIO_TOKENS = 16  # the fewest decoded tokens a speed ratio is shown for (see `session.Session.whole_runs`)

PANELS: dict = {}  # name -> function(session) -> the component's value


def panel(fn):
    PANELS[fn.__name__] = fn
    return fn


def _first_corrected_depth(decoder) -> int:
    return getattr(decoder.drafter.cfg, "pure_draft_prefix_len", 0) + 1


@panel
def draft_fig(session):
    return figures.draft_figure(session.round.draft)


@panel
def supertree_fig(session):
    return figures.supertree_figure(_supertree(session))


@panel
def correction_fig(session):
    r, dec = session.round, session.decoder
    if r.tree is not None:
        depth = {"correction": None, "caption": narrate.NO_CORRECTION}
    elif r.depths:
        dv = r.depths[-1]
        caption = narrate.correction_caption(dv, _first_corrected_depth(dec))
        depth = dict(dv, correction=dict(dv["correction"], caption=caption))
    else:
        depth = None
    return figures.correction_figure(depth, dec.settings.candidates)


@panel
def prune_fig(session):
    return figures.prune_figure(_supertree(session), _prune(session))


@panel
def rank_fig(session):
    return figures.rank_figure(_prune(session))


@panel
def mask_fig(session):
    return figures.mask_figure(session.round.verify or session.round.pruned)


@panel
def verify_fig(session):
    vv = session.round.verify
    return figures.verify_figure(vv and dict(vv, caption=narrate.verify_caption(vv)), session.decoder.settings.depth)


@panel
def text(session):
    dec = session.decoder
    segments = (text_segments(dec.target, dec.output, session.marks, session.round.pending, dec.round)
                if dec.output else [])
    return figures.text_html(segments, narrate.TEXT_NOTE)


@panel
def speed_fig(session):
    return figures.speed_figure(_speed(session))


@panel
def timeline_fig(session):
    return figures.timeline_figure([r.to_dict() for r in session.decoder.rounds])


@panel
def speed_md(session):
    return narrate.speed_markdown(_speed(session), session.models.drafter_description)


OUTPUTS = ("status", "summary") + tuple(PANELS)
RETRIEVED_JOIN = frozenset({"supertree_fig"})  # a prune with retrieval also redraws the supertree: its chains join there
ROUND_PANELS = frozenset(("draft_fig", "supertree_fig", "correction_fig", "prune_fig", "rank_fig", "mask_fig",
                          "verify_fig"))
SPEED = frozenset(("speed_fig", "speed_md"))
CHANGES = {  # the panels a step redraws, by its record's stage (ddtree's whole-heap TreeRecord is a "depth")
    "prefill": frozenset({"text"}),
    "draft": ROUND_PANELS,
    "depth": frozenset({"supertree_fig", "correction_fig"}),
    "prune": frozenset({"prune_fig", "rank_fig", "mask_fig"}),
    "verify": frozenset({"verify_fig", "mask_fig", "text"}),
    "commit": frozenset({"text", "timeline_fig"}) | SPEED,
}


def _supertree(session) -> dict | None:
    r, s = session.round, session.decoder.settings
    if not r.nodes:
        return None
    built = len(r.depths) if r.tree is None else s.depth
    return {"nodes": r.nodes, "max_depth": s.depth,
            "caption": narrate.supertree_caption(s, len(r.alive) - 1, built, r.prune)}


def _prune(session) -> dict | None:
    prune = session.round.prune
    return prune and dict(prune, caption=narrate.prune_caption(prune, session.decoder.settings.method),
                          axis=narrate.rank_axis(prune["bonus"]))


def _weights(decoder) -> str | None:
    """The CPU weight path the target runs (the reference must be measured on the same); None off CPU."""
    if decoder.device.type != "cpu":
        return None
    return getattr(decoder.target, "weights", "fp32")


def _speed(session) -> dict | None:
    """The speed panel's numbers: per round (τ and its time in plain steps), the whole-run timing once made,
    and the machine's bench reference for the shape."""
    dec = session.decoder
    if dec is None or not dec.rounds:
        return None
    t_ar = session.step_seconds.get(session.controls.prompt)
    rounds = [{"round": r.round, "tokens": r.committed, "seconds": sum(r.seconds.values()),
               "steps": sum(r.seconds.values()) / t_ar} for r in dec.rounds] if t_ar else []
    speed = {"method": dec.settings.method, "t_ar": t_ar, "rounds": rounds, "measured": session.measured(),
             "reference": bench_reference(dec.settings, dec.device.type, weights=_weights(dec),
                                          drafter=session.models.drafter_description),
             "min_tokens": MIN_RATIO_TOKENS}
    return dict(speed, caption=narrate.speed_caption(speed))


def summary(session) -> dict:
    """A JSON-ready digest of the session (the API endpoints return it; the tests read it)."""
    dec, r = session.decoder, session.round
    if dec is None:
        return {"next_stage": None}
    res = dec.result()
    return {"round": dec.round, "next_stage": dec.next_stage, "last_stage": session.last_stage,
            "settings": asdict(dec.settings), "drafter": session.models.drafter_description,
            "depths_built": len(r.depths) if r.tree is None else dec.settings.depth,
            "supertree_nodes": len(r.alive) - 1 if r.nodes else None,
            "tree_nodes": len(r.pruned["tokens"]) - 1 if r.pruned else None,
            "accepted": len(r.verify["path"]) - 1 if r.verify else None,
            "output_ids": list(dec.output), "text": res.text, "finished": dec.finished, "rounds": res.rounds,
            "tau": res.tau, "tokens_per_second": res.tokens_per_second}


def status_line(message: str, decoder) -> str:
    """The status panel: a message, then where the generation stands."""
    if decoder is None:
        where = ""
    elif decoder.next_stage == "done":
        where = "finished"
    else:
        where = f"round {decoder.round} · next stage: **{decoder.next_stage}**"
    return f"{message}\n\n<span style='color:#666'>{where}</span>"


def render(session, dirty) -> dict:
    """The changed panels by name, plus the status and the summary (always)."""
    out = {"status": status_line(session.message, session.decoder), "summary": summary(session)}
    out.update({name: make(session) for name, make in PANELS.items() if name in dirty})
    return out


def full_render(session) -> dict:
    return render(session, PANELS)
