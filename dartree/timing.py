"""The one way this project times decoding: whole runs, warm, alternating configuration by configuration.

`bench`, the Explorer's speed ratio and the Race all call `alternate`: for one prompt and one token count,
it runs each configuration to the end (`generate`), one after another, `repeats` times over, so plain
decoding and a method see the same machine state and never share a round with another decoder. Speeds are
decode tokens over decode seconds, summed over runs (`tokens_per_second`); prefill is excluded.

The caller warms up first (`warm_up`): a process's first decode of a shape allocates caches and picks
kernels, a one-off cost no figure may include.
"""

from __future__ import annotations

from dataclasses import replace

from .engine import DecodeSettings, GenerationResult, generate

WARMUP_TOKENS = 8
UI_REPEATS = 2  # whole runs per configuration behind each figure on the page (the Explorer and the Race)


def warm_up(target, drafter, prompt_ids: list[int], settings: list[DecodeSettings], budget_policy=None,
            tokens: int = WARMUP_TOKENS) -> None:
    """A short, untimed decode of every configuration."""
    for s in settings:
        generate(target, drafter, prompt_ids, replace(s, max_new_tokens=tokens), budget_policy)


def alternate(target, drafter, prompt_ids: list[int], settings: list[DecodeSettings], budget_policy=None,
              repeats: int = 1, on_run=None) -> list[list[GenerationResult]]:
    """Run every configuration whole on one prompt, in turn, `repeats` times; returns the runs per config
    (runs[i] belongs to settings[i]). `on_run()` is called after each run (a progress bar)."""
    runs = [[] for _ in settings]
    for _ in range(repeats):
        for i, s in enumerate(settings):
            runs[i].append(generate(target, drafter, prompt_ids, s, budget_policy))
            if on_run is not None:
                on_run()
    return runs


def tokens_per_second(runs: list[GenerationResult]) -> float:
    """Decode tokens per decode second over runs (ratio of sums: long runs weigh more, as they should).
    The first token comes from the prefill, so a run of n tokens decodes n - 1."""
    tokens = sum(max(r.new_tokens - 1, 0) for r in runs)
    seconds = sum(r.decode_seconds for r in runs)
    return tokens / seconds if seconds else 0.0


def e2e_tokens_per_second(runs: list[GenerationResult]) -> float:
    """New tokens per second of prefill + decoding over runs (end to end, as a user waits; ratio of sums)."""
    seconds = sum(r.prefill_seconds + r.decode_seconds for r in runs)
    return sum(r.new_tokens for r in runs) / seconds if seconds else 0.0


def mean_tau(runs: list[GenerationResult]) -> float:
    """Tokens committed per round over runs (ratio of sums, as bench's τ)."""
    rounds = sum(r.rounds for r in runs)
    return sum(r.tau * r.rounds for r in runs) / rounds if rounds else 1.0


def plain_step_seconds(runs: list[GenerationResult]) -> float:
    """t_AR: seconds of one plain decoding step, from plain runs."""
    tps = tokens_per_second(runs)
    return 1.0 / tps if tps else 0.0
