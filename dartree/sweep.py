"""The (method, W, B) sweep: replayed acceptance for every configuration, speed from measured costs.

`run_sweep` measures this machine's cost curve, decodes a greedy continuation per prompt, replays
every configuration on those continuations (dartree.replay: exact τ at T = 0; at T > 0 on sampled
continuations, τ of the right distribution), optionally calibrates
the cost-aware budget on train prompts and replays it too, and times DARTree's batched tree build
against a sequential corrected heap. The predicted speed of a configuration is its committed tokens
over the sum of its rounds' costs (draft, tree, verify(nodes + 1), commit); `python -m dartree bench`
then measures the best configurations for real, interleaved, with outputs checked against plain decoding.

On a busy machine, `committed_costs` takes the cost curve and tree-build times of an earlier sweep or bench
run instead (`sweep --costs FILE`): τ stays exact, and the speeds are predicted from those quiet figures.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import json
from pathlib import Path

from . import TREE_METHODS
from .bench import (AUTO_BUDGET_CAP, KNOB_HEAD, BenchConfig, cost_curve, knob_cells, machine_info,
                    tree_build_comparison)
from .budget import AutoBudget, calibrate
from .engine import DecodeSettings
from .errors import UserError
from .methods import METHODS
from .replay import config_key, make_continuation, plain_outputs, replay, replayable, sweep
from .trace import STAGE_KEYS


def committed_costs(path) -> dict:
    """The cost curve of a committed sweep or bench JSON, plus its rows' tree-build seconds by shape."""
    path = Path(path)
    try:
        results = json.loads(path.read_text())
        costs = dict(results["cost_curve"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--costs: {path} is not a sweep or bench results file with a cost curve ({exc})") from None
    costs["tree_seconds"] = {config_key(r["method"], r["width"], r["budget"], r.get("retrieval")): r["tree_ms"] / 1e3
                             for r in results.get("rows", []) if "tree_ms" in r}
    costs["source"] = str(path)
    return costs


def run_sweep(models, prompts: list[str], configs: list[BenchConfig], base: DecodeSettings,
              calibration_prompts: list[str] | None = None, calibrate_out=None, progress: bool = True,
              costs: dict | None = None) -> dict:
    """`costs` (committed_costs) replaces this machine's cost curve and skips the tree-build timing."""
    target, drafter = models.target, models.drafter
    measure_here = costs is None
    costs = cost_curve(models, prompts[0]) if measure_here else costs
    pairs = plain_outputs(models, prompts, base.max_new_tokens, progress, base.temperature, base.top_p, base.seed)
    continuations = [make_continuation(target, drafter, ids, out) for ids, out in pairs]
    results = {"machine": machine_info(target), "drafter": models.drafter_description,
               "settings": {"max_new_tokens": base.max_new_tokens, "candidates": base.candidates, "depth": base.depth,
                            "temperature": base.temperature, "top_p": base.top_p, "seed": base.seed,
                            "n_prompts": len(prompts)},
               "cost_curve": costs}
    policy = None
    if calibration_prompts:
        widths = sorted({c.width for c in configs if c.method == "dartree" and c.width}) or [base.width]
        policy, calibration = calibrate_policy(models, calibration_prompts, base, costs, max(widths), progress)
        results["calibration"] = calibration
        if calibrate_out:
            policy.save(calibrate_out, extra={"target": target.name, "drafter": models.drafter_name,
                                              "temperature": base.temperature,
                                              "device": target.device.type, **calibration})
        configs = list(configs) + [BenchConfig("dartree", w, "auto") for w in widths]
    rows = sweep(models, continuations, configs, base, costs, progress, policy)
    results["replay_draft_seconds"] = statistics.median([t for c in continuations for t in c.draft_seconds])
    results["rows"] = rows
    results["tree_build"] = tree_build_comparison(models, prompts[0]) if measure_here else []
    return results


def best_configs(rows: list[dict]) -> list[BenchConfig]:
    """Each method's configuration with the highest predicted tokens/s in a sweep, ar first.

    `bench --best-of SWEEP.json` decodes these for real, so the speed table's per-method rows (each method at
    its best budget) comes from one named command. dartree's cost-aware budget, when the sweep replayed
    it, is kept as a separate entry, so that it is measured against the best fixed B in the same run.
    """
    best: dict = {}
    for r in rows:
        key = (r["method"], r["budget"] == "auto")
        if r["method"] != "ar" and (key not in best or r["predicted_tokens_per_second"] > best[key]["predicted_tokens_per_second"]):
            best[key] = r
    order = TREE_METHODS
    picked = sorted(best.values(), key=lambda r: (order.index(r["method"]), r["budget"] == "auto"))
    return [BenchConfig("ar", None, None)] + [BenchConfig(r["method"], r["width"], r["budget"], r.get("depth_bonus"),
                                                          r.get("retrieval"))
                                              for r in picked]


def calibrate_policy(models, prompts: list[str], base: DecodeSettings, costs: dict, width: int, progress=True):
    """P(on path | score) from W-wide supertrees replayed on train prompts, and the policy it gives."""
    target, drafter = models.target, models.drafter
    pairs = plain_outputs(models, prompts, base.max_new_tokens, progress, base.temperature, base.top_p, base.seed)
    settings = replace(base, method="dartree", width=width, budget=AUTO_BUDGET_CAP).resolved(target.device.type)
    if not replayable(settings):  # scores of the merged supertree with n-grams; the table needs real verifies
        raise UserError(f"the auto budget's calibration replays supertrees, and retrieval {settings.retrieval!r} "
                        "cannot be replayed: calibrate with --retrieval none or ngram")
    samples, tree_seconds, draft_seconds = [], [], []
    for ids, out in pairs:
        cont = make_continuation(target, drafter, ids, out)
        r = replay(target, drafter, cont, settings, keep_scores=True)
        samples += r.supertree_scores
        tree_seconds += r.tree_seconds
        draft_seconds += cont.draft_seconds
    cal = calibrate(samples)
    fixed = statistics.median(draft_seconds) + statistics.median(tree_seconds) + costs.get("commit_seconds", 0.0)
    policy = AutoBudget(cal["edges"], cal["rates"], fixed, costs["verify_seconds"], AUTO_BUDGET_CAP,
                        source=f"{len(prompts)} train prompts (the file's last), W={width}")
    return policy, {**cal, "fixed_seconds": fixed, "calibration_prompts": len(prompts), "calibration_width": width,
                    "calibration_retrieval": settings.retrieval,
                    "rounds": len(samples)}


def format_sweep(results: dict) -> str:
    head = (f"{'method':<14}{'W':>4}{'B':>6}{KNOB_HEAD}{'tau':>7}{'nodes':>7}{'tree ms':>9}"
            f"{'pred tok/s':>12}{'pred speedup':>14}")
    source = results["cost_curve"].get("source")
    lines = ([f"speeds predicted from the cost curve in {source}"] if source else []) + [head, "-" * len(head)]
    for r in results["rows"]:
        lines.append(f"{r['method']:<14}{r['width'] or '':>4}{r['budget'] or '':>6}{knob_cells(r)}{r['tau']:>7.2f}"
                     f"{r['mean_nodes']:>7.1f}"
                     f"{r['tree_ms']:>9.1f}{r['predicted_tokens_per_second']:>12.2f}{r['predicted_speedup']:>14.2f}")
    lines += ["", "tree build (s): B, W, batched, sequential heap, ratio"]
    for t in results.get("tree_build", []):
        lines.append(f"  B={t['budget']:<5} W={t['width']:<4} {t['batched_seconds']:.4f} {t['sequential_seconds']:.4f} "
                     f"{t['ratio']:.1f}x")
    return "\n".join(lines)


def write_plot(results: dict, path) -> None:
    """An HTML page: τ and predicted speedup of dartree over (W, B), τ against B per method, the cost curve."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = results["rows"]
    dart = [r for r in rows if r["method"] == "dartree" and r["budget"] != "auto"]
    widths = sorted({r["width"] for r in dart})
    budgets = sorted({r["budget"] for r in dart})
    cell = {(r["width"], r["budget"]): r for r in dart}
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "dartree τ over (W, B)", "dartree predicted speedup vs AR over (W, B)",
        "τ against budget B (dartree: best W)", "verify cost t_verify(N) / t_AR"))
    for col, key in ((1, "tau"), (2, "predicted_speedup")):
        z = [[cell.get((w, b), {}).get(key) for b in budgets] for w in widths]
        fig.add_trace(go.Heatmap(z=z, x=[str(b) for b in budgets], y=[str(w) for w in widths], colorscale="Viridis",
                                 text=[[f"{v:.2f}" if v is not None else "" for v in row] for row in z],
                                 texttemplate="%{text}", showscale=False), row=1, col=col)
        fig.update_xaxes(title_text="B", row=1, col=col)
        fig.update_yaxes(title_text="W", row=1, col=col)
    for method in TREE_METHODS:
        pts = {}
        for r in rows:
            if r["method"] == method and r["budget"] != "auto":
                b = r["budget"] or 0
                if b not in pts or r["tau"] > pts[b]:
                    pts[b] = r["tau"]
        if pts:
            xs = sorted(pts)
            fig.add_trace(go.Scatter(x=xs, y=[pts[x] for x in xs], mode="lines+markers", name=METHODS[method].label),
                          row=2, col=1)
    fig.update_xaxes(title_text="B", row=2, col=1)
    fig.update_yaxes(title_text="τ (tokens per round)", row=2, col=1)
    curve = results["cost_curve"]
    ns = sorted(int(n) for n in curve["verify_seconds"])
    t_ar = curve["t_ar"]
    fig.add_trace(go.Scatter(x=ns, y=[curve["verify_seconds"][n if n in curve["verify_seconds"] else str(n)] / t_ar
                                      for n in ns], mode="lines+markers", name="t_verify / t_AR"), row=2, col=2)
    fig.update_xaxes(title_text="N tree tokens", type="log", row=2, col=2)
    s = results["settings"]
    fig.update_layout(height=850, width=1150, title=f"DARTree sweep: {s['n_prompts']} prompts, {s['max_new_tokens']} "
                      f"new tokens, T = {s.get('temperature', 0.0):g} — {results['drafter']}")
    fig.write_html(str(path), include_plotlyjs="cdn")


def card_section(results: dict, budgets=(16, 32, 64)) -> list[str]:
    """The training card's tree-τ section: τ per method at B in `budgets` and each stage's wall time."""
    from .replay import interpolate_verify

    rows = results["rows"]

    def best(method, b):
        cands = [r for r in rows if r["method"] == method and (r["budget"] == b or method == "chain")]
        return max(cands, key=lambda r: r["tau"]) if cands else None

    costs = results["cost_curve"]
    s = results["settings"]
    body = [f"Replayed on {s['n_prompts']} dev prompts, {s['max_new_tokens']} new tokens, "
            f"T = {s.get('temperature', 0.0):g}, with the "
            f"command `{results.get('command', 'python -m dartree sweep')}`. τ = tokens committed per round "
            "(accepted + bonus). dartree: the best W for each B.", "",
            "| method | " + " | ".join(f"B = {b}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
    for method in TREE_METHODS:
        cells = []
        for b in budgets:
            r = best(method, b)
            width = f" (W={r['width']})" if r is not None and "W" in METHODS[method].knobs else ""
            cells.append("—" if r is None else f"{r['tau']:.2f}{width}")
        body.append(f"| {METHODS[method].label} | " + " | ".join(cells) + " |")
    body += ["", "Stage wall times on this machine (medians; verify from the measured cost curve):", "",
             f"- draft (one drafter pass, D = {s.get('depth') or 7}, C = {s['candidates']}): "
             f"{1e3 * results['replay_draft_seconds']:.1f} ms",
             f"- plain decoding step t_AR: {1e3 * costs['t_ar']:.1f} ms"]
    for b in budgets:
        r = best("dartree", b)
        tree = f", tree build {r['tree_ms']:.1f} ms (W={r['width']})" if r else ""
        body.append(f"- B = {b}: verify {1e3 * interpolate_verify(costs, b + 1):.1f} ms{tree}")
    body.append(f"- commit: {1e3 * costs.get('commit_seconds', 0.0):.1f} ms")
    return body


def write_bench_plot(results: dict, path) -> None:
    """An HTML page for a real benchmark run: speedup and τ per configuration, and each round's time split."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = results["rows"]
    labels = [" ".join(x for x in (r["method"], f"W={r['width']}" if r["width"] else "",
                                   f"B={r['budget']}" if r["budget"] else "") if x) for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("measured speedup vs plain decoding (τ on the bars)",
                                                        "share of a round's time by stage"))
    fig.add_trace(go.Bar(x=labels, y=[r["speedup_vs_ar"] for r in rows], text=[f"τ {r['tau']:.2f}" for r in rows],
                         textposition="outside", name="speedup", showlegend=False), row=1, col=1)
    for stage in STAGE_KEYS:
        fig.add_trace(go.Bar(x=labels, y=[100 * r["stage_share"][stage] for r in rows], name=stage), row=1, col=2)
    fig.update_layout(barmode="stack", height=520, width=1200,
                      title=f"DARTree bench: {results['settings']['n_prompts']} prompts, "
                            f"{results['settings']['max_new_tokens']} new tokens, "
                            f"T = {results['settings'].get('temperature', 0.0):g} — {results['drafter']}")
    fig.update_yaxes(title_text="× plain decoding", row=1, col=1)
    fig.update_yaxes(title_text="% of round time", row=1, col=2)
    fig.write_html(str(path), include_plotlyjs="cdn")
