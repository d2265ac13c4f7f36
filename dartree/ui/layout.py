"""The explorer's Gradio Blocks: where each control and panel sits, and the thin glue that binds them.

Controls and outputs are components kept in dicts by name. Every control is a field of
`session.Controls` and reaches the handlers as a keyword argument (`inputs_kwargs`); every output is a
name of `panels.OUTPUTS` and handlers return `{component: value}` for the ones they changed. So no list
has to follow another's order, and a control or panel without its counterpart fails at build time.
"""

from __future__ import annotations

from dataclasses import fields

import gradio as gr

from .. import TREE_METHODS
from ..engine import MAX_CONTINUITY, MIN_DEPTH_BONUS
from ..methods import METHODS
from ..errors import UserError
from ..models.loading import load_models
from ..retrieval import RETRIEVAL_MODES
from . import figures
from .compare import RACE_NOTE, race, sweep, sweep_outputs
from .panels import OUTPUTS, full_render
from .session import (EXAMPLES, SHAPE_CONTROLS, WARNING, Controls, Session, canonical_session, event, export_trace,
                      follow_temperature)

METHOD_CHOICES = tuple(reversed(TREE_METHODS))  # the richest first
STAGE_BUTTONS = (("Draft", "draft"), ("Next depth", "depth"), ("Prune", "prune"), ("Verify", "verify"),
                 ("Commit", "commit"))  # (label, engine action)
PLOT_MIN_WIDTH = 400  # px: two panels side by side from about 1280 px of window, one above the other below
API_NAMES = {"round": "next_round", "end": "run_to_end"}  # the endpoints named otherwise than their action

CSS = """
.dt-banner {background:#fff4d6;border:2px solid #e0a100;border-radius:8px;padding:10px 14px;font-size:15px;color:#3a2a00}
.dt-ok {background:#e8f6ea;border-color:#3aa655;color:#123d1c}
.dt-text {min-height:48px}
.info-text {color:#4a4a4a !important}
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


def drafter_banner(models) -> str:
    desc = models.drafter_description
    if desc.startswith("UNTRAINED"):
        return (f"<div class='dt-banner'>⚠️ <b>Drafter: {desc}.</b> Its guesses are random, so the target accepts "
                "almost none of them and no speed-up is expected; what you see is the real DARTree machinery "
                "(drafting, correction, pruning, verification) running on the real SmolLM2 target.</div>")
    return f"<div class='dt-banner dt-ok'>Drafter: {desc}</div>"


# ---------------------------------------------------------------------------------------- glue
def tick(session: Session, playing: bool, **values) -> dict:
    """One autoplay tick: exactly one engine step; stops the timer at the end or on an error. Named outputs,
    with "timer", "play" (the button) and "playing"."""
    if not playing:
        return {"timer": gr.Timer(active=False), "playing": False}
    out = event(session, "step", **values)
    if session.decoder is None or session.decoder.next_stage == "done" or WARNING in out:
        return out | {"timer": gr.Timer(active=False), "play": gr.Button(value="▶ Play"), "playing": False}
    return out | {"playing": True}


def toggle_play(playing: bool) -> dict:
    playing = not playing
    return {"timer": gr.Timer(active=playing), "play": gr.Button(value="⏸ Pause" if playing else "▶ Play"),
            "playing": playing}


def _bind(out: dict, components: dict) -> dict:
    """Named outputs -> {component: value}; a WARNING becomes a toast."""
    if WARNING in out:
        gr.Warning(out.pop(WARNING))
    return {components[name]: value for name, value in out.items()}


def _check(kind: str, have, want) -> None:
    if set(have) != set(want):
        raise RuntimeError(f"{kind}: the layout has {sorted(set(have) - set(want))} too many and lacks "
                           f"{sorted(set(want) - set(have))}")


# ---------------------------------------------------------------------------------------- layout
def build_demo(models=None, initial: Session | None = None) -> gr.Blocks:
    """The Blocks app. `models` default to `load_models()`; `initial` to the canonical first round."""
    models = load_models() if models is None else models
    initial = initial or canonical_session(models)
    first = full_render(initial)
    c0 = initial.controls
    max_depth = models.drafter.max_depth if models.drafter is not None else 1

    with gr.Blocks(title="DARTree Explorer", analytics_enabled=False) as demo:
        state = gr.State(initial, time_to_live=3600)
        playing = gr.State(False)
        gr.Markdown("# DARTree Explorer\nHow DARTree speculative decoding builds a draft tree, prunes it and has the "
                    "target verify it in one pass, on a real model running on this machine.")
        gr.HTML(drafter_banner(models))
        controls, out = {}, {}
        with gr.Tab("Explorer"):
            with gr.Row():
                with gr.Column(scale=1, min_width=280):
                    controls["prompt"] = gr.Textbox(value=c0.prompt, label="Prompt", lines=3, max_lines=8,
                                                    elem_id="prompt")
                    gr.Examples(examples=[[e["prompt"]] for e in EXAMPLES], inputs=[controls["prompt"]],
                                example_labels=[e["label"] for e in EXAMPLES],
                                label="Example prompts (one of each kind the dev sets measure)")
                    controls["method"] = gr.Radio(list(METHOD_CHOICES), value=c0.method, label="Method",
                                                  info=" · ".join(f"{m}: {METHODS[m].description}"
                                                                  for m in METHOD_CHOICES),
                                                  elem_id="method")
                    controls["width"] = gr.Slider(1, 64, value=c0.width, step=1, label="Width W (kept per depth)")
                    controls["budget"] = gr.Slider(1, 256, value=c0.budget, step=1, label="Budget B (nodes verified)")
                    controls["auto_budget"] = gr.Checkbox(
                        value=c0.auto_budget, elem_id="auto-budget",
                        label="Auto budget: per round, the B with the most expected tokens/s (dartree; the slider is "
                              "then its cap)")
                    controls["depth"] = gr.Slider(1, max_depth, value=c0.depth, step=1, label="Depth D")
                    controls["candidates"] = gr.Slider(1, 128, value=c0.candidates, step=1,
                                                       label="Candidates C per position")
                    controls["temperature"] = gr.Slider(0.0, 1.5, value=c0.temperature, step=0.05,
                                                        label="Temperature")
                    with gr.Row():
                        controls["seed"] = gr.Number(value=c0.seed, precision=0, label="Seed", min_width=80)
                        controls["max_new_tokens"] = gr.Slider(4, 256, value=c0.max_new_tokens, step=1,
                                                               label="Max new tokens")
                    with gr.Accordion("Advanced settings", open=False):
                        controls["depth_bonus"] = gr.Slider(
                            MIN_DEPTH_BONUS, 0.0, value=c0.depth_bonus, step=0.05, label="Depth bonus",
                            info="The top-B cut ranks nodes by path score + bonus × depth: below 0 favours "
                                 "shallow nodes", elem_id="depth-bonus")
                        controls["retrieval"] = gr.Radio(
                            list(RETRIEVAL_MODES), value=c0.retrieval, label="Retrieval branches",
                            info="dartree / dartree-fixed: chains looked up in the context (n-grams) or in the "
                                 "target's own recent successors (table) join the tree before the top-B cut",
                            elem_id="retrieval")
                        controls["continuity"] = gr.Slider(
                            0.0, MAX_CONTINUITY, value=c0.continuity, step=0.01, label="N-gram continuity weight",
                            info="dartree / dartree-fixed: each candidate's score adds weight × log P(token | the "
                                 "path's last two tokens), counted in the target's own training answers (DART's "
                                 "term); 0 is off", elem_id="continuity")
                    buttons = {}
                    with gr.Row():
                        for label, action in STAGE_BUTTONS[:3]:
                            buttons[action] = gr.Button(label, variant="primary", elem_id=f"btn-{action}",
                                                        min_width=80)
                    with gr.Row():
                        for label, action in STAGE_BUTTONS[3:]:
                            buttons[action] = gr.Button(label, variant="primary", elem_id=f"btn-{action}",
                                                        min_width=80)
                        buttons["round"] = gr.Button("Next round", elem_id="btn-round", min_width=80)
                    with gr.Row():
                        b_play = gr.Button("▶ Play", elem_id="btn-play", min_width=80)
                        buttons["end"] = gr.Button("Run to end", elem_id="btn-end", min_width=80)
                        buttons["reset"] = gr.Button("Reset", variant="stop", elem_id="btn-reset", min_width=80)
                    buttons["measure"] = gr.Button("Time whole runs (plain and this method)", size="sm",
                                                   elem_id="btn-measure")
                    gr.Markdown(EXPLAIN)
                with gr.Column(scale=3):
                    out["status"] = gr.Markdown(first["status"], label="Status", elem_id="status")
                    out["text"] = gr.HTML(first["text"], label="Generated text", elem_id="text")

                    def plot(name, label, elem):  # PLOT_MIN_WIDTH: pairs stack on a projector (1024 px)
                        out[name] = gr.Plot(first[name], label=label, show_label=False, elem_id=elem,
                                            min_width=PLOT_MIN_WIDTH)

                    with gr.Row():
                        plot("draft_fig", "Draft", "fig-draft")
                        plot("correction_fig", "Correction", "fig-correction")
                    plot("supertree_fig", "Supertree", "fig-supertree")
                    with gr.Row():
                        with gr.Column(scale=3, min_width=PLOT_MIN_WIDTH):
                            plot("prune_fig", "Pruning", "fig-prune")
                        with gr.Column(scale=2, min_width=PLOT_MIN_WIDTH):
                            plot("rank_fig", "Ranked scores", "fig-rank")
                    with gr.Row():
                        with gr.Column(scale=2, min_width=PLOT_MIN_WIDTH):
                            plot("mask_fig", "Attention mask", "fig-mask")
                        with gr.Column(scale=3, min_width=PLOT_MIN_WIDTH):
                            plot("verify_fig", "Verification", "fig-verify")
                    out["speed_md"] = gr.Markdown(first["speed_md"], label="Speed summary", elem_id="speed")
                    with gr.Row():
                        plot("speed_fig", "Speed", "fig-speed")
                        plot("timeline_fig", "Timeline", "fig-timeline")
                    with gr.Accordion("Trace of the round on show, and a JSON summary", open=False):
                        with gr.Row():
                            trace_fmt = gr.Radio(["json", "csv"], value="json", label="Format")
                            b_trace = gr.Button("Export round trace")
                            trace_file = gr.File(label="Trace file", interactive=False)
                        out["summary"] = gr.JSON(first["summary"], label="Summary")
            _check("controls", controls, [f.name for f in fields(Controls)])
            _check("outputs", out, OUTPUTS)
            timer = gr.Timer(1.0, active=False)
            named = dict(out, state=state, timer=timer, play=b_play, playing=playing)

            def stage(action):
                def handler(session, **values):
                    return _bind(event(session, action, **values) | {"state": session}, named)

                handler.__name__ = f"on_{action}"
                return handler

            outputs = [state] + [out[name] for name in OUTPUTS]  # the API returns them in OUTPUTS order
            for action, button in buttons.items():
                button.click(stage(action), [state], outputs, inputs_kwargs=controls, api_name=API_NAMES.get(action, action),
                             show_progress="minimal")
            step_btn = gr.Button("step", visible=False)
            step_btn.click(stage("step"), [state], outputs, inputs_kwargs=controls, api_name="step",
                           show_progress="hidden")
            b_play.click(lambda p: _bind(toggle_play(p), named), [playing], [timer, b_play, playing],
                         api_visibility="private")
            shape_controls = [controls[name] for name in SHAPE_CONTROLS]

            def on_temperature(temperature, *shape):  # the shape follows T where the visitor left it at a default
                followed = follow_temperature(models, temperature, **dict(zip(SHAPE_CONTROLS, shape)))
                return [followed[name] for name in SHAPE_CONTROLS]

            controls["temperature"].change(on_temperature, [controls["temperature"]] + shape_controls, shape_controls,
                                           api_visibility="private", show_progress="hidden")
            timer.tick(lambda session, p, **values: _bind(tick(session, p, **values) | {"state": session}, named),
                       [state, playing], list(named.values()), inputs_kwargs=controls, show_progress="hidden",
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
                        "controls). " + RACE_NOTE)
            b_race = gr.Button("Start race", variant="primary", elem_id="btn-race")
            race_status = gr.Markdown("")
            race_box = gr.HTML(figures.race_html([]))
            race_plot = gr.Plot(figures.race_figure([]), show_label=False)

            def on_race(**values):
                try:
                    for lanes in race(models, Controls.of(**values)):
                        if not any(lane["runs"] for lane in lanes):
                            status = "Timing whole runs of every method, one after another…"
                        elif all(lane["finished"] for lane in lanes):
                            status = ("Finished: tokens/s and ratios from whole runs; the texts replayed their "
                                      "real rounds.")
                        else:
                            status = "Replaying each method's real round timings on one clock…"
                        yield {race_box: figures.race_html(lanes), race_plot: figures.race_figure(lanes),
                               race_status: status}
                except UserError as exc:
                    gr.Warning(str(exc))
                    yield {race_status: f"⚠️ **{exc}**"}

            b_race.click(on_race, [], [race_box, race_plot, race_status], inputs_kwargs=controls, api_name="race")

        with gr.Tab("Sweep"):
            gr.Markdown("DARTree over a grid of widths W and budgets B on a few prompts, at temperature 0: mean τ "
                        "(tokens per round), exact, from replaying each setting on plain decoding's output, and the "
                        "mean speed-up over plain decoding **predicted** from the cost curve of this kind of machine "
                        "(`assets/benchmarks/sweep-cpu.json` on a CPU): predictions, not timings; the Explorer and "
                        "the Race time real runs. Results stay in this session.")
            with gr.Row():
                sw_w = gr.Textbox("2,4,8", label="W values")
                sw_b = gr.Textbox("8,16,32", label="B values")
                sw_n = gr.Slider(4, 64, value=16, step=1, label="Max new tokens per run")
            sw_p = gr.Textbox("\n".join(e["prompt"] for e in EXAMPLES if "\n" not in e["prompt"]), lines=3,
                              label="Prompts (one per line)")
            b_sweep = gr.Button("Run sweep", variant="primary")
            sweep_status = gr.Markdown("")
            tau_f, speed_f, rows = sweep_outputs(None, models.drafter_description)
            with gr.Row():
                tau_plot = gr.Plot(tau_f, show_label=False)
                speed_plot = gr.Plot(speed_f, show_label=False)
            sweep_table = gr.Dataframe(headers=["W", "B", "τ (replayed)", "predicted speed-up"], value=rows,
                                       interactive=False)

            def on_sweep(session, widths, budgets, prompts, max_new_tokens, progress=gr.Progress()):
                try:
                    result = sweep(session, widths, budgets, prompts, max_new_tokens, progress=progress)
                except UserError as exc:
                    gr.Warning(str(exc))
                    return {sweep_status: f"⚠️ **{exc}**"}
                tau_f, speed_f, rows = sweep_outputs(result, models.drafter_description)
                return {state: session, tau_plot: tau_f, speed_plot: speed_f, sweep_table: rows,
                        sweep_status: f"Replayed {len(rows)} settings on {len(result['prompts'])} prompt(s); speeds "
                                      f"predicted from {result['costs']}."}

            b_sweep.click(on_sweep, [state, sw_w, sw_b, sw_p, sw_n],
                          [state, tau_plot, speed_plot, sweep_table, sweep_status], api_name="sweep")
    return demo
