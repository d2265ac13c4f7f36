"""The DARTree Explorer: per-session state, the event functions and the Gradio Blocks layout.

Event functions are plain Python: they take a `Session` plus the control values and return plain
values (figures, HTML, dicts), so they can be unit-tested without a browser. Every stage button runs
real `Decoder.step()` calls on the real models; nothing is mocked or replayed. Each browser session
holds its own `Session` (a `gr.State`), and one process-wide lock serialises engine calls, so one
visitor's clicks never touch another's decoder.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from .. import TREE_METHODS  # noqa: E402
from ..defaults import CPU_DEFAULTS, shape_for  # noqa: E402
from ..engine import Decoder, DecodeSettings, generate  # noqa: E402
from ..errors import UserError  # noqa: E402
from ..trace import DepthRecord  # noqa: E402
from . import figures  # noqa: E402
from .adapter import (TokenTexts, depth_view, draft_view, nodes_from_tree, root_node, text_segments,  # noqa: E402
                      tree_view, verify_view)

METHOD_CHOICES = ("dartree", "dartree-fixed", "ddtree", "chain")
RACE_METHODS = ("ar", "chain", "ddtree", "dartree")
DEFAULT_PROMPT = "Write one sentence about the ocean."
EXAMPLE_PROMPTS = (
    DEFAULT_PROMPT,
    "What is the capital of France?",
    "List three primary colours.",
    "Explain what a binary tree is in one sentence.",
    "Write a haiku about autumn.",
)
ENGINE_LOCK = threading.RLock()
STAGE_ORDER = {"draft": 0, "depth": 1, "prune": 2, "verify": 3, "commit": 4}
PANELS = ("draft_fig", "supertree_fig", "correction_fig", "prune_fig", "rank_fig", "mask_fig", "verify_fig",
          "text", "speed_fig", "timeline_fig", "speed_md")
OUTPUTS = ("status", "summary") + PANELS
ROUND_PANELS = {"draft_fig", "supertree_fig", "correction_fig", "prune_fig", "rank_fig", "mask_fig", "verify_fig"}
TRACE_DIR = Path(tempfile.gettempdir()) / "dartree-traces"


# ---------------------------------------------------------------------------------------- state
@dataclass(frozen=True)
class Controls:
    """The values of the explorer's controls, in the order the event functions take them."""

    prompt: str = DEFAULT_PROMPT
    method: str = "dartree"
    width: int = CPU_DEFAULTS["width"]  # the best (W, B) measured on this CPU (dartree.defaults)
    budget: int = CPU_DEFAULTS["budget"]
    depth: int = 7
    candidates: int = CPU_DEFAULTS["candidates"]
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: int = 32
    auto_budget: bool = False  # dartree: per-round B by expected tokens/s (on by default via default_controls)

    @classmethod
    def of(cls, *values, **named) -> "Controls":
        """Build from positional control values (as Gradio passes them) and/or names; coerce types."""
        raw = dict(zip([f.name for f in fields(cls)], values))
        raw.update(named)
        out = {}
        for f in fields(cls):
            v = raw.get(f.name, f.default)
            if v is None:
                v = f.default
            try:
                if f.type == "bool":
                    out[f.name] = v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "on")
                else:
                    out[f.name] = str(v) if f.type == "str" else (float(v) if f.type == "float" else int(round(float(v))))
            except (TypeError, ValueError) as exc:
                raise UserError(f"{f.name} must be a number, got {v!r}") from exc
        return cls(**out)

    def settings(self) -> DecodeSettings:
        return DecodeSettings(method=self.method, width=self.width, budget=self.budget, depth=self.depth,
                              candidates=self.candidates, temperature=self.temperature, seed=self.seed,
                              max_new_tokens=self.max_new_tokens,
                              auto_budget=self.auto_budget and self.method == "dartree")

    def values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


class Session:
    """One visitor's decoder, the plain views of the round on show, and cached measurements."""

    def __init__(self, models):
        self.models = models
        self.texts = TokenTexts(models.target)
        self.controls: Controls | None = None
        self.decoder: Decoder | None = None
        self.records: list = []  # raw records of the round on show (for the trace download)
        self.view: dict = {}
        self.marks: list = []  # (round or None for prefill, tokens committed)
        self.ar_cache: dict = {}
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

    @property
    def max_depth(self) -> int:
        return self.models.drafter.max_depth if self.models.drafter is not None else 1

    def clear_round(self):
        self.records = []
        self.view = {"draft": None, "depths": [], "nodes": [], "tree": None, "prune": None, "pruned": None,
                     "verify": None, "pending": None}


def new_session(models) -> Session:
    session = Session(models)
    session.clear_round()
    return session


# ---------------------------------------------------------------------------------------- engine steps
def _budget_policy(models, settings: DecodeSettings):
    """The calibrated auto-budget policy when the settings ask for it (a clear message when none fits)."""
    if not settings.auto_budget:
        return None
    from ..budget import policy_for

    return policy_for(models.target, models.drafter_name)


def _ensure_decoder(session: Session, controls: Controls, force: bool = False) -> str | None:
    """Make the session's decoder match the controls; returns a note when it (re)started."""
    if not force and session.decoder is not None and session.controls == controls:
        return None
    target = session.models.target
    prompt_ids = target.chat_ids(controls.prompt)
    settings = controls.settings()
    decoder = Decoder(target, session.models.drafter, prompt_ids, settings, _budget_policy(session.models, settings))
    changed = session.decoder is not None and not force
    session.decoder, session.controls = decoder, controls
    session.marks, session.last_stage = [], None
    session.clear_round()
    if changed:
        return "The settings or the prompt changed, so decoding started again from the prompt."
    return None


def _absorb(session: Session, rec) -> tuple[str, set]:
    """Turn one step's record into plain views; returns a plain-language sentence and the panels it changed."""
    dec, texts, view, s = session.decoder, session.texts, session.view, session.decoder.settings
    stage = rec.stage
    session.last_stage = stage
    if stage == "prefill":
        session.marks.append((None, 1))
        return (f"Prefill: the target read the prompt ({rec.prompt_tokens} tokens) in one pass and chose the first "
                f"token “{texts(rec.first_token)}”. It becomes the root of round 0's tree.", {"text"})
    if stage == "draft":
        session.clear_round()
        view = session.view
        session.records.append(rec)
        view["draft"] = draft_view(rec, texts)
        view["nodes"] = [root_node(rec.anchor, texts)]
        return (f"Round {rec.round}: one drafter pass after “{texts(rec.anchor)}” proposed its top {s.candidates} "
                f"candidates for each of the next {s.depth} positions ({rec.seconds:.2f} s). "
                "Nothing is a tree yet: the next steps grow one.", set(ROUND_PANELS))
    session.records.append(rec)
    if stage == "depth" and isinstance(rec, DepthRecord):
        dv = depth_view(rec, texts, first_corrected_depth=getattr(dec.drafter.cfg, "pure_draft_prefix_len", 0) + 1)
        view["depths"].append(dv)
        view["nodes"] += dv["survivors"] + dv["cut"]
        how = {"chain": "kept the single best child (a chain)",
               "dartree-fixed": f"kept its quota of the {dv['kept']} best",
               "dartree": f"kept the global top {dv['kept']} (W = {s.width})"}[s.method]
        sentence = (f"Depth {rec.depth}: expanded {len(dv['frontier'])} frontier node(s) × {dv['candidates']} "
                    f"candidates = {dv['examined']} children, re-scored them with the correction head and {how}.")
        if dec.next_stage == "prune":
            alive = sum(1 for n in view["nodes"] if n.get("survived") is not False) - 1
            sentence += f" The tree is complete with {alive} nodes: press Prune."
        return sentence, {"supertree_fig", "correction_fig"}
    if stage == "depth":  # ddtree builds its whole heap in one step
        tv = tree_view(rec, texts)
        view["tree"] = tv
        view["nodes"] = nodes_from_tree(tv)
        return (f"DDTree's best-first heap picked the {len(tv['tokens']) - 1} best nodes by the drafter's marginal "
                f"path score in one step (budget B = {s.budget}, no correction). Press Prune.",
                {"supertree_fig", "correction_fig"})
    if stage == "prune":
        tv = tree_view(rec, texts)
        alive = [n for n in view["nodes"] if n.get("survived") is not False]
        total = len(alive) - 1
        budget = rec.budget  # B, or the auto budget's choice for this round
        if tv["kept"] is not None:
            kept = tv["kept"]
            cut = sorted((n["score"] for n in alive[1:]), reverse=True)
            how = (f"the auto budget chose B = {budget} (at most {s.budget}) by expected tokens per second; "
                   if s.auto_budget else "")
            if total > budget:
                caption = (f"kept the best {budget} of {total} supertree nodes; the lowest kept path score is "
                           f"{cut[budget - 1]:.2f}")
                sentence = (f"Deferred pruning: {how}it kept the {budget} best of the supertree's {total} nodes by "
                            f"path score, across all depths at once; the tree to verify has {len(kept) - 1} nodes.")
            else:
                caption = f"the supertree has {total} ≤ B = {budget} nodes: all kept"
                sentence = f"{how}The supertree has only {total} nodes (≤ B = {budget}), so pruning keeps them all."
        else:
            kept = [n["id"] for n in alive]
            caption = f"{s.method} grows within its budget: all {total} nodes kept, nothing pruned"
            sentence = f"{s.method} already built its tree within the budget: nothing to prune ({total} nodes)."
        view["prune"] = {"kept": kept, "scores": [n["score"] for n in alive[1:]], "budget": rec.budget,
                         "caption": caption}
        view["pruned"] = dict(tv, prefix_len=dec.prefix_len)
        return sentence, {"prune_fig", "rank_fig", "mask_fig"}
    if stage == "verify":
        scores = view["pruned"]["scores"] if view.get("pruned") else [0.0] * int(rec.tokens.shape[0])
        vv = verify_view(rec, texts, scores)
        view["verify"] = vv
        path = vv["path"]
        view["pending"] = [vv["tokens"][i] for i in path[1:]] + [vv["bonus"]]
        agreed = len(path) - 1
        return (f"Verify: the target read all {len(vv['tokens'])} tree nodes in one forward pass ({rec.seconds:.2f} s); "
                f"it agrees with {agreed} draft token(s) along one path and adds its own bonus token "
                f"“{vv['bonus_text']}”.", {"verify_fig", "mask_fig", "text"})
    if stage == "commit":
        view["pending"] = None
        session.marks.append((rec.round, len(rec.new_tokens)))
        sentence = (f"Commit: {len(rec.new_tokens)} token(s) appended ({rec.accepted} from the draft + the bonus) "
                    f"and the target's cache compacted to the accepted path ({rec.cache_length} tokens).")
        if rec.finished == "eos":
            sentence += " The model ended its answer."
        elif rec.finished == "length":
            sentence += " The maximum number of new tokens is reached."
        return sentence, {"text", "speed_fig", "timeline_fig", "speed_md"}
    return f"{stage} done.", set()


def _step(session: Session) -> tuple[str, set]:
    with ENGINE_LOCK:
        rec = session.decoder.step()
    return _absorb(session, rec)


def _run_until(session: Session, stage: str, sentences: list, dirty: set):
    """Step until a step of `stage` has run (or the generation ends)."""
    dec = session.decoder
    while dec.next_stage != "done":
        ran = dec.next_stage
        sentence, changed = _step(session)
        sentences.append(sentence)
        dirty |= changed
        if ran == stage:
            return


def _plain_ar(session: Session) -> dict:
    """Plain autoregressive decoding with the same prompt and settings, measured once per session."""
    c = session.controls
    key = (c.prompt, c.max_new_tokens, c.temperature, c.seed)
    if key not in session.ar_cache:
        target = session.models.target
        settings = DecodeSettings(method="ar", temperature=c.temperature, seed=c.seed, max_new_tokens=c.max_new_tokens)
        with ENGINE_LOCK:
            result = generate(target, None, target.chat_ids(c.prompt), settings)
        session.ar_cache[key] = {"tps": result.tokens_per_second, "tokens": result.new_tokens,
                                 "seconds": result.decode_seconds, "token_ids": list(result.token_ids),
                                 "text": result.text}
    return session.ar_cache[key]


def _cached_ar(session: Session) -> dict | None:
    c = session.controls
    return session.ar_cache.get((c.prompt, c.max_new_tokens, c.temperature, c.seed)) if c else None


def act(session: Session, action: str, controls: Controls) -> dict:
    """Run one button's worth of engine steps; returns the changed panels by name (see OUTPUTS).

    Actions: draft, depth, prune, verify, commit (advance to and through that stage), step (exactly one
    engine step: what Play does), round (finish the round; from its start or after verify, a whole
    round), end (run to the end, then measure plain decoding), measure (time plain decoding) and reset.
    """
    sentences, dirty = [], set()
    note = _ensure_decoder(session, controls, force=action == "reset")
    if note:
        sentences.append(note)
        dirty |= set(PANELS)
    dec = session.decoder
    if action == "reset":
        session.message = ("Reset: a fresh generation for this prompt and these settings. Press Draft to start "
                           "round 0, or Play to watch the stages go by.")
        return render(session, set(PANELS))
    if action == "measure":
        ar = _plain_ar(session)
        session.message = (f"Plain decoding of the same prompt: {ar['tokens']} tokens at {ar['tps']:.1f} tokens/s "
                           "on this machine (now cached for this session).")
        return render(session, dirty | {"speed_fig", "speed_md"})
    if dec.next_stage == "done":
        raise UserError("This generation has finished: press Reset, or change the prompt or a setting to start again.")
    current = dec.next_stage
    if action == "step":
        sentence, changed = _step(session)
        sentences.append(sentence)
        dirty |= changed
    elif action == "end":
        t0 = time.perf_counter()
        while dec.next_stage != "done":
            _, changed = _step(session)
            dirty |= changed
        ar = _plain_ar(session)
        res = dec.result()
        sentences.append(f"Ran to the end in {time.perf_counter() - t0:.1f} s: {res.new_tokens} tokens in {res.rounds} "
                         f"rounds (τ = {res.tau:.2f} tokens per round) at {res.tokens_per_second:.1f} tokens/s; plain "
                         f"decoding runs at {ar['tps']:.1f} tokens/s here. The panels show the last round.")
        dirty |= {"speed_fig", "speed_md", "timeline_fig", "text"}
    elif action == "round":
        if current == "commit":
            _run_until(session, "commit", sentences, dirty)
        if dec.next_stage != "done":
            _run_until(session, "commit", sentences, dirty)
        sentences = sentences[-2:] if len(sentences) > 2 else sentences
    elif action in STAGE_ORDER:
        if current == "prefill":
            sentence, changed = _step(session)
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
    session.message = " ".join(sentences)
    return render(session, dirty)


# ---------------------------------------------------------------------------------------- rendering
def _supertree(session: Session) -> dict | None:
    view, dec = session.view, session.decoder
    if not view.get("nodes"):
        return None
    s = dec.settings
    built = len(view["depths"]) if view.get("tree") is None else s.depth
    alive = sum(1 for n in view["nodes"] if n.get("survived") is not False) - 1
    if s.method == "ddtree":
        caption = f"DDTree heap: {alive} nodes by marginal path score (no correction, no per-depth cut)"
    else:
        caption = (f"{s.method}, W = {s.width}: {alive} nodes over {built} of {s.depth} depths; faded = cut "
                   f"candidates (up to 3 per parent shown)")
    return {"nodes": view["nodes"], "max_depth": s.depth, "caption": caption}


def _speed(session: Session) -> dict | None:
    dec = session.decoder
    if dec is None or not dec.rounds:
        return None
    res = dec.result()
    ar = _cached_ar(session)
    ratio = res.tokens_per_second / ar["tps"] if ar and ar["tps"] > 0 else None
    caption = f"{res.new_tokens} tokens in {res.rounds} rounds so far"
    if ratio is not None:
        caption += f"; plain decoding: {ar['tokens']} tokens → speed ratio {ratio:.2f}×"
    else:
        caption += "; plain decoding not timed yet (Run to end or Time plain decoding)"
    return {"method": dec.settings.method, "tps": res.tokens_per_second, "tau": res.tau, "ar": ar, "ratio": ratio,
            "caption": caption}


def _speed_markdown(session: Session, speed: dict | None) -> str:
    desc = session.models.drafter_description
    if not speed:
        return "Speed appears after the first committed round."
    line = (f"**{speed['method']}**: {speed['tps']:.1f} tokens/s, τ = {speed['tau']:.2f} tokens per round")
    if speed["ar"]:
        line += f" · **plain decoding**: {speed['ar']['tps']:.1f} tokens/s · **ratio {speed['ratio']:.2f}×**"
    else:
        line += " · plain decoding: not timed yet"
    if desc.startswith("UNTRAINED"):
        line += ("\n\n*Measured with an UNTRAINED drafter: almost nothing is accepted, so the tree only costs time "
                 "here. The mechanics are real; the speed-up needs a trained drafter.*")
    return line


def summary(session: Session) -> dict:
    """A JSON-ready digest of the session (the API endpoints return it; the tests read it)."""
    dec, view = session.decoder, session.view
    if dec is None:
        return {"next_stage": None}
    pruned = view.get("pruned")
    verify = view.get("verify")
    alive = [n for n in view.get("nodes", []) if n.get("survived") is not False]
    res = dec.result()
    return {"round": dec.round, "next_stage": dec.next_stage, "last_stage": session.last_stage,
            "settings": asdict(dec.settings), "drafter": session.models.drafter_description,
            "depths_built": len(view.get("depths", [])) if view.get("tree") is None else dec.settings.depth,
            "supertree_nodes": len(alive) - 1 if alive else None,
            "tree_nodes": len(pruned["tokens"]) - 1 if pruned else None,
            "accepted": len(verify["path"]) - 1 if verify else None,
            "output_ids": list(dec.output), "text": res.text, "finished": dec.finished, "rounds": res.rounds,
            "tau": res.tau, "tokens_per_second": res.tokens_per_second}


def _status(session: Session) -> str:
    dec = session.decoder
    where = "finished" if dec.next_stage == "done" else f"round {dec.round} · next stage: **{dec.next_stage}**"
    return f"{session.message}\n\n<span style='color:#666'>{where}</span>"


def render(session: Session, dirty: set) -> dict:
    """The named outputs for the changed panels (status and summary always)."""
    view, out = session.view, {"status": _status(session), "summary": summary(session)}
    depth = session.decoder.settings.depth
    speed = _speed(session) if dirty & {"speed_fig", "speed_md"} else None
    makers = {
        "draft_fig": lambda: figures.draft_figure(view.get("draft")),
        "supertree_fig": lambda: figures.supertree_figure(_supertree(session)),
        "correction_fig": lambda: figures.correction_figure(_correction(session), session.decoder.settings.candidates),
        "prune_fig": lambda: figures.prune_figure(_supertree(session), view.get("prune")),
        "rank_fig": lambda: figures.rank_figure(view.get("prune")),
        "mask_fig": lambda: figures.mask_figure(view.get("verify") or view.get("pruned")),
        "verify_fig": lambda: figures.verify_figure(view.get("verify"), depth),
        "text": lambda: _text(session),
        "speed_fig": lambda: figures.speed_figure(speed),
        "timeline_fig": lambda: figures.timeline_figure([r.to_dict() for r in session.decoder.rounds]),
        "speed_md": lambda: _speed_markdown(session, speed),
    }
    for name in PANELS:
        if name in dirty:
            out[name] = makers[name]()
    return out


def _correction(session: Session) -> dict | None:
    view = session.view
    if view.get("tree") is not None:
        return {"correction": None, "caption": "DDTree ranks by the drafter's marginals alone: there is no correction "
                                               "head in this method, so nothing to compare"}
    return view["depths"][-1] if view.get("depths") else None


def _text(session: Session) -> str:
    dec = session.decoder
    pending = session.view.get("pending")
    segments = text_segments(dec.target, dec.output, session.marks, pending, dec.round) if dec.output else []
    note = "Each colour is one round; hover for its round. A dashed box marks tokens accepted but not yet committed."
    return figures.text_html(segments, note)


def full_render(session: Session) -> dict:
    return render(session, set(PANELS))


def export_trace(session: Session, fmt: str = "json") -> str:
    """Write the records of the round on show to a file; returns its path."""
    if not session.records:
        raise UserError("No round to export yet: press Draft first.")
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    rnd = session.records[0].round
    stamp = f"{int(time.time() * 1000)}-{threading.get_ident()}"
    if fmt == "csv":
        import pandas as pd

        frames = [r.to_frame().assign(stage=r.stage, round=rnd) for r in session.records]
        path = TRACE_DIR / f"dartree-round{rnd}-{stamp}.csv"
        pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    else:
        path = TRACE_DIR / f"dartree-round{rnd}-{stamp}.json"
        payload = {"settings": asdict(session.decoder.settings), "drafter": session.models.drafter_description,
                   "prompt": session.controls.prompt, "round": rnd,
                   "records": [r.to_dict() for r in session.records]}
        path.write_text(json.dumps(payload, indent=1, default=str))
    return str(path)


# ---------------------------------------------------------------------------------------- race and sweep
def race(models, controls: Controls, methods=RACE_METHODS):
    """Generator: every method decodes the same prompt, one round each in turn; yields the lanes."""
    target = models.target
    prompt_ids = target.chat_ids(controls.prompt)
    decoders = []
    for method in methods:
        settings = replace(controls.settings(), method=method, auto_budget=controls.auto_budget and method == "dartree")
        decoders.append(Decoder(target, models.drafter if method in TREE_METHODS else None, prompt_ids, settings,
                                _budget_policy(models, settings)))

    def lanes():
        out = []
        for d in decoders:
            res = d.result() if d.rounds else None
            out.append({"method": d.settings.method, "text": target.decode(d.output), "tokens": len(d.output),
                        "rounds": len(d.rounds), "tau": res.tau if res else 0.0,
                        "tps": res.tokens_per_second if res else 0.0, "finished": d.next_stage == "done"})
        return out

    yield lanes()
    while any(d.next_stage != "done" for d in decoders):
        for d in decoders:
            if d.next_stage != "done":
                with ENGINE_LOCK:
                    d.run_round()
        yield lanes()


def parse_ints(text: str, name: str, lo: int, hi: int, most: int = 6) -> list[int]:
    try:
        values = sorted({int(v) for v in str(text).replace(";", ",").split(",") if v.strip()})
    except ValueError as exc:
        raise UserError(f"{name}: give whole numbers separated by commas, e.g. 2,4,8") from exc
    if not values:
        raise UserError(f"{name}: give at least one value")
    if len(values) > most:
        raise UserError(f"{name}: at most {most} values, to keep the sweep short")
    bad = [v for v in values if not lo <= v <= hi]
    if bad:
        raise UserError(f"{name}: values must be between {lo} and {hi}, got {bad}")
    return values


def sweep(session: Session, widths_text: str, budgets_text: str, prompts_text: str, max_new_tokens: int,
          progress=None) -> dict:
    """DARTree over a W × B grid on a few prompts: mean τ and mean speed-up over plain decoding."""
    widths = parse_ints(widths_text, "W values", 1, 64)
    budgets = parse_ints(budgets_text, "B values", 1, 256)
    prompts = [p.strip() for p in str(prompts_text).splitlines() if p.strip()]
    if not prompts:
        raise UserError("give at least one prompt (one per line)")
    if len(prompts) > 4:
        raise UserError("at most 4 prompts, to keep the sweep short")
    max_new_tokens = int(max_new_tokens)
    if not 1 <= max_new_tokens <= 256:
        raise UserError("max new tokens for the sweep must be between 1 and 256")
    models, target = session.models, session.models.target
    base = session.controls or Controls()
    total = len(prompts) * (1 + len(widths) * len(budgets))
    done = 0

    def tick(desc):
        if progress is not None:
            progress((done, total), desc=desc)

    baselines = []
    for p in prompts:
        tick(f"plain decoding: {p[:30]}")
        key = (p, max_new_tokens, base.temperature, base.seed)
        if key not in session.ar_cache:
            with ENGINE_LOCK:
                r = generate(target, None, target.chat_ids(p),
                             DecodeSettings(method="ar", temperature=base.temperature, seed=base.seed,
                                            max_new_tokens=max_new_tokens))
            session.ar_cache[key] = {"tps": r.tokens_per_second, "tokens": r.new_tokens, "seconds": r.decode_seconds,
                                     "token_ids": list(r.token_ids), "text": r.text}
        baselines.append(session.ar_cache[key])
        done += 1
    tau = [[None] * len(budgets) for _ in widths]
    speedup = [[None] * len(budgets) for _ in widths]
    rows = []
    for i, w in enumerate(widths):
        for j, b in enumerate(budgets):
            taus, ratios = [], []
            for p, ar in zip(prompts, baselines):
                tick(f"W={w}, B={b}: {p[:30]}")
                settings = DecodeSettings(method="dartree", width=w, budget=b, depth=base.depth,
                                          candidates=base.candidates, temperature=base.temperature, seed=base.seed,
                                          max_new_tokens=max_new_tokens)
                with ENGINE_LOCK:
                    r = generate(target, models.drafter, target.chat_ids(p), settings)
                taus.append(r.tau)
                ratios.append(r.tokens_per_second / ar["tps"] if ar["tps"] > 0 else 0.0)
                done += 1
            tau[i][j] = sum(taus) / len(taus)
            speedup[i][j] = sum(ratios) / len(ratios)
            rows.append({"W": w, "B": b, "tau": round(tau[i][j], 3), "speedup": round(speedup[i][j], 3)})
    tick("done")
    session.sweep = {"widths": widths, "budgets": budgets, "tau": tau, "speedup": speedup, "rows": rows,
                     "prompts": prompts, "max_new_tokens": max_new_tokens}
    return session.sweep


def sweep_outputs(result: dict | None, drafter_description: str):
    if not result:
        return (figures.grid_figure("τ (tokens per round)", [], [], []),
                figures.grid_figure("speed-up over plain decoding", [], [], []), [])
    w, b = result["widths"], result["budgets"]
    note = " (UNTRAINED drafter)" if drafter_description.startswith("UNTRAINED") else ""
    return (figures.grid_figure(f"τ: mean tokens per round{note}", w, b, result["tau"]),
            figures.grid_figure(f"speed-up over plain decoding{note}", w, b, result["speedup"], colorscale="RdBu"),
            [[r["W"], r["B"], r["tau"], r["speedup"]] for r in result["rows"]])


# ---------------------------------------------------------------------------------------- Gradio glue
def _ordered(session: Session, out: dict) -> tuple:
    return (session,) + tuple(out.get(name, gr.skip()) for name in OUTPUTS)


def event(session: Session, action: str, *values):
    """The Gradio handler of every stage button: (state, controls...) -> (state, outputs in OUTPUTS order).

    A `UserError` becomes a warning toast plus the status line; the panels keep what they showed."""
    try:
        controls = Controls.of(*values)
        out = act(session, action, controls)
    except UserError as exc:
        gr.Warning(str(exc))
        where = (f"round {session.decoder.round} · next stage: {session.decoder.next_stage}"
                 if session.decoder is not None else "")
        out = {"status": f"⚠️ **{exc}**\n\n<span style='color:#666'>{where}</span>"}
    return _ordered(session, out)


def _handler(action: str):
    def handler(session, *values):
        return event(session, action, *values)

    handler.__name__ = f"on_{action}"
    return handler


def tick(session: Session, playing: bool, *values):
    """One autoplay tick: exactly one engine step; stops the timer at the end or on an error."""
    if not playing:
        return _ordered(session, {}) + (gr.Timer(active=False), gr.skip(), False)
    result = event(session, "step", *values)
    stop = session.decoder is None or session.decoder.next_stage == "done" or str(result[1]).startswith("⚠️")
    if stop:
        return result + (gr.Timer(active=False), gr.Button(value="▶ Play"), False)
    return result + (gr.skip(), gr.skip(), True)


def toggle_play(playing: bool):
    playing = not playing
    return gr.Timer(active=playing), gr.Button(value="⏸ Pause" if playing else "▶ Play"), playing


def default_controls(models, **overrides) -> Controls:
    """The measured defaults of the models' device, auto budget only where it is calibrated (dartree.defaults)."""
    shape = shape_for(models)
    named = {"width": shape["width"], "budget": shape["budget"], "candidates": shape["candidates"],
             "auto_budget": bool(shape.get("auto_budget"))}
    return Controls(**{**named, **overrides})


def canonical_session(models, controls: Controls | None = None) -> Session:
    """The example every visitor sees on first load: the default prompt, one real round, plain decoding timed.

    `DARTREE_EXAMPLE_TOKENS` overrides its max new tokens (the tests use a small value to start faster)."""
    session = new_session(models)
    if controls is None:
        tokens = int(os.environ.get("DARTREE_EXAMPLE_TOKENS", "0") or 0)
        controls = default_controls(models, **({"max_new_tokens": tokens} if tokens > 0 else {}))
    act(session, "round", controls)
    _plain_ar(session)
    session.message = (f"A first round on “{controls.prompt}” is already done, with every panel filled. Step through "
                       "the next one with Draft → Next depth → Prune → Verify → Commit, or press Play.")
    return session


def _drafter_banner(models) -> str:
    desc = models.drafter_description
    if desc.startswith("UNTRAINED"):
        return (f"<div class='dt-banner'>⚠️ <b>Drafter: {desc}.</b> Its guesses are random, so the target accepts "
                "almost none of them and no speed-up is expected; what you see is the real DARTree machinery "
                "(drafting, correction, pruning, verification) running on the real SmolLM2 target.</div>")
    return f"<div class='dt-banner dt-ok'>Drafter: {desc}</div>"


CSS = """
.dt-banner {background:#fff4d6;border:2px solid #e0a100;border-radius:8px;padding:10px 14px;font-size:15px;color:#3a2a00}
.dt-ok {background:#e8f6ea;border-color:#3aa655;color:#123d1c}
.dt-text {min-height:48px}
"""

EXPLAIN = """
**How a DARTree round works.** *Draft*: the block drafter reads the committed context once and proposes its top-C
tokens for each of the next D positions. *Next depth*: every node on the frontier takes those C candidates, the
correction head re-scores them for that node's own path, and only the global top-W of the whole depth survive.
*Prune*: the W-wide supertree is cut to the B nodes with the best path scores, across all depths at once
(deferred pruning). *Verify*: the target reads the whole tree in one forward pass with a tree attention mask, and
the longest path it agrees with is accepted, plus one bonus token of its own. *Commit*: those tokens are appended
and the cache keeps only the accepted path. At temperature 0 the output is exactly what plain decoding gives.
"""


def build_demo(models=None, initial: Session | None = None) -> gr.Blocks:
    """The Blocks app. `models` default to `load_models()`; `initial` to the canonical first round."""
    if models is None:
        from ..models.loading import load_models

        models = load_models()
    initial = initial or canonical_session(models)
    first = full_render(initial)
    c0 = initial.controls
    max_depth = models.drafter.max_depth if models.drafter is not None else 1
    race_first = figures.race_html([])
    sweep_first = sweep_outputs(None, models.drafter_description)

    with gr.Blocks(title="DARTree Explorer", analytics_enabled=False) as demo:
        state = gr.State(initial, time_to_live=3600)
        playing = gr.State(False)
        gr.Markdown("# DARTree Explorer\nHow DARTree speculative decoding builds a draft tree, prunes it and has the "
                    "target verify it in one pass, on a real model running on this machine.")
        gr.HTML(_drafter_banner(models))
        with gr.Tab("Explorer"):
            with gr.Row():
                with gr.Column(scale=1, min_width=280):
                    prompt = gr.Textbox(value=c0.prompt, label="Prompt", lines=3, max_lines=8, elem_id="prompt")
                    gr.Examples(examples=[[p] for p in EXAMPLE_PROMPTS], inputs=[prompt], label="Example prompts")
                    method = gr.Radio(list(METHOD_CHOICES), value=c0.method, label="Method", elem_id="method")
                    width = gr.Slider(1, 64, value=c0.width, step=1, label="Width W (kept per depth)")
                    budget = gr.Slider(1, 256, value=c0.budget, step=1, label="Budget B (nodes verified)")
                    auto_budget = gr.Checkbox(value=c0.auto_budget, elem_id="auto-budget",
                                              label="Auto budget: per round, the B with the most expected tokens/s "
                                                    "(dartree; the slider is then its cap)")
                    depth = gr.Slider(1, max_depth, value=c0.depth, step=1, label="Depth D")
                    candidates = gr.Slider(1, 128, value=c0.candidates, step=1, label="Candidates C per position")
                    temperature = gr.Slider(0.0, 1.5, value=c0.temperature, step=0.05, label="Temperature")
                    with gr.Row():
                        seed = gr.Number(value=c0.seed, precision=0, label="Seed", min_width=80)
                        max_new = gr.Slider(4, 256, value=c0.max_new_tokens, step=1, label="Max new tokens")
                    with gr.Row():
                        b_draft = gr.Button("Draft", variant="primary", elem_id="btn-draft", min_width=80)
                        b_depth = gr.Button("Next depth", variant="primary", elem_id="btn-depth", min_width=80)
                        b_prune = gr.Button("Prune", variant="primary", elem_id="btn-prune", min_width=80)
                    with gr.Row():
                        b_verify = gr.Button("Verify", variant="primary", elem_id="btn-verify", min_width=80)
                        b_commit = gr.Button("Commit", variant="primary", elem_id="btn-commit", min_width=80)
                        b_round = gr.Button("Next round", elem_id="btn-round", min_width=80)
                    with gr.Row():
                        b_play = gr.Button("▶ Play", elem_id="btn-play", min_width=80)
                        b_end = gr.Button("Run to end", elem_id="btn-end", min_width=80)
                        b_reset = gr.Button("Reset", variant="stop", elem_id="btn-reset", min_width=80)
                    b_measure = gr.Button("Time plain decoding", size="sm", elem_id="btn-measure")
                    gr.Markdown(EXPLAIN)
                with gr.Column(scale=3):
                    status = gr.Markdown(first["status"], label="Status", elem_id="status")
                    text = gr.HTML(first["text"], label="Generated text", elem_id="text")
                    with gr.Row():
                        draft_fig = gr.Plot(first["draft_fig"], label="Draft", show_label=False, elem_id="fig-draft")
                        correction_fig = gr.Plot(first["correction_fig"], label="Correction", show_label=False, elem_id="fig-correction")
                    supertree_fig = gr.Plot(first["supertree_fig"], label="Supertree", show_label=False, elem_id="fig-supertree")
                    with gr.Row():
                        with gr.Column(scale=3):
                            prune_fig = gr.Plot(first["prune_fig"], label="Pruning", show_label=False, elem_id="fig-prune")
                        with gr.Column(scale=2):
                            rank_fig = gr.Plot(first["rank_fig"], label="Ranked scores", show_label=False, elem_id="fig-rank")
                    with gr.Row():
                        with gr.Column(scale=2):
                            mask_fig = gr.Plot(first["mask_fig"], label="Attention mask", show_label=False, elem_id="fig-mask")
                        with gr.Column(scale=3):
                            verify_fig = gr.Plot(first["verify_fig"], label="Verification", show_label=False, elem_id="fig-verify")
                    speed_md = gr.Markdown(first["speed_md"], label="Speed summary", elem_id="speed")
                    with gr.Row():
                        speed_fig = gr.Plot(first["speed_fig"], label="Speed", show_label=False, elem_id="fig-speed")
                        timeline_fig = gr.Plot(first["timeline_fig"], label="Timeline", show_label=False, elem_id="fig-timeline")
                    with gr.Accordion("Trace of the round on show, and a JSON summary", open=False):
                        with gr.Row():
                            trace_fmt = gr.Radio(["json", "csv"], value="json", label="Format")
                            b_trace = gr.Button("Export round trace")
                            trace_file = gr.File(label="Trace file", interactive=False)
                        summary_json = gr.JSON(first["summary"], label="Summary")
            controls = [prompt, method, width, budget, depth, candidates, temperature, seed, max_new, auto_budget]
            outputs = [state, status, summary_json, draft_fig, supertree_fig, correction_fig, prune_fig, rank_fig,
                       mask_fig, verify_fig, text, speed_fig, timeline_fig, speed_md]
            for button, action in ((b_draft, "draft"), (b_depth, "depth"), (b_prune, "prune"), (b_verify, "verify"),
                                   (b_commit, "commit"), (b_round, "next_round"), (b_end, "run_to_end"),
                                   (b_reset, "reset"), (b_measure, "measure")):
                engine_action = {"next_round": "round", "run_to_end": "end"}.get(action, action)
                button.click(_handler(engine_action), [state] + controls, outputs, api_name=action,
                             show_progress="minimal")
            step_btn = gr.Button("step", visible=False)
            step_btn.click(_handler("step"), [state] + controls, outputs, api_name="step", show_progress="hidden")
            timer = gr.Timer(1.0, active=False)
            b_play.click(toggle_play, [playing], [timer, b_play, playing], api_visibility="private")
            timer.tick(tick, [state, playing] + controls, outputs + [timer, b_play, playing], show_progress="hidden",
                       trigger_mode="once", api_visibility="private")

            def on_trace(session, fmt):
                try:
                    return export_trace(session, fmt)
                except UserError as exc:
                    gr.Warning(str(exc))
                    return None

            b_trace.click(on_trace, [state, trace_fmt], [trace_file], api_name="trace")

        with gr.Tab("Race"):
            gr.Markdown("Plain decoding, chain, DDTree and DARTree on the same prompt and settings (from the Explorer "
                        "controls), taking one round each in turn so their texts stream side by side.")
            b_race = gr.Button("Start race", variant="primary", elem_id="btn-race")
            race_status = gr.Markdown("")
            race_box = gr.HTML(race_first)
            race_plot = gr.Plot(figures.race_figure([]), show_label=False)

            def on_race(*values):
                try:
                    controls_ = Controls.of(*values)
                    for lanes in race(models, controls_):
                        done = all(lane["finished"] for lane in lanes)
                        yield (figures.race_html(lanes), figures.race_figure(lanes),
                               "Finished." if done else "Racing… one round per method per turn.")
                except UserError as exc:
                    gr.Warning(str(exc))
                    yield gr.skip(), gr.skip(), f"⚠️ **{exc}**"

            b_race.click(on_race, controls, [race_box, race_plot, race_status], api_name="race")

        with gr.Tab("Sweep"):
            gr.Markdown("DARTree over a grid of widths W and budgets B on a few prompts: mean τ (tokens per round) and "
                        "mean speed-up over plain decoding, measured here. Results stay in this session.")
            with gr.Row():
                sw_w = gr.Textbox("2,4,8", label="W values")
                sw_b = gr.Textbox("8,16,32", label="B values")
                sw_n = gr.Slider(4, 64, value=16, step=1, label="Max new tokens per run")
            sw_p = gr.Textbox("\n".join(EXAMPLE_PROMPTS[1:3]), lines=3, label="Prompts (one per line)")
            b_sweep = gr.Button("Run sweep", variant="primary")
            sweep_status = gr.Markdown("")
            with gr.Row():
                tau_plot = gr.Plot(sweep_first[0], show_label=False)
                speed_plot = gr.Plot(sweep_first[1], show_label=False)
            sweep_table = gr.Dataframe(headers=["W", "B", "tau", "speedup"], value=[], interactive=False)

            def on_sweep(session, w, b, p, n, progress=gr.Progress()):
                try:
                    result = sweep(session, w, b, p, n, progress=progress)
                except UserError as exc:
                    gr.Warning(str(exc))
                    return (session, gr.skip(), gr.skip(), gr.skip(), f"⚠️ **{exc}**")
                tau_f, speed_f, rows = sweep_outputs(result, models.drafter_description)
                return session, tau_f, speed_f, rows, f"Swept {len(rows)} settings on {len(result['prompts'])} prompt(s)."

            b_sweep.click(on_sweep, [state, sw_w, sw_b, sw_p, sw_n], [state, tau_plot, speed_plot, sweep_table,
                                                                        sweep_status], api_name="sweep")
    return demo


def main():
    """`python app.py`: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT choose where it listens; DARTREE_THREADS pins
    torch's CPU threads (default: 1 on machines with two cores or fewer, where a second thread competing with
    other work slows the small target down several times; torch's own default elsewhere)."""
    import torch

    threads = int(os.environ.get("DARTREE_THREADS", "0") or 0)
    if threads <= 0 and (os.cpu_count() or 1) <= 2:
        threads = 1
    if threads > 0:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    demo = build_demo()
    print(f"[dartree] explorer ready in {time.perf_counter() - t0:.1f} s", flush=True)
    demo.queue(default_concurrency_limit=1, max_size=64)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), css=CSS, show_error=False,
                footer_links=["api"])
