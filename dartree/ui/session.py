"""One visitor's explorer: its controls, its decoder, the plain views of the round on show, and the event
functions the buttons call.

Everything here is plain Python, without Gradio: `event(session, action, **controls)` takes the control
values by name and returns the changed outputs by name (`dartree.ui.panels.OUTPUTS`), so it is tested
without a browser, and `dartree.ui.layout` maps the names to components. Every stage button runs real
`Decoder.step()` calls on the real models; nothing is mocked or replayed. Each browser session holds its own
`Session` (a `gr.State`), and one process-wide lock serialises engine calls, so one visitor's clicks never
touch another's decoder.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from functools import singledispatch
from pathlib import Path

import pandas as pd

from ..budget import policy_for, shape_for
from ..defaults import CPU_DEFAULTS, RETRIEVAL_DEFAULT, TEMPERATURE_BANDS
from .. import timing
from ..engine import Decoder, DecodeSettings
from ..errors import UserError
from ..methods import METHODS
from ..retrieval import RETRIEVED, SOURCE_BITS
from ..trace import CommitRecord, DepthRecord, DraftRecord, PrefillRecord, TreeRecord, VerifyRecord
from . import panels
from .panels import MIN_RATIO_TOKENS
from .adapter import (NodeView, TokenTexts, depth_view, draft_view, nodes_from_tree, root_node, tree_view,
                      verify_view, with_retrieved)
from .narrate import narrate

# One prompt of each kind the dev sets measure (chat, code, math, a long document), copied with its file and row
# from ../shared/data (the app ships without it): the first of its source in the file (for chat, the first on one
# line, so that it reads well as the worked example). Not chosen for speed: the speed panel shows the machine's
# bench reference beside any one prompt's figure.
EXAMPLES = tuple(json.loads(Path(__file__).with_name("examples.json").read_text()))
EXAMPLE_PROMPTS = tuple(e["prompt"] for e in EXAMPLES)
DEFAULT_PROMPT = EXAMPLE_PROMPTS[0]
PROBE_TOKENS = 16  # plain steps timed for t_AR when no whole run of the prompt was timed yet
ENGINE_LOCK = threading.RLock()
STAGE_ORDER = {"draft": 0, "depth": 1, "prune": 2, "verify": 3, "commit": 4}
TRACE_DIR = Path(tempfile.gettempdir()) / "dartree-traces"
WARNING = "warning"  # a pseudo-output: a message the page shows as a toast (see `event`)


# ---------------------------------------------------------------------------------------- controls
@dataclass(frozen=True)
class Controls:
    """The explorer's control values. This is the one declaration of the controls: the layout gives every
    field a component of the same name, and values travel by name (never by position)."""

    prompt: str = DEFAULT_PROMPT
    method: str = "dartree"
    width: int = CPU_DEFAULTS["width"]  # the best (W, B) measured on this CPU (dartree.defaults)
    budget: int = CPU_DEFAULTS["budget"]
    depth: int = 7
    candidates: int = CPU_DEFAULTS["candidates"]
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: int = 32
    auto_budget: bool = False  # dartree: per-round B by expected tokens/s (on where calibrated: default_controls)
    depth_bonus: float = CPU_DEFAULTS.get("depth_bonus", 0.0)  # the top-B cut ranks by score + bonus * depth
    retrieval: str = RETRIEVAL_DEFAULT  # retrieved branches before the cut: none, ngram, table, both
    continuity: float = CPU_DEFAULTS.get("continuity", 0.0)  # weight of DART's n-gram term in the scores

    @classmethod
    def of(cls, **named) -> "Controls":
        """Build from control values by name (as the page sends them: numbers may come as text); coerce
        types. A missing or None value takes the default."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(named) - set(known))
        if unknown:
            raise TypeError(f"unknown controls {unknown}: Controls has {list(known)}")
        return cls(**{name: _coerce(f, named[name]) for name, f in known.items() if named.get(name) is not None})

    def settings(self) -> DecodeSettings:
        return DecodeSettings(method=self.method, width=self.width, budget=self.budget, depth=self.depth,
                              candidates=self.candidates, temperature=self.temperature, seed=self.seed,
                              max_new_tokens=self.max_new_tokens, depth_bonus=self.depth_bonus,
                              retrieval=self.retrieval, continuity=self.continuity,
                              auto_budget=self.auto_budget and self.method in METHODS and METHODS[self.method].auto_budget)


def _coerce(f, value):
    try:
        if f.type == "bool":
            return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")
        if f.type == "str":
            return str(value)
        return float(value) if f.type == "float" else int(round(float(value)))
    except (TypeError, ValueError) as exc:
        raise UserError(f"{f.name.replace('_', ' ')} must be a number, got {value!r}") from exc


def default_controls(models, **overrides) -> Controls:
    """The measured defaults of the models' device at the overrides' temperature (0 unless given), auto budget
    only where it is calibrated (dartree.defaults)."""
    return Controls(**{**shape_controls(models, overrides.get("temperature", 0.0)), **overrides})


SHAPE_CONTROLS = ("width", "budget", "auto_budget", "depth_bonus", "continuity")  # the controls that follow the temperature


def shape_controls(models, temperature: float) -> dict:
    """The shape controls' default values at this temperature (`shape_for`: dartree.defaults' temperature axis)."""
    shape = shape_for(models, temperature)
    return {"width": shape["width"], "budget": shape["budget"], "candidates": shape["candidates"],
            "auto_budget": bool(shape.get("auto_budget")), "depth_bonus": shape.get("depth_bonus", 0.0),
            "continuity": shape.get("continuity", 0.0)}


def follow_temperature(models, temperature: float, **shape) -> dict:
    """The shape controls after the temperature slider moved to `temperature`: the new temperature's defaults
    where the visitor has not touched them (they equal the defaults of some temperature band), else as they are."""
    current = {k: _coerce(next(f for f in fields(Controls) if f.name == k), shape[k]) for k in SHAPE_CONTROLS}
    untouched = any(current == {k: shape_controls(models, t)[k] for k in SHAPE_CONTROLS}
                    for t in TEMPERATURE_BANDS)
    return {k: shape_controls(models, temperature)[k] for k in SHAPE_CONTROLS} if untouched else current


# ---------------------------------------------------------------------------------------- state
@dataclass
class RoundView:
    """Plain views of the round on show, filled record by record (`absorb`)."""

    records: list = field(default_factory=list)  # the raw records, for the trace download
    draft: dict | None = None
    depths: list[dict] = field(default_factory=list)
    nodes: list[NodeView] = field(default_factory=list)  # the supertree so far (cut candidates included)
    tree: dict | None = None  # ddtree's whole heap (it has no depth-by-depth records)
    prune: dict | None = None
    pruned: dict | None = None  # the tree to verify
    verify: dict | None = None
    pending: list[int] | None = None  # accepted by Verify, not yet committed

    @property
    def alive(self) -> list[NodeView]:
        """The supertree's nodes (root first), without the cut candidates."""
        return [n for n in self.nodes if n.survived]


class Session:
    """One visitor's decoder, the plain views of the round on show, and cached measurements."""

    def __init__(self, models):
        self.models = models
        self.texts = TokenTexts(models.target)
        self.controls: Controls | None = None
        self.decoder: Decoder | None = None
        self.round = RoundView()
        self.marks: list = []  # (round or None for prefill, tokens committed)
        self.timings: dict = {}  # (prompt, resolved settings) -> whole runs timed (`whole_runs`)
        self.step_seconds: dict = {}  # prompt -> t_AR, one plain decoding step (`plain_step`)
        self.sweep: dict | None = None
        self.message = ""
        self.last_stage: str | None = None

    def __deepcopy__(self, memo):
        """Gradio deep-copies a State's value for each new browser session: copy the decoder, its caches and
        views, but share the models and the token-text cache."""
        shared = [self.models, self.models.target, self.models.drafter, self.texts]
        memo.update({id(x): x for x in shared if x is not None})
        new = Session.__new__(Session)
        for key, value in self.__dict__.items():
            setattr(new, key, copy.deepcopy(value, memo))
        return new

    def whole_runs(self, fresh: bool = False) -> dict:
        """Plain decoding and the method on show, each run whole on this prompt and token count, in turn,
        `timing.UI_REPEATS` times (dartree.timing: what `bench` does per prompt); cached per prompt and settings,
        unless `fresh` (Run to end and Time whole runs measure again: a visitor asking for a figure gets a new one).

        The ratio is given only when a run decodes at least MIN_RATIO_TOKENS tokens: τ of one round ranges from
        1 to D + 1, so over a handful of rounds (16 tokens are about 7 rounds at this CPU's τ ≈ 2.3) the ratio
        is the luck of a few rounds, and a few milliseconds of timer noise weigh on a run of a few dozen."""
        dec = self.decoder
        key = (self.controls.prompt, dec.settings)
        if fresh or key not in self.timings:
            plain = plain_settings(dec.settings)
            configs = [plain] if dec.settings.method == "ar" else [plain, dec.settings]
            with ENGINE_LOCK:
                runs = timing.alternate(self.models.target, self.models.drafter, dec.prompt_ids, configs,
                                        dec.budget_policy, timing.UI_REPEATS)
            ar_runs, mine = runs[0], runs[-1]
            tps, ar_tps = timing.tokens_per_second(mine), timing.tokens_per_second(ar_runs)
            decoded = mine[0].new_tokens - 1
            self.timings[key] = {
                "method": dec.settings.method, "tps": tps, "ar_tps": ar_tps, "tokens": mine[0].new_tokens,
                "tau": timing.mean_tau(mine),
                "ratio": tps / ar_tps if ar_tps and decoded >= MIN_RATIO_TOKENS else None,
                "runs": len(mine), "t_ar": timing.plain_step_seconds(ar_runs)}
            self.step_seconds[self.controls.prompt] = self.timings[key]["t_ar"]
        return self.timings[key]

    def measured(self) -> dict | None:
        """The whole-run timing of the prompt and settings on show, if made."""
        dec = self.decoder
        return self.timings.get((self.controls.prompt, dec.settings)) if dec is not None else None

    def plain_step(self) -> float:
        """t_AR on this prompt, measured in this process: from the whole runs when made, else from
        PROBE_TOKENS plain tokens run whole now (dartree.timing)."""
        prompt = self.controls.prompt
        if prompt not in self.step_seconds:
            settings = plain_settings(replace(self.decoder.settings, max_new_tokens=PROBE_TOKENS + 1))
            with ENGINE_LOCK:
                runs = timing.alternate(self.models.target, None, self.decoder.prompt_ids, [settings])[0]
            self.step_seconds[prompt] = timing.plain_step_seconds(runs)
        return self.step_seconds[prompt]


def each_method(base: DecodeSettings, methods) -> list[DecodeSettings]:
    """The settings for each method, the automatic budget kept only where the method has one."""
    return [replace(base, method=m, auto_budget=base.auto_budget and METHODS[m].auto_budget) for m in methods]


def plain_settings(settings: DecodeSettings) -> DecodeSettings:
    """Plain decoding with the same prompt-independent settings: token count, temperature, seed."""
    return DecodeSettings(method="ar", temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed,
                          max_new_tokens=settings.max_new_tokens)


# ---------------------------------------------------------------------------------------- records -> state
@singledispatch
def absorb(rec, session: Session) -> None:
    """Fold one step's record into the session's views (state only: the words are `narrate`'s)."""
    raise TypeError(f"no view for a {type(rec).__name__}")


@absorb.register
def _prefill(rec: PrefillRecord, session: Session) -> None:
    session.marks.append((None, 1))


@absorb.register
def _draft(rec: DraftRecord, session: Session) -> None:
    session.round = RoundView(draft=draft_view(rec, session.texts), nodes=[root_node(rec.anchor, session.texts)])


@absorb.register
def _depth(rec: DepthRecord, session: Session) -> None:
    dv = depth_view(rec, session.texts)
    session.round.depths.append(dv)
    session.round.nodes += dv["survivors"] + dv["cut"]


@absorb.register
def _tree(rec: TreeRecord, session: Session) -> None:
    r, tv = session.round, tree_view(rec, session.texts)
    if rec.stage == "depth":  # ddtree builds its whole heap in one step
        r.tree, r.nodes = tv, nodes_from_tree(tv)
        return
    bonus = session.decoder.settings.depth_bonus
    if tv["supertree"] is not None:  # retrieval merged its chains into the supertree before the cut
        r.nodes = with_retrieved(r.nodes, tv["supertree"], session.texts)
    alive = r.alive
    kept = tv["kept"] if tv["kept"] is not None else [n.id for n in alive]
    inside = set(kept)
    ranked = sorted(((n.score + bonus * n.depth, n.id in inside) for n in alive[1:]), key=lambda kv: -kv[0])
    r.prune = {"kept": kept, "ranked": ranked, "budget": rec.budget, "total": len(alive) - 1, "bonus": bonus,
               "deferred": tv["kept"] is not None, "lowest": min((k for k, keep in ranked if keep), default=None),
               "retrieved": retrieved_counts(tv["supertree"]["bits"], inside) if tv["supertree"] is not None else None}
    r.pruned = dict(tv, prefix_len=session.decoder.prefix_len)


def retrieved_counts(bits: list[int], kept: set) -> dict:
    """Per retrieval source: merged supertree nodes it proposed (`bits`: each node's source bit mask) and how
    many of them the cut kept; a node two sources proposed counts for each."""
    return {src: {"proposed": sum(bool(b & SOURCE_BITS[src]) for b in bits[1:]),
                  "kept": sum(bool(b & SOURCE_BITS[src]) and i in kept for i, b in enumerate(bits) if i)}
            for src in RETRIEVED}


@absorb.register
def _verify(rec: VerifyRecord, session: Session) -> None:
    r = session.round
    scores = r.pruned["scores"] if r.pruned else [0.0] * int(rec.tokens.shape[0])
    r.verify = verify_view(rec, session.texts, scores)
    r.pending = [r.verify["tokens"][i] for i in r.verify["path"][1:]] + [r.verify["bonus"]]


@absorb.register
def _commit(rec: CommitRecord, session: Session) -> None:
    session.round.pending = None
    session.marks.append((rec.round, len(rec.new_tokens)))


def step(session: Session) -> tuple[str, frozenset]:
    """One engine step: its sentence and the panels it changed."""
    with ENGINE_LOCK:
        rec = session.decoder.step()
    session.last_stage = rec.stage
    absorb(rec, session)
    if isinstance(rec, CommitRecord):
        session.plain_step()  # the round's time in plain steps needs t_AR (measured once per prompt)
    if not isinstance(rec, PrefillRecord):
        session.round.records.append(rec)
    changed = panels.CHANGES[rec.stage]
    if isinstance(rec, TreeRecord) and rec.supertree is not None:
        changed = changed | panels.RETRIEVED_JOIN
    return narrate(rec, session), changed


# ---------------------------------------------------------------------------------------- events
def budget_policy(models, settings: DecodeSettings):
    """The calibrated auto-budget policy when the settings ask for it (a clear message when none fits)."""
    return policy_for(models.target, models.drafter_name, temperature=settings.temperature) if settings.auto_budget else None


def _ensure_decoder(session: Session, controls: Controls, force: bool = False) -> str | None:
    """Make the session's decoder match the controls; returns a note when it (re)started."""
    if not force and session.decoder is not None and session.controls == controls:
        return None
    target = session.models.target
    settings = controls.settings()
    decoder = Decoder(target, session.models.drafter, target.chat_ids(controls.prompt), settings,
                      budget_policy(session.models, settings))
    changed = session.decoder is not None and not force
    session.decoder, session.controls = decoder, controls
    session.marks, session.last_stage, session.round = [], None, RoundView()
    if changed:
        return "The settings or the prompt changed, so decoding started again from the prompt."
    return None


def _run_until(session: Session, stage: str, sentences: list, dirty: set):
    """Step until a step of `stage` has run (or the generation ends)."""
    dec = session.decoder
    while dec.next_stage != "done":
        ran = dec.next_stage
        sentence, changed = step(session)
        sentences.append(sentence)
        dirty |= changed
        if ran == stage:
            return


def act(session: Session, action: str, controls: Controls) -> dict:
    """Run one button's worth of engine steps; returns the changed outputs by name (see panels.OUTPUTS).

    Actions: draft, depth, prune, verify, commit (advance to and through that stage), step (exactly one
    engine step: what Play does), round (finish the round; from its start or after verify, a whole
    round), end (run to the end, then measure plain decoding), measure (time plain decoding) and reset.
    """
    sentences, dirty = [], set()
    note = _ensure_decoder(session, controls, force=action == "reset")
    if note:
        sentences.append(note)
        dirty |= set(panels.PANELS)
    dec = session.decoder
    if action == "reset":
        session.message = ("Reset: a fresh generation for this prompt and these settings. Press Draft to start "
                           "round 0, or Play to watch the stages go by.")
        return panels.render(session, set(panels.PANELS))
    if action == "measure":
        m = session.whole_runs(fresh=True)
        session.message = (f"Timed {m['runs']} whole runs each of plain decoding and {m['method']} on this prompt, in "
                           f"turn: {m['tokens']} tokens, plain decoding at {m['ar_tps']:.1f} tokens/s, "
                           f"{m['method']} at {m['tps']:.1f} tokens/s.")
        return panels.render(session, dirty | panels.SPEED)
    if dec.next_stage == "done":
        raise UserError("This generation has finished: press Reset, or change the prompt or a setting to start again.")
    current = dec.next_stage
    if action == "step":
        sentence, changed = step(session)
        sentences.append(sentence)
        dirty |= changed
    elif action == "end":
        session.whole_runs(fresh=True)  # first, so that t_AR for the rounds' figures comes from it (no separate probe)
        while dec.next_stage != "done":
            dirty |= step(session)[1]
        res = dec.result()
        sentences.append(f"Ran to the end: {res.new_tokens} tokens in {res.rounds} rounds (τ = {res.tau:.2f} tokens "
                         "per round); then timed whole runs of plain decoding and this method on the same prompt, "
                         "in turn (the speed panel). The panels show the last round.")
        dirty |= {"timeline_fig", "text"}
    elif action == "round":
        if current == "commit":
            _run_until(session, "commit", sentences, dirty)
        if dec.next_stage != "done":
            _run_until(session, "commit", sentences, dirty)
        sentences = sentences[-2:]
    elif action in STAGE_ORDER:
        if current == "prefill":
            sentence, changed = step(session)
            sentences.append(sentence)
            dirty |= changed
            current = dec.next_stage
        if action == "draft" and current not in ("draft", "commit", "done"):
            raise UserError(f"Round {dec.round} is still being built (next stage: {current}): finish it with "
                            "Next round, or press Reset.")
        if current not in ("draft", "commit", "done") and STAGE_ORDER[action] < STAGE_ORDER[current]:
            raise UserError(f"Round {dec.round} has already passed the {action} stage: its next stage is "
                            f"{current}. Press {current.capitalize()} (or Next round) to go on.")
        _run_until(session, action, sentences, dirty)
        if len(sentences) > 3:
            sentences = [f"({len(sentences) - 2} earlier steps ran first.)"] + sentences[-2:]
    else:
        raise UserError(f"unknown action {action!r}")
    if dec.next_stage == "done":  # the run is complete: time it whole (the speed ratio needs it)
        session.whole_runs()
        dirty |= panels.SPEED
    session.message = " ".join(sentences)
    return panels.render(session, dirty)


def event(session: Session, action: str, **values) -> dict:
    """A stage button: control values by name in, the changed outputs by name out.

    A `UserError` becomes the status line plus `WARNING` (the page shows it as a toast); the panels keep
    what they showed."""
    try:
        return act(session, action, Controls.of(**values))
    except UserError as exc:
        return {"status": panels.status_line(f"⚠️ **{exc}**", session.decoder), WARNING: str(exc)}


def warm_up(models, controls: Controls) -> None:
    """Start-up, before the page is served: a short, untimed decode of every method on the example prompt, so
    that the first calls' one-off costs (caches allocated, kernels picked, weight panels built) are paid here
    and no figure on the page includes them. Logs one line."""
    t0 = time.perf_counter()
    target, base = models.target, controls.settings()
    methods = [m for m in METHODS if m == "ar" or models.drafter is not None]
    with ENGINE_LOCK:
        timing.warm_up(target, models.drafter, target.chat_ids(controls.prompt), each_method(base, methods),
                       budget_policy(models, base))
    print(f"[dartree] warmed up: {len(methods)} methods × {timing.WARMUP_TOKENS} tokens in "
          f"{time.perf_counter() - t0:.1f} s (no figure includes a first call's cost)", flush=True)


def canonical_session(models, controls: Controls | None = None) -> Session:
    """The example every visitor sees on first load: after a warm-up, the default prompt's first real round, and
    whole runs of plain decoding and the method timed on it (the speed panel's ratio).

    `DARTREE_EXAMPLE_TOKENS` overrides its max new tokens (the tests use a small value to start faster)."""
    session = Session(models)
    if controls is None:
        tokens = int(os.environ.get("DARTREE_EXAMPLE_TOKENS", "0") or 0)
        controls = default_controls(models, **({"max_new_tokens": tokens} if tokens > 0 else {}))
    warm_up(models, controls)
    _ensure_decoder(session, controls)
    session.whole_runs()  # before the round, so that its t_AR comes from these runs
    act(session, "round", controls)
    session.message = (f"A first round on “{controls.prompt}” is already done, with every panel filled. Step through "
                       "the next one with Draft → Next depth → Prune → Verify → Commit, or press Play.")
    return session


def export_trace(session: Session, fmt: str = "json") -> str:
    """Write the records of the round on show to a file; returns its path."""
    records = session.round.records
    if not records:
        raise UserError("No round to export yet: press Draft first.")
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    rnd, fmt = records[0].round, "csv" if fmt == "csv" else "json"
    path = TRACE_DIR / f"dartree-round{rnd}-{int(time.time() * 1000)}-{threading.get_ident()}.{fmt}"
    if fmt == "csv":
        frames = [r.to_frame().assign(stage=r.stage, round=rnd) for r in records]
        pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    else:
        payload = {"settings": asdict(session.decoder.settings), "drafter": session.models.drafter_description,
                   "prompt": session.controls.prompt, "round": rnd, "records": [r.to_dict() for r in records]}
        path.write_text(json.dumps(payload, indent=1, default=str))
    return str(path)
