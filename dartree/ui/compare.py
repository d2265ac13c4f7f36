"""The Race and Sweep tabs: several decoders on the same prompt, measured on this machine.

`race` streams the methods side by side, one round each in turn; `sweep` runs DARTree over a W × B grid.
Both are plain Python on the real engine (no Gradio), sharing the Explorer's controls and engine lock.
"""

from __future__ import annotations

from dataclasses import replace

from .. import TREE_METHODS
from ..methods import METHODS
from ..engine import Decoder, generate
from ..errors import UserError
from . import figures
from .session import ENGINE_LOCK, Controls, Session, budget_policy

RACE_METHODS = tuple(name for name, m in METHODS.items() if m.in_race)


def race(models, controls: Controls, methods=RACE_METHODS):
    """Generator: every method decodes the same prompt, one round each in turn; yields the lanes."""
    target = models.target
    prompt_ids = target.chat_ids(controls.prompt)
    decoders = []
    for method in methods:
        settings = replace(controls.settings(), method=method, auto_budget=controls.auto_budget and METHODS[method].auto_budget)
        decoders.append(Decoder(target, models.drafter if method in TREE_METHODS else None, prompt_ids, settings,
                                budget_policy(models, settings)))

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
    """DARTree over a W × B grid on a few prompts: mean τ and mean speed-up over plain decoding. The other
    settings (depth, candidates, temperature, seed, depth bonus) are the Explorer's."""
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
    base = replace((session.controls or Controls()).settings(), method="dartree", auto_budget=False,
                   max_new_tokens=max_new_tokens)
    total = len(prompts) * (1 + len(widths) * len(budgets))
    done = 0

    def tick(desc):
        if progress is not None:
            progress((done, total), desc=desc)

    baselines = []
    for p in prompts:
        tick(f"plain decoding: {p[:30]}")
        baselines.append(session.plain_decoding(p, max_new_tokens, base.temperature, base.seed))
        done += 1
    tau = [[None] * len(budgets) for _ in widths]
    speedup = [[None] * len(budgets) for _ in widths]
    rows = []
    for i, w in enumerate(widths):
        for j, b in enumerate(budgets):
            taus, ratios = [], []
            for p, ar in zip(prompts, baselines):
                tick(f"W={w}, B={b}: {p[:30]}")
                with ENGINE_LOCK:
                    r = generate(target, models.drafter, target.chat_ids(p), replace(base, width=w, budget=b))
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
    """(τ figure, speed-up figure, table rows) of a sweep's result (empty panels before the first)."""
    if not result:
        return (figures.grid_figure("τ (tokens per round)", [], [], []),
                figures.grid_figure("speed-up over plain decoding", [], [], []), [])
    w, b = result["widths"], result["budgets"]
    note = " (UNTRAINED drafter)" if drafter_description.startswith("UNTRAINED") else ""
    return (figures.grid_figure(f"τ: mean tokens per round{note}", w, b, result["tau"]),
            figures.grid_figure(f"speed-up over plain decoding{note}", w, b, result["speedup"], colorscale="RdBu"),
            [[r["W"], r["B"], r["tau"], r["speedup"]] for r in result["rows"]])
