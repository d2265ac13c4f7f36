"""The drafter's training card (``TRAINING.md`` beside the export): written from facts, with an SVG chart.

Sections can be replaced later (tree τ from the decoding engine, a resumed run's legs), and a retrain keeps
the recipe's measurement sections (:data:`KEPT_CARD_SECTIONS`).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
from pathlib import Path


def git_commit(repo: Path) -> str:
    """HEAD's hash, or why there is none (a copy of the tree outside a git checkout, or a checkout with no commit)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout, or no commit yet)"


def short_commit(commit: str) -> str:
    """A hash cut to 10 characters; anything else (git_commit's reason) as it is."""
    return commit[:10] if re.fullmatch(r"[0-9a-f]{40}", commit) else commit


def write_card(folder: Path, *, command: str, repo: Path, preset: str, preset_config: dict, data: dict,
               train_summary: dict, eval_results: dict, steps: int, wall_seconds: float,
               extra: dict | None = None) -> Path:
    """Write ``TRAINING.md`` beside the exported drafter, from facts only (nothing typed by hand).

    `eval_results` maps a section name to a dict of results (e.g. ``{"teacher_forced_chain": {...},
    "tree_tau_dev": {...}}``), so later evaluations (tree τ from the decoding engine) can be added by
    calling this again with more entries.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Drafter training card: `{preset}`",
        "",
        f"Written by `dartree.train` on {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
        "## Reproduce",
        "",
        "```",
        command,
        "```",
        "",
        f"- git commit: `{git_commit(repo)}`",
        f"- steps: {steps}",
        f"- wall time: {wall_seconds / 60:.1f} min",
        "",
        "## Data",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in data.items()]
    lines += ["", "## Losses (mean of the first / last 50 steps)", ""]
    lines += [f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in train_summary.items()]
    lines += ["", "## Evaluation", ""]
    for name, res in eval_results.items():
        lines += [f"### {name}", ""]
        if isinstance(res, dict) and "acc_base" in res:
            K1 = len(res["acc_base"])
            lines += ["| position | " + " | ".join(str(k + 1) for k in range(K1)) + " |",
                      "|---|" + "---|" * K1,
                      "| top-1 base | " + " | ".join(f"{a:.3f}" for a in res["acc_base"]) + " |",
                      "| top-1 corrected | " + " | ".join(f"{a:.3f}" for a in res["acc_corr"]) + " |", ""]
            rest = {k: v for k, v in res.items() if k not in ("acc_base", "acc_corr")}
        else:
            rest = res if isinstance(res, dict) else {"value": res}
        lines += [f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in rest.items()]
        lines.append("")
    lines += ["## Configuration", "", "```json", json.dumps(preset_config, indent=1), "```", ""]
    if extra:
        lines += ["## Notes", ""] + [f"- {k}: {v}" for k, v in extra.items()] + [""]
    path = folder / "TRAINING.md"
    path.write_text("\n".join(lines))
    return path


def label_tokens_seen(step: int, cfg, block_size: int) -> int:
    """Training label tokens consumed by `step` steps (blocks x (K - 1) positions)."""
    return int(step * cfg.seqs_per_step * cfg.anchors_per_seq * (block_size - 1))


def training_curve_section(history: dict, cfg, block_size: int, folder: Path) -> list[str]:
    """The card's τ-against-training-tokens table, with its SVG chart written beside the card."""
    rows = [(label_tokens_seen(e["step"], cfg, block_size), e["step"], e["tau_base"], e["tau_corr"], e["acc_corr"][0])
            for e in history.get("eval", [])]
    if not rows:
        return []
    svg = svg_line_chart({"corrected (with the GRU head)": [(t, c) for t, _, _, c, _ in rows],
                          "base (marginals)": [(t, b) for t, _, b, _, _ in rows]},
                         "training label tokens seen", "chain τ (teacher-forced)", "Held-out chain τ during training")
    (Path(folder) / "tau_vs_tokens.svg").write_text(svg)
    body = ["Periodic held-out evaluations (bf16 autocast, like training). More tokens seen = more steps over",
            "the same data set; the slope at the end is what more training would buy.", "",
            "![chain τ against training tokens](tau_vs_tokens.svg)", "",
            "| step | label tokens seen | chain τ base | chain τ corrected | top-1 @1 corrected |", "|---|---|---|---|---|"]
    body += [f"| {s} | {t:,} | {b:.3f} | {c:.3f} | {a:.3f} |" for t, s, b, c, a in rows]
    return body


def svg_line_chart(series: dict, x_label: str, y_label: str, title: str, width: int = 560, height: int = 320) -> str:
    """A dependency-free SVG line chart (a markdown card can show it; plotly cannot be embedded there)."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return ""
    x0, x1 = 0.0, max(p[0] for p in pts) or 1.0
    y0, y1 = min(1.0, min(p[1] for p in pts)), max(p[1] for p in pts) * 1.1 or 1.0
    L, R, T, B = 60, 20, 40, 50
    sx = lambda x: L + (x - x0) / (x1 - x0) * (width - L - R)  # noqa: E731
    sy = lambda y: height - B - (y - y0) / (y1 - y0) * (height - T - B)  # noqa: E731
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{height - B}" x2="{width - R}" y2="{height - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{height - B}" stroke="black"/>',
           f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">{x_label}</text>',
           f'<text x="16" y="{height / 2}" text-anchor="middle" transform="rotate(-90 16 {height / 2})">{y_label}</text>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        out.append(f'<text x="{L - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
        out.append(f'<text x="{sx(xv):.1f}" y="{height - B + 16}" text-anchor="middle">{xv / 1e6:.2f}M</text>')
    for k, (name, s) in enumerate(series.items()):
        c = colours[k % len(colours)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(s))
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>' for x, y in s]
        out.append(f'<text x="{L + 10}" y="{T + 14 + 16 * k}" fill="{c}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)


# Sections a retrain carries over from the old card: measurements about the recipe, not this checkpoint.
# ("Tree τ on dev prompts" is not kept: it belongs to the old weights, and `sweep --card` rewrites it.)
# "Compute budget" covers the whole recipe: data generation and feature passes run in other processes,
# so the trainer cannot write it alone.
KEPT_CARD_SECTIONS = ("Measured choices", "Compute budget")


def _section_span(lines: list[str], title: str) -> tuple[int, int] | None:
    """(index of the `## title` line, index of the next `## ` line or the end), or None if absent."""
    head = f"## {title}"
    if head not in lines:
        return None
    start = lines.index(head)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def read_card_sections(card: Path, titles) -> dict[str, list[str]]:
    """The bodies of the `## title` sections of an existing card (missing card or section: left out)."""
    card = Path(card)
    if not card.is_file():
        return {}
    lines = card.read_text().splitlines()
    found = {}
    for title in titles:
        span = _section_span(lines, title)
        if span is not None:
            body = lines[span[0] + 1:span[1]]
            while body and not body[0].strip():
                body = body[1:]
            while body and not body[-1].strip():
                body = body[:-1]
            found[title] = body
    return found


def _thousands(n) -> str:
    return f"{n:,}" if isinstance(n, int) else ""


def history_section(history: dict) -> list[str]:
    """The legs of a run resumed across sessions (history["phases"]), one table row each."""
    legs = history.get("phases") or []
    if not legs:
        return []
    body = ["The run was trained in legs (each resumes the previous checkpoint: weights, optimizer, sampler).",
            "The learning rate and the base-loss weight are functions of (step, --steps), so running these",
            "commands in order, each on the data shards it names, reproduces the run. \"Shards read\" counts every",
            "shard a leg loaded: its window, the held-out shard and those of --also-data.", "",
            "| steps | --steps | shards read | train sequences | response tokens | commit | command |",
            "|---|---|---|---|---|---|---|"]
    for leg in legs:
        commit = short_commit(str(leg.get("commit", "")))
        body.append(f"| {leg['from_step']}-{leg['to_step']} | {leg.get('schedule_steps', '')} | {leg.get('shards', '')} "
                    f"| {leg.get('train_sequences', '')} | {_thousands(leg.get('response_tokens'))} | `{commit}` "
                    f"| `{leg.get('command', '')}` |")
    notes = [leg["note"] for leg in legs if leg.get("note")]
    if notes:
        body += [""] + [f"- {n}" for n in notes]
    return body


def replace_card_section(card: Path, title: str, body: list[str]) -> None:
    """Put a `## title` section into the card (replacing one of the same title): for results that come
    later than training, such as tree τ from the decoding engine."""
    card = Path(card)
    lines = card.read_text().splitlines()
    head = f"## {title}"
    span = _section_span(lines, title)
    if span is not None:
        lines = lines[:span[0]] + lines[span[1]:]
    cut = next((i for i, line in enumerate(lines) if line == "## Configuration"), len(lines))
    lines = lines[:cut] + [head, ""] + body + [""] + lines[cut:]
    card.write_text("\n".join(lines) + "\n")
