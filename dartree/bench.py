"""Interleaved speed measurements: every method in one process, prompt by prompt, prefill excluded.

Machines are noisy, so the benchmark never compares runs made minutes apart: for each prompt it runs
every configuration back to back (after a warm-up), and reports, per configuration, tokens per second
over the same prompts and its ratio to plain decoding. At T = 0 it also checks that every method's
output equals plain decoding in the same run.

`cost_curve` measures what bounds the speedup: t_verify(N), the cost of one target forward over N
new tokens on a cached prefix, and t_draft, the cost of one drafter pass.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, replace

import torch

from .engine import DecodeSettings, generate
from .draft import DrafterContext, draft_block
from .tree import Tree


@dataclass(frozen=True)
class BenchConfig:
    method: str
    width: int | None
    budget: int | None

    @property
    def label(self) -> str:
        parts = [self.method]
        if self.width is not None:
            parts.append(f"W={self.width}")
        if self.budget is not None:
            parts.append(f"B={self.budget}")
        return " ".join(parts)


def bench_configs(methods, widths, budgets) -> list[BenchConfig]:
    """ar first (the reference), then every method at each of its own knobs."""
    configs = [BenchConfig("ar", None, None)]
    for m in methods:
        if m == "ar":
            continue
        if m == "chain":
            configs.append(BenchConfig("chain", None, None))
        elif m in ("ddtree", "dartree-fixed"):
            configs += [BenchConfig(m, None, b) for b in budgets]
        elif m == "dartree":
            configs += [BenchConfig(m, w, b) for w in widths for b in budgets]
        else:
            raise ValueError(m)
    return configs


def machine_info(device) -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def run_bench(models, prompts: list[str], configs: list[BenchConfig], base: DecodeSettings, progress=True,
              warmup_tokens: int = 8) -> dict:
    """Measure every config on every prompt, interleaved; returns the results dict written as JSON."""
    from tqdm import tqdm

    target, drafter = models.target, models.drafter

    def settings_for(cfg: BenchConfig) -> DecodeSettings:
        s = replace(base, method=cfg.method)
        if cfg.width is not None:
            s = replace(s, width=cfg.width)
        if cfg.budget is not None:
            s = replace(s, budget=cfg.budget)
        return s

    ids_list = [target.chat_ids(p) for p in prompts]
    for cfg in configs:  # warm-up: first calls allocate and pick kernels
        generate(target, drafter, ids_list[0], replace(settings_for(cfg), max_new_tokens=warmup_tokens))
    per = {cfg: [] for cfg in configs}
    bar = tqdm(total=len(ids_list) * len(configs), disable=not progress, desc="bench", unit="run")
    for ids in ids_list:
        for cfg in configs:
            per[cfg].append(generate(target, drafter, ids, settings_for(cfg)))
            bar.update(1)
    bar.close()

    ar_runs = per[configs[0]]
    ar_tps = _tokens_per_second(ar_runs)
    rows = []
    for cfg in configs:
        runs = per[cfg]
        tps = _tokens_per_second(runs)
        stage = {k: sum(r.stage_seconds[k] for r in runs) for k in ("draft", "tree", "verify", "commit")}
        total = sum(stage.values()) or 1.0
        per_prompt = [(_tokens_per_second([r]) / _tokens_per_second([a])) if _tokens_per_second([a]) else 0.0
                      for r, a in zip(runs, ar_runs)]
        rounds = sum(r.rounds for r in runs)
        rows.append({
            "method": cfg.method, "width": cfg.width, "budget": cfg.budget,
            "tau": sum(sum(x.committed for x in r.round_records) for r in runs) / rounds if rounds else 0.0,
            "tokens_per_second": tps, "speedup_vs_ar": tps / ar_tps if ar_tps else 0.0,
            "median_speedup": statistics.median(per_prompt),
            "n_prompts": len(runs), "new_tokens": sum(r.new_tokens for r in runs),
            "identical_to_ar": sum(r.token_ids == a.token_ids for r, a in zip(runs, ar_runs)),
            "stage_share": {k: v / total for k, v in stage.items()},
            "round_seconds": total / rounds if rounds else 0.0,
        })
    return {"rows": rows, "machine": machine_info(target.device), "settings": {
        "max_new_tokens": base.max_new_tokens, "temperature": base.temperature, "candidates": base.candidates,
        "depth": base.depth, "n_prompts": len(prompts)}, "drafter": models.drafter_description}


def _tokens_per_second(runs) -> float:
    """Decode tokens per decode second over runs (ratio of sums: long runs weigh more, as they should)."""
    tokens = sum(max(r.new_tokens - 1, 0) for r in runs)
    seconds = sum(r.decode_seconds for r in runs)
    return tokens / seconds if seconds else 0.0


def format_table(results: dict) -> str:
    head = f"{'method':<14}{'W':>4}{'B':>5}{'tau':>7}{'tok/s':>8}{'speedup':>9}{'same':>6}  draft/tree/verify/commit"
    lines = [head, "-" * len(head)]
    for r in results["rows"]:
        share = "/".join(f"{100 * r['stage_share'][k]:.0f}" for k in ("draft", "tree", "verify", "commit"))
        lines.append(f"{r['method']:<14}{r['width'] or '':>4}{r['budget'] or '':>5}{r['tau']:>7.2f}"
                     f"{r['tokens_per_second']:>8.2f}{r['speedup_vs_ar']:>9.2f}"
                     f"{r['identical_to_ar']:>3}/{r['n_prompts']:<2}  {share}")
    return "\n".join(lines)


@torch.inference_mode()
def cost_curve(models, prompt: str, sizes=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256),
               repeats: int = 7, depth: int = 7) -> dict:
    """Median seconds of one verify forward over N tree tokens, and of one drafter pass."""
    from transformers import DynamicCache

    target, drafter = models.target, models.drafter
    ids = target.chat_ids(prompt)
    dev = target.device
    feature_layers = tuple(drafter.cfg.target_layer_ids) if drafter is not None else ()
    cache = DynamicCache()
    out = target.forward(torch.tensor([ids], device=dev), torch.arange(len(ids), device=dev)[None], cache,
                         feature_layers=feature_layers, logit_rows=slice(-1, None))
    prefix = len(ids)
    from .verify import verify_tree

    verify = {}
    for n in sizes:
        # a tree of n nodes shaped like a real one: n // depth branches of at most `depth` nodes
        parents = [-1] + [0 if (i - 1) % depth == 0 else i - 1 for i in range(1, n)]
        depths = [0]
        for i in range(1, n):
            depths.append(depths[parents[i]] + 1)
        tree = Tree(torch.arange(100, 100 + n, device=dev), torch.tensor(parents, device=dev),
                    torch.tensor(depths, device=dev), torch.zeros(n, device=dev), max(depths))
        times = []
        for _ in range(repeats):
            t0 = _sync_time(dev)
            verify_tree(target, tree, cache, prefix, feature_layers)
            times.append(_sync_time(dev) - t0)
            cache.crop(prefix)
        verify[n] = statistics.median(times)
    result = {"prefix_tokens": prefix, "verify_seconds": verify, "t_ar": verify[1]}
    if drafter is not None:
        context = DrafterContext(drafter)
        context.append(out.features, torch.arange(prefix, device=dev))
        anchor = torch.tensor(ids[-1], device=dev)
        times = []
        for _ in range(repeats):
            t0 = _sync_time(dev)
            draft_block(drafter, target, context, anchor, prefix, drafter.max_depth, 64)
            times.append(_sync_time(dev) - t0)
        result["draft_seconds"] = statistics.median(times)
    return result


def _sync_time(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
