"""Plotly figures and HTML for the explorer, drawn from plain values only.

Every function here takes the plain lists and dicts that `dartree.ui.adapter` makes from trace
records (no tensors, no torch import), so figures can be built and tested without a model. Every
figure has an explicit height and fixed axis ranges, so panels keep their place while a round is
stepped through.
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from ..trace import STAGE_KEYS
from .adapter import NodeView

TREE_HEIGHT = 520
SMALL_HEIGHT = 320
MASK_HEIGHT = 480
ROUND_COLOURS = ("#cfe3ff", "#ffe0b8", "#d5f5d0", "#f9d0e4", "#e6dcff", "#fff3b0", "#cdeff2", "#f2d7c9")
ACCEPT = "#1b9e47"
REJECT = "#b7b7b7"
CUT = "#c9c9c9"
BONUS = "#f28e2b"
SCORE_SCALE = "Viridis"
MARGIN = dict(l=40, r=20, t=56, b=36)
# a node's marker by who proposed it (dartree.retrieval): retrieved nodes stand out in every tree panel
SOURCE_SYMBOLS = {"draft": "circle", "ngram": "diamond", "table": "square", "both": "star-diamond"}
PRUNED_SYMBOLS = {"draft": "x", "ngram": "diamond-open", "table": "square-open", "both": "star-diamond-open"}


def show_token(text: str, limit: int = 10) -> str:
    """A token's text made visible: spaces as ␣, newlines as ↵, cut to `limit` characters."""
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣")
    if not shown:
        shown = "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _esc(text: str) -> str:
    return html.escape(text.replace("\n", "\\n"))


def _base(title: str, height: int, **layout) -> go.Figure:
    fig = go.Figure()
    layout = {"margin": MARGIN, **layout}
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", font=dict(size=14)), height=height,
                      template="plotly_white", showlegend=False, hoverlabel=dict(align="left"), **layout)
    return fig


def placeholder(title: str, message: str, height: int = SMALL_HEIGHT) -> go.Figure:
    """An empty panel that says what will appear there and which button fills it."""
    fig = _base(title, height)
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#666"))
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0, 1])
    return fig


# ---------------------------------------------------------------------------------------- layout
def layered_layout(nodes: list[NodeView]) -> dict:
    """Positions {id: (x, y)}: one column per depth, each column spread evenly over [0, 1].

    Inside a column nodes follow their parents' order, then their own `order` (rank), so edges never
    cross and siblings stay together; labelled nodes get 2.5 times the room of faded cut candidates.
    Every node carries its depth and parents come before children, so the columns are a group-by on
    depth, filled from the root outwards (no graph library needed).
    """
    columns: dict[int, list[NodeView]] = {}
    for n in nodes:
        columns.setdefault(n.depth, []).append(n)
    slot, pos = {}, {}
    for depth in sorted(columns):
        column = sorted(columns[depth], key=lambda n: (slot.get(n.parent, 0), n.order))
        weights = [2.5 if n.survived else 1.0 for n in column]
        total, used = sum(weights), 0.0
        for i, (n, w) in enumerate(zip(column, weights)):
            slot[n.id] = i
            pos[n.id] = (depth, 1.0 - (used + w / 2) / total)
            used += w
    return pos


def _edges(nodes, pos, keep=lambda n: True):
    xs, ys = [], []
    for n in nodes:
        if n.parent is None or n.parent not in pos or n.id not in pos or not keep(n):
            continue
        (x0, y0), (x1, y1) = pos[n.parent], pos[n.id]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    return xs, ys


def _depth_axes(fig, max_depth: int, extra: float = 0.0):
    fig.update_xaxes(range=[-0.35, max_depth + 0.75 + extra], tickvals=list(range(max_depth + 1 + int(extra))),
                     ticktext=["root"] + [f"d{d}" for d in range(1, max_depth + 1 + int(extra))],
                     showgrid=False, zeroline=False, fixedrange=True)
    fig.update_yaxes(range=[-0.04, 1.06], visible=False, fixedrange=True)


def _node_hover(n: NodeView) -> str:
    parts = [f"<b>{_esc(n.text)}</b>  (id {n.token})", f"depth {n.depth}"]
    if n.rank is not None:
        parts.append(f"rank at this depth: {n.rank}")
    if n.marginal is not None:
        parts.append(f"marginal p: {n.marginal:.4f}")
    if n.corrected is not None:
        parts.append(f"corrected p: {n.corrected:.4f}")
    if n.continuity is not None:
        parts.append(f"n-gram continuity term: {n.continuity:+.3f}")
    parts.append(f"path score: {n.score:.3f}  (p = {math.exp(n.score):.3g})")
    if n.source != "draft":
        parts.append(f"proposed by: {n.source} (retrieved)" if n.source != "both" else "proposed by two sources")
    if not n.survived:
        parts.append("<i>cut by the global top-W at this depth</i>")
    return "<br>".join(parts)


def _size(p: float | None, lo: float = 9, hi: float = 26) -> float:
    return lo + (hi - lo) * math.sqrt(max(0.0, min(1.0, p if p is not None else 0.0)))


# ---------------------------------------------------------------------------------------- panels
def draft_figure(draft: dict | None) -> go.Figure:
    """The drafter's top candidates per future position, coloured by marginal log10 probability."""
    title = "1 · Draft: top candidates per future position (one drafter pass)"
    if not draft:
        return placeholder(title, "Press Draft: one drafter pass proposes candidates for all depths at once")
    probs = draft["probs"]
    z = [[math.log10(max(p, 1e-12)) for p in row] for row in probs]
    text = [[show_token(t, 8) for t in row] for row in draft["texts"]]
    hover = [[f"depth {d + 1}, top-{k + 1}: <b>{_esc(t)}</b> (id {tok})<br>marginal p = {p:.4g}"
              for k, (t, tok, p) in enumerate(zip(trow, krow, prow))]
             for d, (trow, krow, prow) in enumerate(zip(draft["texts"], draft["tokens"], probs))]
    fig = _base(title, SMALL_HEIGHT)
    fig.add_trace(go.Heatmap(z=z, text=text, texttemplate="%{text}", textfont=dict(size=11), customdata=hover,
                             hovertemplate="%{customdata}<extra></extra>", colorscale="Blues", zmin=-6, zmax=0,
                             colorbar=dict(title=dict(text="log10 p", side="right"), thickness=12)))
    rows, cols = len(z), len(z[0]) if z else 0
    fig.update_xaxes(tickvals=list(range(cols)), ticktext=[f"top-{k + 1}" for k in range(cols)],
                     range=[-0.5, cols - 0.5], fixedrange=True)
    fig.update_yaxes(tickvals=list(range(rows)), ticktext=[f"d{d + 1}" for d in range(rows)],
                     range=[rows - 0.5, -0.5], fixedrange=True)
    return fig


def supertree_figure(tree: dict | None) -> go.Figure:
    """The tree as it grows: survivors coloured by path score and sized by corrected probability;
    candidates cut by the global top-W at their depth are shown faded (a few per parent)."""
    title = "2 · Supertree: each depth keeps the global top-W children of its whole frontier"
    if not tree or not tree.get("nodes"):
        return placeholder(title, "Press Next depth to grow the tree one depth at a time", TREE_HEIGHT)
    nodes, max_depth = tree["nodes"], tree["max_depth"]
    pos = layered_layout(nodes)
    fig = _base(f"{title}<br><sup>{tree.get('caption', '')}</sup>", TREE_HEIGHT)
    cut = [n for n in nodes if not n.survived]
    alive = [n for n in nodes if n.survived]
    xs, ys = _edges(cut, pos)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#dddddd", width=1, dash="dot"),
                             hoverinfo="skip"))
    xs, ys = _edges(alive, pos)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#8a8a8a", width=1.4), hoverinfo="skip"))
    if cut:
        fig.add_trace(go.Scatter(
            x=[pos[n.id][0] for n in cut], y=[pos[n.id][1] for n in cut], mode="markers",
            marker=dict(color=CUT, size=[_size(n.corrected, 6, 14) for n in cut], opacity=0.55,
                        line=dict(width=0)),
            hovertext=[_node_hover(n) for n in cut], hoverinfo="text"))
    scores = [n.score for n in alive]
    lo = min(scores[1:]) if len(scores) > 1 else -1.0
    label = len(alive) <= 4 * (max_depth + 1) * 8
    fig.add_trace(go.Scatter(
        x=[pos[n.id][0] for n in alive], y=[pos[n.id][1] for n in alive],
        mode="markers+text" if label else "markers",
        text=[show_token(n.text) for n in alive], textposition="middle right", textfont=dict(size=10),
        marker=dict(color=scores, colorscale=SCORE_SCALE, cmin=min(lo, -1e-3), cmax=0.0,
                    size=[_size(n.corrected) if n.depth else 18 for n in alive],
                    symbol=[SOURCE_SYMBOLS[n.source] for n in alive],
                    line=dict(color="#333", width=0.6),
                    colorbar=dict(title=dict(text="path<br>log-score", side="right"), thickness=12)),
        hovertext=[_node_hover(n) for n in alive], hoverinfo="text"))
    _depth_axes(fig, max_depth)
    return fig


def prune_figure(tree: dict | None, prune: dict | None) -> go.Figure:
    """The supertree again, with the best-B nodes kept and the rest pruned."""
    title = "3 · Deferred pruning: keep the B best nodes of the whole supertree"
    if not tree or not prune:
        return placeholder(title, "Press Prune once every depth is built", TREE_HEIGHT)
    nodes = [n for n in tree["nodes"] if n.survived]
    kept = set(prune["kept"])
    pos = layered_layout(nodes)
    fig = _base(f"{title}<br><sup>{prune['caption']}</sup>", TREE_HEIGHT)
    xs, ys = _edges(nodes, pos, keep=lambda n: n.id not in kept)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#e3e3e3", width=1, dash="dot"),
                             hoverinfo="skip"))
    xs, ys = _edges(nodes, pos, keep=lambda n: n.id in kept)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#777", width=1.6), hoverinfo="skip"))
    gone = [n for n in nodes if n.id not in kept]
    if gone:
        fig.add_trace(go.Scatter(
            x=[pos[n.id][0] for n in gone], y=[pos[n.id][1] for n in gone], mode="markers",
            marker=dict(symbol=[PRUNED_SYMBOLS[n.source] for n in gone], color="#d62728", size=8, opacity=0.45),
            hovertext=[_node_hover(n) + "<br><i>pruned: not among the best B</i>" for n in gone], hoverinfo="text"))
    keep_nodes = [n for n in nodes if n.id in kept]
    scores = [n.score for n in keep_nodes]
    lo = min(scores[1:]) if len(scores) > 1 else -1.0
    fig.add_trace(go.Scatter(
        x=[pos[n.id][0] for n in keep_nodes], y=[pos[n.id][1] for n in keep_nodes], mode="markers+text",
        text=[show_token(n.text) for n in keep_nodes], textposition="middle right", textfont=dict(size=10),
        marker=dict(color=scores, colorscale=SCORE_SCALE, cmin=min(lo, -1e-3), cmax=0.0, size=13,
                    symbol=[SOURCE_SYMBOLS[n.source] for n in keep_nodes], line=dict(color="#333", width=0.6)),
        hovertext=[_node_hover(n) for n in keep_nodes], hoverinfo="text"))
    _depth_axes(fig, tree["max_depth"])
    return fig


def rank_figure(prune: dict | None) -> go.Figure:
    """Supertree nodes ranked by the score the top-B cut uses; the kept ones in blue."""
    title = "Supertree nodes ranked by path score"
    if not prune:
        return placeholder(title, "Filled at the Prune step")
    scores = [score for score, _ in prune["ranked"]]
    budget = prune["budget"]
    n = len(scores)
    fig = _base(title, SMALL_HEIGHT)
    fig.add_trace(go.Bar(x=list(range(1, n + 1)), y=scores,
                         marker_color=["#3b75af" if kept else "#d9a5a5" for _, kept in prune["ranked"]],
                         hovertemplate="rank %{x}: score %{y:.3f}<extra></extra>"))
    low = min(scores) if scores else -1.0
    if budget < n:
        fig.add_vline(x=budget + 0.5, line=dict(color="#d62728", width=2, dash="dash"))
        fig.add_annotation(x=budget + 0.5, y=low * 0.95, text=f"B = {budget}<br>cut at {prune['lowest']:.2f}",
                           showarrow=False, xanchor="left", font=dict(color="#d62728"))
    fig.update_xaxes(range=[0.3, max(n, budget) + 0.7], title="rank", fixedrange=True)
    fig.update_yaxes(range=[low * 1.08 - 0.05, 0.0], title=prune.get("axis", "path log-score"), fixedrange=True)
    return fig


def ancestor_mask(parents: list[int]) -> list[list[bool]]:
    """(i, j) is True when node j is node i or one of its ancestors (parents precede children)."""
    rows = []
    for i, _ in enumerate(parents):
        row = [False] * len(parents)
        j = i
        while j >= 0:
            row[j] = True
            j = parents[j]
        rows.append(row)
    return rows


def mask_figure(tree: dict | None) -> go.Figure:
    """Which node sees which in the verification pass; the whole prefix is one column."""
    title = "4 · Tree attention mask (row sees column)"
    if not tree:
        return placeholder(title, "Filled once the tree is pruned", MASK_HEIGHT)
    texts, mask = tree["texts"], tree.get("mask") or ancestor_mask(tree["parents"])
    n = len(texts)
    labels = [f"{i}:{show_token(t, 8)}" for i, t in enumerate(texts)]
    z = [[2] + [1 if v else 0 for v in row] for row in mask]
    hover = [[f"{_esc(labels[i])} sees the prefix ({tree['prefix_len']} tokens)"] +
             [f"{_esc(labels[i])} {'sees' if v else 'does not see'} {_esc(labels[j])}" for j, v in enumerate(row)]
             for i, row in enumerate(mask)]
    fig = _base(f"{title}<br><sup>{n} nodes; the {tree['prefix_len']}-token prefix is one column</sup>", MASK_HEIGHT)
    fig.add_trace(go.Heatmap(z=z, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                             colorscale=[[0, "#f4f4f4"], [0.5, "#2f6db5"], [1, "#8fc1a9"]], zmin=0, zmax=2,
                             showscale=False,
                             xgap=1, ygap=1))
    step = max(1, math.ceil(n / 40))
    fig.update_xaxes(tickvals=[0] + [j + 1 for j in range(0, n, step)],
                     ticktext=[f"prefix ({tree['prefix_len']})"] + labels[::step], tickangle=-60,
                     tickfont=dict(size=9), range=[-0.5, n + 0.5], fixedrange=True)
    fig.update_yaxes(tickvals=list(range(0, n, step)), ticktext=labels[::step], tickfont=dict(size=9),
                     range=[n - 0.5, -0.5], fixedrange=True)
    fig.update_layout(margin=dict(l=90, r=20, t=60, b=90))
    return fig


def verify_figure(verify: dict | None, max_depth: int) -> go.Figure:
    """The target's token at every node, the accepted path and the bonus token."""
    title = "5 · Verification walk: one target pass over the whole tree"
    if not verify:
        return placeholder(title, "Press Verify: the target reads the whole tree in one forward pass", TREE_HEIGHT)
    n = len(verify["tokens"])
    accepted = set(verify["path"])
    nodes = [NodeView(id=i, parent=p if p >= 0 else None, depth=d, token=tok, text=text, score=s, order=-s)
             for i, (p, d, s, tok, text) in enumerate(zip(verify["parents"], verify["depths"], verify["scores"],
                                                          verify["tokens"], verify["texts"]))]
    pos = layered_layout(nodes)
    fig = _base(f"{title}<br><sup>{verify['caption']}</sup>", TREE_HEIGHT)
    xs, ys = _edges(nodes, pos)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#d0d0d0", width=1), hoverinfo="skip"))
    path = verify["path"]
    deepest = path[-1]
    bx, by = pos[deepest][0] + 1, pos[deepest][1]
    fig.add_trace(go.Scatter(x=[pos[i][0] for i in path] + [bx], y=[pos[i][1] for i in path] + [by], mode="lines",
                             line=dict(color=ACCEPT, width=4), hoverinfo="skip"))
    hover = []
    for i in range(n):
        parent = verify["parents"][i]
        want = verify["target_texts"][parent] if parent >= 0 else None
        lines = [f"node {i}: <b>{_esc(verify['texts'][i])}</b> (id {verify['tokens'][i]}), depth {verify['depths'][i]}"]
        if want is not None:
            lines.append(f"target wanted here: <b>{_esc(want)}</b> → {'match' if verify['matched'][i] else 'no match'}")
        lines.append(f"target's next token after it: <b>{_esc(verify['target_texts'][i])}</b>")
        lines.append("on the accepted path" if i in accepted else "not accepted")
        if verify["sources"][i] != "draft":
            lines.append(f"proposed by: {verify['sources'][i]}")
        hover.append("<br>".join(lines))
    colours = [ACCEPT if i in accepted else ("#9fd3a8" if verify["matched"][i] else REJECT) for i in range(n)]
    fig.add_trace(go.Scatter(
        x=[pos[i][0] for i in range(n)], y=[pos[i][1] for i in range(n)], mode="markers+text",
        text=[show_token(t) for t in verify["texts"]], textposition="middle right", textfont=dict(size=10),
        marker=dict(color=colours, size=[16 if i in accepted else 10 for i in range(n)],
                    symbol=[SOURCE_SYMBOLS[s] for s in verify["sources"]], line=dict(color="#333", width=0.6)),
        hovertext=hover, hoverinfo="text"))
    fig.add_trace(go.Scatter(x=[bx], y=[by], mode="markers+text", text=[f"bonus {show_token(verify['bonus_text'])}"],
                             textposition="bottom center", textfont=dict(size=11, color=BONUS),
                             marker=dict(symbol="star", size=22, color=BONUS, line=dict(color="#333", width=0.6)),
                             hovertext=[f"bonus token from the target: <b>{_esc(verify['bonus_text'])}</b> "
                                        f"(id {verify['bonus']})"], hoverinfo="text"))
    _depth_axes(fig, max_depth, extra=1.0)
    return fig


def text_html(segments: list[dict], note: str = "") -> str:
    """The generated text so far, each round's tokens on its own colour (hover: which round)."""
    if not segments:
        return "<div class='dt-text'><i>No tokens yet: press Draft or Next round.</i></div>"
    parts = []
    for seg in segments:
        r = seg["round"]
        colour = "#eeeeee" if r is None else ROUND_COLOURS[r % len(ROUND_COLOURS)]
        label = "prefill (first token)" if r is None else f"round {r}: {seg.get('count', '?')} tokens"
        style = f"background:{colour};padding:1px 0;border-radius:3px;"
        if seg.get("pending"):
            style += "outline:2px dashed #1b9e47;"
            label += " (accepted, committed at the Commit step)"
        body = html.escape(seg["text"]).replace("\n", "<br>")
        parts.append(f"<span title='{html.escape(label)}' style='{style}'>{body}</span>")
    footer = f"<div style='color:#666;font-size:12px;margin-top:6px'>{html.escape(note)}</div>" if note else ""
    return ("<div class='dt-text' style='font-size:15px;line-height:1.7;white-space:normal;color:#222'>"
            + "".join(parts) + "</div>" + footer)


def correction_figure(depth: dict | None, candidates: int) -> go.Figure:
    """For the nodes expanded at one depth: each candidate's rank by the drafter's marginal against its
    rank after the correction head (per parent). Points off the diagonal are what correction changes."""
    title = "6 · Correction at work: marginal vs corrected rank"
    if not depth:
        return placeholder(title, "Filled at every Next depth (for the methods that use the correction head)")
    corr = depth["correction"]
    if corr is None:
        return placeholder(title, depth.get("caption", "no correction for this method"))
    fig = _base(f"{title}<br><sup>{corr['caption']}</sup>", SMALL_HEIGHT + 60)
    lim = candidates
    fig.add_trace(go.Scatter(x=[0, lim - 1], y=[0, lim - 1], mode="lines", line=dict(color="#aaa", dash="dash"),
                             hoverinfo="skip", showlegend=False))
    for survived, colour, name, size in ((False, "#6b8fb8", "cut", 5), (True, BONUS, "kept at this depth", 9)):
        idx = [i for i, s in enumerate(corr["survived"]) if s == survived]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            x=[corr["marginal_rank"][i] for i in idx], y=[corr["corrected_rank"][i] for i in idx], mode="markers",
            name=name, marker=dict(color=colour, size=size, opacity=0.9 if survived else 0.35),
            customdata=[[corr["parent"][i], _esc(corr["texts"][i])] for i in idx],
            hovertemplate="parent node %{customdata[0]} · <b>%{customdata[1]}</b><br>"
                          "marginal rank %{x} → corrected rank %{y}<extra></extra>"))
    fig.update_layout(showlegend=True, legend=dict(orientation="h", y=-0.2, x=0))
    fig.update_xaxes(range=[-1, lim], title="rank by the drafter's marginal (per parent)", fixedrange=True)
    fig.update_yaxes(range=[lim, -1], title="rank after correction", fixedrange=True)
    return fig


def _titled(title: str, caption: str) -> str:
    """A title over a caption of one or more lines (newline-separated)."""
    return "<br>".join([title] + [f"<sup>{line}</sup>" for line in caption.split("\n")])


def speed_figure(speed: dict | None) -> go.Figure:
    """Whole runs' tokens/s of the method and of plain decoding once timed; before that, each round's τ
    against its time in plain steps (a round that commits more tokens than its plain steps beat plain)."""
    if not speed or (speed["measured"] is None and not speed["rounds"]):
        return placeholder("7 · Speed on this machine", "Filled after the first committed round")
    m = speed["measured"]
    if m is None:
        rounds = speed["rounds"]
        fig = _base(_titled("7 · Each round: tokens vs its time in plain steps", speed["caption"]), SMALL_HEIGHT,
                    margin=dict(MARGIN, t=80))
        x = [r["round"] for r in rounds]
        for key, name, colour in (("tokens", "tokens committed (τ)", "#2f6db5"),
                                  ("steps", "time in plain steps", "#9a9a9a")):
            fig.add_trace(go.Bar(x=x, y=[r[key] for r in rounds], name=name, marker_color=colour,
                                 hovertemplate=f"round %{{x}}: %{{y:.2f}} {name}<extra></extra>"))
        fig.update_layout(barmode="group", showlegend=True,
                          legend=dict(orientation="h", y=1.0, x=1, xanchor="right", yanchor="bottom"))
        fig.update_xaxes(range=[-0.6, max(len(rounds), 8) - 0.4], title="round", dtick=1, fixedrange=True)
        top = max(max(r["tokens"], r["steps"]) for r in rounds)
        fig.update_yaxes(range=[0, top * 1.2], fixedrange=True)
        return fig
    names, values = [m["method"], "ar (plain)"], [m["tps"], m["ar_tps"]]
    labels = [f"{m['tps']:.1f} tok/s<br>τ = {m['tau']:.2f}", f"{m['ar_tps']:.1f} tok/s<br>τ = 1"]
    fig = _base(_titled("7 · Whole runs on this prompt (decode tokens/s)", speed["caption"]), SMALL_HEIGHT,
                margin=dict(MARGIN, t=80))
    fig.add_trace(go.Bar(x=names, y=values, text=labels, textposition="outside", marker_color=["#2f6db5", "#9a9a9a"],
                         width=0.5, hovertemplate="%{x}: %{y:.2f} tok/s<extra></extra>"))
    fig.update_yaxes(range=[0, max(values + [1e-3]) * 1.35], title="tokens / s", fixedrange=True)
    fig.update_xaxes(range=[-0.6, 1.6], fixedrange=True)
    return fig


def timeline_figure(rounds: list[dict]) -> go.Figure:
    """Per-round time of each stage, stacked."""
    title = "Where each round's time goes"
    if not rounds:
        return placeholder(title, "Filled after the first committed round")
    fig = _base(title, SMALL_HEIGHT)
    x = [r["round"] for r in rounds]
    for key, colour in (("draft", "#4c78a8"), ("tree", "#f58518"), ("verify", "#54a24b"), ("commit", "#b279a2")):
        fig.add_trace(go.Bar(x=x, y=[r.get(key, 0.0) for r in rounds], name=key, marker_color=colour,
                             customdata=[r.get("committed", 0) for r in rounds],
                             hovertemplate=f"round %{{x}} {key}: %{{y:.3f}} s<br>%{{customdata}} tokens committed"
                                           "<extra></extra>"))
    total = max(sum(r.get(k, 0.0) for k in STAGE_KEYS) for r in rounds)
    fig.update_layout(barmode="stack", showlegend=True, legend=dict(orientation="h", y=1.02, x=1, xanchor="right",
                                                                    yanchor="bottom"))
    fig.update_xaxes(range=[-0.6, max(len(rounds), 8) - 0.4], title="round", dtick=1, fixedrange=True)
    fig.update_yaxes(range=[0, total * 1.15 + 1e-3], title="seconds", fixedrange=True)
    return fig


# ---------------------------------------------------------------------------------------- race, sweep
def race_html(lanes: list[dict]) -> str:
    """One card per method with its text so far and its speed from whole runs (`data-` attributes carry
    the numbers for scripts: scripts/measure_explorer.py reads them)."""
    cards = []
    for lane in lanes:
        status = "finished" if lane.get("finished") else ("replaying" if lane.get("runs") else "timing")
        body = html.escape(lane.get("text", "")).replace("\n", "<br>") or "<i>…</i>"
        ratio = lane.get("ratio")
        shown = ratio is not None and lane["method"] != "ar"
        speed = (f"{lane.get('tps', 0.0):.1f} tok/s" + (f" · <b>{ratio:.2f}×</b> plain" if shown else "")
                 if lane.get("runs") else "timing…")
        cards.append(
            f"<div class='dt-lane' data-method='{html.escape(lane['method'])}' data-tps='{lane.get('tps', 0.0):.4f}' "
            f"data-ratio='{'' if ratio is None else f'{ratio:.4f}'}' "
            "style='flex:1;min-width:200px;border:1px solid #ddd;border-radius:8px;padding:8px;background:#fafafa'>"
            f"<div style='font-weight:600'>{html.escape(lane['method'])} "
            f"<span style='color:#888;font-weight:400'>({status})</span></div>"
            f"<div style='font-size:12px;color:#555'>{lane.get('tokens', 0)} tokens · {lane.get('rounds', 0)} "
            f"rounds · τ {lane.get('tau', 0.0):.2f} · {speed}</div>"
            f"<div style='margin-top:6px;font-size:14px;line-height:1.5;color:#222'>{body}</div></div>")
    return "<div style='display:flex;gap:8px;flex-wrap:wrap'>" + "".join(cards) + "</div>"


def race_figure(lanes: list[dict]) -> go.Figure:
    title = "Decode speed from whole runs (tokens/s)"
    if not lanes or not any(lane.get("runs") for lane in lanes):
        return placeholder(title, "Press Start race" if not lanes else "Timing whole runs…")
    fig = _base(title, SMALL_HEIGHT)
    values = [lane.get("tps", 0.0) for lane in lanes]
    text = [f"{v:.1f}" + (f" ({lane['ratio']:.2f}×)" if lane.get("ratio") and lane["method"] != "ar" else "")
            for v, lane in zip(values, lanes)]
    fig.add_trace(go.Bar(x=[lane["method"] for lane in lanes], y=values, text=text, textposition="outside",
                         marker_color=["#9a9a9a", "#72b7b2", "#f58518", "#2f6db5", "#b279a2"][: len(lanes)]))
    fig.update_yaxes(range=[0, max(values + [1e-3]) * 1.3], fixedrange=True)
    fig.update_xaxes(fixedrange=True)
    return fig


def grid_figure(title: str, widths: list[int], budgets: list[int], values: list[list[float | None]],
                fmt: str = ".2f", colorscale: str = "Viridis") -> go.Figure:
    """A W × B heatmap (rows: W, columns: B)."""
    if not values:
        return placeholder(title, "Press Run sweep")
    text = [["" if v is None else format(v, fmt) for v in row] for row in values]
    fig = _base(title, SMALL_HEIGHT + 40)
    fig.add_trace(go.Heatmap(z=values, x=[str(b) for b in budgets], y=[str(w) for w in widths], text=text,
                             texttemplate="%{text}", colorscale=colorscale,
                             hovertemplate="W=%{y}, B=%{x}: %{z:" + fmt + "}<extra></extra>",
                             colorbar=dict(thickness=12)))
    fig.update_xaxes(title="budget B", type="category", fixedrange=True)
    fig.update_yaxes(title="width W", type="category", fixedrange=True)
    return fig
