"""Interleaved speed measurements: every method in one process, prompt by prompt.

Each row reports decode speed (rounds only, prefill excluded) and end-to-end speed (prefill included,
what a user waits for), both as ratios to plain decoding, and `prefill_vs_ar`: a tree method's prefill
(the target's pass with the drafter's feature layers, plus the drafter's context keys/values) over plain
decoding's (the target's pass alone), on the same prompts.

Machines are noisy, so the benchmark never compares runs made minutes apart: for each prompt it runs
every configuration back to back (after a warm-up), and reports, per configuration, tokens per second
over the same prompts and its ratio to plain decoding. It also counts the runs whose output equals plain
decoding in the same run, in every dtype, and records the dtype: in fp32 at T = 0 that is every run (the
lossless claim); in bf16 tree verification and one-token decoding round differently, so near-ties can flip.

`cost_curve` measures what bounds the speedup: t_verify(N), the cost of one target forward over N
new tokens on a cached prefix, and t_draft, the cost of one drafter pass.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace

import torch

from .cache import compact_cache, new_cache, truncate_cache
from .defaults import AUTO_BUDGET_CAP  # (re-exported: sweep and the CLI read it here)
from . import timing
from .engine import DecodeSettings
from .errors import UserError
from .draft import DrafterContext, draft_block
from .methods import METHODS
from .retrieval import RETRIEVAL_MODES
from .trace import STAGE_KEYS
from .timing import e2e_tokens_per_second as _e2e_tokens_per_second
from .timing import tokens_per_second as _tokens_per_second
from .tree import Tree




@dataclass(frozen=True)
class BenchConfig:
    method: str
    width: int | None
    budget: int | str | None  # "auto": dartree's cost-aware budget
    depth_bonus: float | None = None  # None: the base settings' (dartree's top-B cut)
    retrieval: str | None = None  # None: the base settings' (dartree.retrieval: none, ngram, table, both)
    continuity: float | None = None  # None: the base settings' (dartree.continuity: the n-gram term's weight)

    @property
    def label(self) -> str:
        parts = [self.method]
        if self.width is not None:
            parts.append(f"W={self.width}")
        if self.budget is not None:
            parts.append(f"B={self.budget}")
        if self.depth_bonus is not None:
            parts.append(f"bonus={self.depth_bonus:g}")
        if self.retrieval is not None:
            parts.append(f"retrieval={self.retrieval}")
        if self.continuity is not None:
            parts.append(f"continuity={self.continuity:g}")
        return " ".join(parts)

    @property
    def auto(self) -> bool:
        return self.budget == "auto"

    def settings(self, base: DecodeSettings) -> DecodeSettings:
        s = replace(base, method=self.method)
        if self.width is not None:
            s = replace(s, width=self.width)
        if self.auto:
            s = replace(s, budget=AUTO_BUDGET_CAP, auto_budget=True)
        elif self.budget is not None:
            s = replace(s, budget=self.budget)
        if self.depth_bonus is not None:
            s = replace(s, depth_bonus=self.depth_bonus)
        if self.retrieval is not None:
            s = replace(s, retrieval=self.retrieval)
        if self.continuity is not None:
            s = replace(s, continuity=self.continuity)
        return s


def parse_configs(text: str) -> list[BenchConfig]:
    """`ar,chain,ddtree:B=32,dartree:W=8:B=32:bonus=-0.2:retrieval=ngram:continuity=0.1,dartree:W=8:B=auto`
    -> configs (ar always first)."""
    configs = [BenchConfig("ar", None, None)]
    for item in (x.strip() for x in text.split(",")):
        if not item or item == "ar":
            continue
        method, *knobs = item.split(":")
        if method not in METHODS:
            raise UserError(f"unknown method {method!r} in --configs: choose from {', '.join(METHODS)}")
        values = {}
        for knob in knobs:
            key, _, value = knob.partition("=")
            if key not in ("W", "B", "bonus", "retrieval", "continuity") or not value:
                raise UserError(f"--configs item {item!r}: knobs are W=<int>, B=<int or auto>, bonus=<float>, "
                                f"retrieval=<{'|'.join(RETRIEVAL_MODES)}> and continuity=<float>")
            if key == "retrieval":
                if value not in RETRIEVAL_MODES:
                    raise UserError(f"--configs item {item!r}: retrieval must be one of {', '.join(RETRIEVAL_MODES)}")
                values[key] = value
                continue
            try:
                number = float if key in ("bonus", "continuity") else int
                values[key] = value if (key == "B" and value == "auto") else number(value)
            except ValueError:
                kind = "a number" if key in ("bonus", "continuity") else "an integer"
                raise UserError(f"--configs item {item!r}: {key} must be {kind}") from None
        configs.append(BenchConfig(method, values.get("W"), values.get("B"), values.get("bonus"),
                                   values.get("retrieval"), values.get("continuity")))
    return configs


def bench_configs(methods, widths, budgets) -> list[BenchConfig]:
    """ar first (the reference), then every method at each of its own knobs (dartree.methods)."""
    configs = [BenchConfig("ar", None, None)]
    for m in methods:
        if m == "ar":
            continue
        knobs = METHODS[m].knobs
        configs += [BenchConfig(m, w if "W" in knobs else None, b if "B" in knobs else None)
                    for w in (widths if "W" in knobs else [None]) for b in (budgets if "B" in knobs else [None])]
    return configs


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's processor string: runs on different
    machines compare ratios, not tokens/s, and this says which machine a file came from."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(target) -> dict:
    device = target.device
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": str(device)}
    if device.type == "cpu":
        from .models.rows_kernel import describe_linear_path
        info["cpu_linears"] = describe_linear_path(target)  # which kernel, and fp32 panels or the GGUF's blocks
        info["weights"] = getattr(target, "weights", "fp32")  # the same as a key: fp32 or gguf
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def run_bench(models, prompts: list[str], configs: list[BenchConfig], base: DecodeSettings, progress=True,
              warmup_tokens: int = 8, budget_policy=None, sources: list[str] | None = None) -> dict:
    """Measure every config on every prompt, interleaved; returns the results dict written as JSON.

    `sources` (one per prompt, e.g. the dev file's `source` field) adds each row's τ and speedup per
    source: acceptance depends on the domain far more than on W or B, and a mean hides that."""
    from tqdm import tqdm

    target, drafter = models.target, models.drafter
    ids_list = [target.chat_ids(p) for p in prompts]
    settings = [cfg.settings(base) for cfg in configs]
    timing.warm_up(target, drafter, ids_list[0], settings, budget_policy, warmup_tokens)
    per = {cfg: [] for cfg in configs}
    bar = tqdm(total=len(ids_list) * len(configs), disable=not progress, desc="bench", unit="run")
    for ids in ids_list:  # prompt by prompt, every config whole in turn (dartree.timing)
        for cfg, runs in zip(configs, timing.alternate(target, drafter, ids, settings, budget_policy,
                                                       on_run=lambda: bar.update(1))):
            per[cfg] += runs
    bar.close()

    ar_runs = per[configs[0]]
    ar_tps = _tokens_per_second(ar_runs)
    ar_e2e = _e2e_tokens_per_second(ar_runs)
    ar_prefill = sum(r.prefill_seconds for r in ar_runs)
    rows = []
    for cfg in configs:
        runs = per[cfg]
        tps = _tokens_per_second(runs)
        stage = {k: sum(r.stage_seconds[k] for r in runs) for k in STAGE_KEYS}
        total = sum(stage.values()) or 1.0
        per_prompt = [(_tokens_per_second([r]) / _tokens_per_second([a])) if _tokens_per_second([a]) else 0.0
                      for r, a in zip(runs, ar_runs)]
        rounds = sum(r.rounds for r in runs)
        rows.append({
            # the shape the runs resolved to (a bare `dartree` takes the device's defaults)
            "method": cfg.method, "width": runs[0].settings["width"] if "W" in METHODS[cfg.method].knobs else None,
            "budget": ("auto" if runs[0].settings["auto_budget"] else runs[0].settings["budget"])
            if "B" in METHODS[cfg.method].knobs else None,
            "depth_bonus": runs[0].settings["depth_bonus"] if METHODS[cfg.method].prunes else None,
            "tau": sum(sum(x.committed for x in r.round_records) for r in runs) / rounds if rounds else 0.0,
            "tokens_per_second": tps, "speedup_vs_ar": tps / ar_tps if ar_tps else 0.0,
            "median_speedup": statistics.median(per_prompt),
            # prefill included, as a user waits (scripts/peer_llamacpp.py reports llama.cpp's the same way)
            "e2e_tokens_per_second": _e2e_tokens_per_second(runs),
            "e2e_speedup_vs_ar": _e2e_tokens_per_second(runs) / ar_e2e if ar_e2e else 0.0,
            "prefill_seconds": sum(r.prefill_seconds for r in runs),
            "prefill_vs_ar": sum(r.prefill_seconds for r in runs) / ar_prefill if ar_prefill else 0.0,
            "n_prompts": len(runs), "new_tokens": sum(r.new_tokens for r in runs),
            "identical_to_ar": sum(r.token_ids == a.token_ids for r, a in zip(runs, ar_runs)),
            "stage_share": {k: v / total for k, v in stage.items()},
            "round_seconds": total / rounds if rounds else 0.0,
            "mean_nodes": sum(x.tree_nodes for r in runs for x in r.round_records) / rounds if rounds else 0.0,
            "retrieval": runs[0].settings["retrieval"], "continuity": runs[0].settings["continuity"],
            "sources": source_totals(runs),
        })
        if sources and len(set(sources)) > 1:
            rows[-1]["by_source"] = _by_source(runs, ar_runs, sources)
    return {"rows": rows, "date": datetime.date.today().isoformat(), "machine": machine_info(target), "settings": {
        "max_new_tokens": base.max_new_tokens, "temperature": base.temperature, "candidates": base.candidates,
        "depth": base.depth, "n_prompts": len(prompts), "dtype": dtype_name(target.dtype)},
        "drafter": models.drafter_description}


def dtype_name(dtype: torch.dtype) -> str:
    """fp32 / bf16 / fp16, as --dtype spells them."""
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _by_source(runs, ar_runs, sources: list[str]) -> dict:
    """τ and speedup against plain decoding over each source's prompts (same ratios as the whole row)."""
    out = {}
    for src in sorted(set(sources)):
        mine = [r for r, s in zip(runs, sources) if s == src]
        ar = [a for a, s in zip(ar_runs, sources) if s == src]
        rounds = sum(r.rounds for r in mine)
        ar_tps = _tokens_per_second(ar)
        out[src] = {"n_prompts": len(mine),
                    "tau": sum(x.committed for r in mine for x in r.round_records) / rounds if rounds else 0.0,
                    "speedup_vs_ar": _tokens_per_second(mine) / ar_tps if ar_tps else 0.0,
                    "sources": source_totals(mine)}
    return out


def source_totals(runs) -> dict:
    """Nodes proposed / verified / accepted per node source (draft, ngram, table) over the runs' rounds."""
    total: dict = {}
    for r in runs:
        for x in r.round_records:
            for src, counts in x.sources.items():
                row = total.setdefault(src, {"proposed": 0, "verified": 0, "accepted": 0})
                for k, v in counts.items():
                    row[k] += v
    return total


def knob_cells(r: dict) -> str:
    """A result row's bonus, retrieval and continuity weight, as the bench and sweep tables print them ("" where
    they do not apply or are off), under the `KNOB_HEAD` columns."""
    bonus = "" if r.get("depth_bonus") is None else f"{r['depth_bonus']:g}"
    retr = "" if r.get("retrieval") in (None, "none") else r["retrieval"]
    cont = f"{r['continuity']:g}" if r.get("continuity") else ""
    return f"{bonus:>6}{retr:>6}{cont:>6}"


KNOB_HEAD = f"{'bonus':>6}{'retr':>6}{'cont':>6}"


def format_table(results: dict) -> str:
    dtype = results["settings"].get("dtype", "fp32")
    head = (f"{'method':<14}{'W':>4}{'B':>5}{KNOB_HEAD}{'tau':>7}{'tok/s':>8}{'speedup':>9}{'e2e tok/s':>10}"
            f"{'e2e x':>7}{'prefill x':>10}{'same':>6}  draft/tree/verify/commit")
    lines = [f"dtype {dtype}; 'same' = runs whose tokens equal ar's in this run"
             + ("" if dtype == "fp32" else f" (not guaranteed in {dtype}: rounding flips near-ties; fp32 is exact)"),
             "tok/s and speedup: decoding only; e2e: prefill included; prefill x: this prefill over ar's",
             head, "-" * len(head)]
    for r in results["rows"]:
        share = "/".join(f"{100 * r['stage_share'][k]:.0f}" for k in STAGE_KEYS)
        lines.append(f"{r['method']:<14}{r['width'] or '':>4}{r['budget'] or '':>5}{knob_cells(r)}{r['tau']:>7.2f}"
                     f"{r['tokens_per_second']:>8.2f}{r['speedup_vs_ar']:>9.2f}{r['e2e_tokens_per_second']:>10.2f}"
                     f"{r['e2e_speedup_vs_ar']:>7.2f}{r['prefill_vs_ar']:>10.2f}"
                     f"{r['identical_to_ar']:>3}/{r['n_prompts']:<2}  {share}")
    lines += source_table(results["rows"])
    by_method = [(r, r["by_source"]) for r in results["rows"] if r.get("by_source") and r["method"] != "ar"]
    if by_method:
        sources = list(by_method[0][1])
        lines += ["", "tau by prompt source (speedup):", f"{'':<23}" + "".join(f"{s[:24]:>26}" for s in sources)]
        for r, per in by_method:
            label = row_label(r)
            lines.append(f"{label:<23}" + "".join(f"{per[s]['tau']:>19.2f} ({per[s]['speedup_vs_ar']:.2f})"
                                                  for s in sources))
    return "\n".join(lines)


def row_label(r: dict) -> str:
    """method W B [retrieval] [c=continuity weight], as the per-source tables name a row."""
    retr = "" if r.get("retrieval") in (None, "none") else r["retrieval"]
    cont = f"c={r['continuity']:g}" if r.get("continuity") else ""
    return " ".join(str(x) for x in (r["method"], r.get("width") or "", r.get("budget") or "", retr, cont) if x != "")


def source_table(rows: list[dict]) -> list[str]:
    """Lines: per row, the nodes each node source proposed / verified / accepted (rows with retrieval)."""
    shown = [r for r in rows if r.get("retrieval") not in (None, "none") and r.get("sources")]
    if not shown:
        return []
    names = ("draft", "ngram", "table")
    lines = ["", "nodes per node source, proposed / verified / accepted:",
             f"{'':<23}" + "".join(f"{n:>22}" for n in names)]
    for r in shown:
        cells = [r["sources"].get(n, {"proposed": 0, "verified": 0, "accepted": 0}) for n in names]
        lines.append(f"{row_label(r):<23}" + "".join(f"{c['proposed']:>10} /{c['verified']:>5} /{c['accepted']:>4}"
                                                  for c in cells))
    return lines


VERIFY_SIZES = (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, AUTO_BUDGET_CAP + 1)


@torch.inference_mode()
def cost_curve(models, prompt: str, sizes=VERIFY_SIZES, repeats: int = 7, depth: int = 7) -> dict:
    """Median seconds of one verify forward over N tree tokens, and of one drafter pass.

    The sizes are the verifies of B = 1, 2, 3, 4, 6, 8, 12, ... nodes plus the root, so that the usual budgets
    are measured rather than interpolated: the row kernel's cost is flat up to 3 rows (one weight stream
    serves them) and then steps with its 12-row tiles (rows_linear.c), which a coarse grid would smear."""
    target, drafter = models.target, models.drafter
    ids = target.chat_ids(prompt)
    dev = target.device
    feature_layers = tuple(drafter.cfg.target_layer_ids) if drafter is not None else ()
    cache = new_cache(target, len(ids) + max(sizes) + 1)
    out = target.prefill(ids, cache, feature_layers)
    prefix = len(ids)
    from .verify import verify_tree

    verify = verify_seconds(target, cache, prefix, sizes, depth, repeats, feature_layers)
    result = {"prefix_tokens": prefix, "verify_seconds": verify, "t_ar": verify[1]}

    context = DrafterContext.from_prefill(drafter, out.features) if drafter is not None else None
    for key, n, path_len in (("ar_commit_seconds", 1, 1), ("commit_seconds", 33, 3)):
        # a commit: gather the accepted rows into the cache (and, drafting, project their features)
        tree = _chain_tree(n, depth, dev)
        path = torch.arange(path_len, device=dev)
        verified = []

        def verify_first():  # untimed: the round's verify leaves the tree's rows in the cache
            truncate_cache(cache, prefix)
            verified[:] = [verify_tree(target, tree, cache, prefix, feature_layers)]

        def commit():
            compact_cache(cache, prefix, path)
            if context is not None and key == "commit_seconds":
                context.drafter.context_kv(verified[0].features[path][None].to(drafter.fc.weight.dtype),
                                           (path + prefix)[None])

        result[key] = median_seconds(commit, dev, repeats, setup=verify_first)
        truncate_cache(cache, prefix)
    if drafter is not None:
        anchor = torch.tensor(ids[-1], device=dev)
        result["draft_seconds"] = median_seconds(
            lambda: draft_block(drafter, target, context, anchor, prefix, drafter.max_depth, 64), dev, repeats)
    result["lm_head_seconds"] = lm_head_timings(target, repeats=repeats)
    return result


@torch.inference_mode()
def verify_seconds(target, cache, prefix: int, sizes, depth: int, repeats: int, feature_layers=()) -> dict:
    """{N: median seconds of one verify forward over an N-node tree on the cache's `prefix` rows}; the cache
    is cut back to `prefix` before every call and after the last."""
    from .verify import verify_tree

    out = {}
    for n in sizes:
        tree = _chain_tree(n, depth, target.device)
        out[n] = median_seconds(lambda: verify_tree(target, tree, cache, prefix, feature_layers), target.device,
                                repeats, setup=lambda: truncate_cache(cache, prefix))
    truncate_cache(cache, prefix)
    return out


@torch.inference_mode()
def lm_head_timings(target, sizes=(1, 2, 8, 16, 33, 64), repeats: int = 7) -> dict:
    """Median seconds of the LM head over N rows: F.linear (h @ W.T) against (W @ h.T).T, interleaved."""
    head = target.model.get_output_embeddings()
    dev = target.device
    out = {}
    g = torch.Generator(device="cpu").manual_seed(0)
    for n in sizes:
        h = torch.randn(n, head.weight.shape[1], generator=g).to(device=dev, dtype=head.weight.dtype)
        out[n] = interleaved_medians({"linear": lambda: head(h), "transposed": lambda: (head.weight @ h.T).T},
                                     dev, repeats)
    return out


def _chain_tree(n: int, depth: int, dev) -> Tree:
    """A tree of n nodes shaped like a real one: branches of at most `depth` nodes hanging off the root."""
    parents = [-1] + [0 if (i - 1) % depth == 0 else i - 1 for i in range(1, n)]
    depths = [0]
    for i in range(1, n):
        depths.append(depths[parents[i]] + 1)
    return Tree(torch.arange(100, 100 + n, device=dev), torch.tensor(parents, device=dev),
                torch.tensor(depths, device=dev), torch.zeros(n, device=dev), max(depths))


def _one_call(fn, device: torch.device, setup=None) -> float:
    """Wall seconds of one call of fn, the device synchronised at both ends; `setup` runs first, untimed.

    Hand-written rather than torch.utils.benchmark.Timer: Timer.timeit runs two untimed warm-up calls per
    measurement and its setup once per measurement (a verify must truncate the cache before every call),
    and it pins torch to one thread unless told otherwise; a median of single calls at the app's thread
    count is the quantity the sweep's predictions need.
    """
    if setup is not None:
        setup()
    t0 = _sync_time(device)
    fn()
    return _sync_time(device) - t0


def _sync_time(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def median_seconds(fn, device: torch.device, repeats: int, setup=None) -> float:
    """Median over `repeats` single calls (a median of single calls, not a mean of a batch: a round calls
    each stage once, and the median ignores the odd preempted call on a loaded machine)."""
    return statistics.median(_one_call(fn, device, setup) for _ in range(repeats))


def interleaved_medians(fns: dict, device: torch.device, repeats: int) -> dict:
    """`median_seconds` of several functions, their calls interleaved so drift hits all alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_one_call(fn, device))
    return {name: statistics.median(v) for name, v in times.items()}


@torch.inference_mode()
def tree_build_comparison(models, prompt: str, budgets=(16, 32, 64, 128, 256, 512, 1024), repeats: int = 5,
                          candidates: int = 64) -> list[dict]:
    """Seconds to build a corrected tree of B nodes: DARTree's depth-batched supertree + deferred pruning
    (W = ceil(B / D), so the supertree can hold B nodes) against a sequential best-first heap that calls
    the correction head once per node (`sequential_corrected_heap`), on one real drafter block."""
    import math

    from .draft import PathCorrector
    from .engine import build_round_tree
    from .tree import sequential_corrected_heap, tree_threads

    target, drafter = models.target, models.drafter
    ids = target.chat_ids(prompt)
    dev = target.device
    out = target.prefill(ids, new_cache(target, len(ids)), tuple(drafter.cfg.target_layer_ids))
    context = DrafterContext.from_prefill(drafter, out.features)
    depth = drafter.max_depth
    block = draft_block(drafter, target, context, out.logits[0].argmax(), len(ids), depth, candidates)
    rows = []
    for b in budgets:
        width = math.ceil(b / depth)

        settings = DecodeSettings(method="dartree", width=width, budget=b, depth=depth, candidates=candidates)

        def batched():  # the decoder's own round build (one-thread tree stage included)
            _, tree, _ = build_round_tree(settings, block, PathCorrector(drafter, target, block))
            return int(tree.tokens[-1])  # a host read, as the decoder's verify makes

        def sequential():  # under the same thread setting, so only the algorithm differs
            with tree_threads(dev):
                tree = sequential_corrected_heap(block.draft, PathCorrector(drafter, target, block), b, depth)
            return int(tree.tokens[-1])

        times = interleaved_medians({"batched": batched, "sequential": sequential}, dev, repeats)
        tb, ts = times["batched"], times["sequential"]
        rows.append({"budget": b, "width": width, "batched_seconds": tb, "sequential_seconds": ts,
                     "ratio": ts / tb if tb else 0.0})
    return rows
