"""The Race and Sweep tabs: several decoders on the same prompt, measured on this machine.

`race` times every method as whole runs (dartree.timing, as `bench` does), then replays their texts side by
side on one clock; `sweep` replays DARTree over a W × B grid: exact τ, and speeds predicted from the committed
cost curve. Both are plain Python on the real engine (no Gradio), sharing the Explorer's controls and engine lock.
"""

from __future__ import annotations

import time
from dataclasses import replace

from .. import timing
from ..bench import BenchConfig, cost_curve
from ..methods import METHODS
from ..replay import make_continuation, plain_outputs
from ..replay import sweep as replay_sweep
from ..sweep import committed_costs
from ..errors import UserError
from . import figures
from .reference import BENCH_DIR
from .session import ENGINE_LOCK, Controls, Session, budget_policy, each_method

COSTS = {"cpu": BENCH_DIR / "sweep-cpu.json"}  # device type -> a committed sweep with its cost curve
RACE_METHODS = tuple(name for name, m in METHODS.items() if m.in_race)


RACE_NOTE = ("How it was measured: every method decodes the prompt as whole runs, one after another, "
             f"{timing.UI_REPEATS} runs each in turn, warm (dartree.timing, as `bench` does), so no decoder slows "
             "another; tokens/s and the ratio to plain decoding come from those runs. The texts then replay each "
             "method's last run, round by round, on one clock at its real speed.")


def race(models, controls: Controls, methods=RACE_METHODS, pace: bool = True):
    """Generator of lanes (one dict per method): empty lanes first, then, once every method has been timed
    as whole runs (dartree.timing), the texts growing on one clock from each run's real round timings.
    `pace` sleeps between frames so the replay runs at real speed."""
    target = models.target
    prompt_ids = target.chat_ids(controls.prompt)
    base = controls.settings()
    settings = each_method(base, methods)
    yield [_lane(m, "", 0, 0, None) for m in methods]
    with ENGINE_LOCK:
        runs = timing.alternate(target, models.drafter, prompt_ids, settings, budget_policy(models, base),
                                timing.UI_REPEATS)
    ar = timing.tokens_per_second(runs[methods.index("ar")]) if "ar" in methods else None
    clocks = [_clock(r[-1]) for r in runs]  # (seconds at the end of each round, tokens by then)
    end = max(c[-1][0] for c in clocks)
    frames = max(8, min(40, len(max(clocks, key=len))))
    for k in range(1, frames + 1):
        t = end * k / frames
        lanes = []
        for m, r, clock in zip(methods, runs, clocks):
            done = [(s, n) for s, n in clock if s <= t + 1e-12]
            tps = timing.tokens_per_second(r)
            lanes.append(_lane(m, target.decode(r[-1].token_ids[:done[-1][1]]), done[-1][1], len(done) - 1,
                               {"tps": tps, "tau": timing.mean_tau(r), "ratio": tps / ar if ar else None,
                                "runs": len(r)},
                               finished=len(done) == len(clock)))
        yield lanes
        if pace and k < frames:
            time.sleep(end / frames)


def _clock(run) -> list[tuple[float, int]]:
    """(decode seconds elapsed, tokens committed) after the prefill and after each round of a run."""
    points, seconds, tokens = [(0.0, 1)], 0.0, 1
    for rec in run.round_records:
        seconds += sum(rec.seconds.values())
        tokens += rec.committed
        points.append((seconds, tokens))
    return points


def _lane(method: str, text: str, tokens: int, rounds: int, measured: dict | None, finished: bool = False) -> dict:
    m = measured or {}
    return {"method": method, "text": text, "tokens": tokens, "rounds": rounds, "tau": m.get("tau", 0.0),
            "tps": m.get("tps", 0.0), "ratio": m.get("ratio"), "runs": m.get("runs", 0), "finished": finished}


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
    """DARTree over a W × B grid on a few prompts, replayed (dartree.replay): mean τ, exact at T = 0, and the mean
    speed-up over plain decoding PREDICTED from a cost curve (`sweep_costs`). The other settings (depth,
    candidates, seed, depth bonus) are the Explorer's; the temperature is 0, where replay is exact."""
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
    if models.drafter is None:
        raise UserError("the sweep replays DARTree, which needs a drafter")
    base = replace((session.controls or Controls()).settings(), method="dartree", auto_budget=False,
                   max_new_tokens=max_new_tokens, temperature=0.0)
    total, done = 2 + len(widths) * len(budgets), 0

    def tick(desc):
        if progress is not None:
            progress((done, total), desc=desc)

    tick("the cost curve")
    with ENGINE_LOCK:
        costs = sweep_costs(models, prompts[0])
        done += 1
        tick("plain decoding of the prompts")
        conts = [make_continuation(target, models.drafter, ids, out)
                 for ids, out in plain_outputs(models, prompts, max_new_tokens, progress=False)]
    done += 1
    tau = [[None] * len(budgets) for _ in widths]
    speedup = [[None] * len(budgets) for _ in widths]
    rows = []
    for i, w in enumerate(widths):
        for j, b in enumerate(budgets):
            tick(f"W={w}, B={b}")
            with ENGINE_LOCK:
                row = replay_sweep(models, conts, [BenchConfig("dartree", w, b)], base, costs, progress=False)[0]
            tau[i][j], speedup[i][j] = row["tau"], row["predicted_speedup"]
            rows.append({"W": w, "B": b, "tau": round(tau[i][j], 3), "speedup": round(speedup[i][j], 3)})
            done += 1
    tick("done")
    session.sweep = {"widths": widths, "budgets": budgets, "tau": tau, "speedup": speedup, "rows": rows,
                     "prompts": prompts, "max_new_tokens": max_new_tokens, "costs": costs.get("source", "measured now")}
    return session.sweep


def sweep_costs(models, prompt: str) -> dict:
    """The cost curve the sweep predicts speed from: the committed one measured on this kind of device
    (COSTS, quiet-machine figures: a busy machine's own would mislead), else measured here now."""
    path = COSTS.get(models.target.device.type)
    if path is None or not path.exists():
        return cost_curve(models, prompt)
    return dict(committed_costs(path), source=str(path.relative_to(BENCH_DIR.parents[1])))


def sweep_outputs(result: dict | None, drafter_description: str):
    """(τ figure, speed-up figure, table rows) of a sweep's result (empty panels before the first)."""
    if not result:
        return (figures.grid_figure("τ (tokens per round), replayed", [], [], []),
                figures.grid_figure("PREDICTED speed-up over plain decoding", [], [], []), [])
    w, b = result["widths"], result["budgets"]
    note = " (UNTRAINED drafter)" if drafter_description.startswith("UNTRAINED") else ""
    return (figures.grid_figure(f"τ: mean tokens per round, replayed{note}", w, b, result["tau"]),
            figures.grid_figure(f"PREDICTED speed-up over plain decoding{note}", w, b, result["speedup"],
                                colorscale="RdBu"),
            [[r["W"], r["B"], r["tau"], r["speedup"]] for r in result["rows"]])
