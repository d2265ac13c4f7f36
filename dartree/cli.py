"""The command line: generate with any method, benchmark methods against plain decoding, train a drafter.

User mistakes (empty prompt, W or B out of range, unknown model or method) end with a one-line
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import DEFAULT_TARGET, METHODS
from .errors import UserError


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="smollm2-135m (embedded), a HF id or a folder")
    p.add_argument("--drafter", default="default",
                   help="'default' (shipped for the embedded target), 'random' (untrained), a folder or a HF id")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on CUDA), fp32, bf16 or fp16")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


def _add_decode_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    if not sweep:
        p.add_argument("--method", default="dartree", help=f"one of {', '.join(METHODS)}")
        p.add_argument("--width", type=int, default=None, help="supertree width W")
        p.add_argument("--budget", type=int, default=None, help="verification budget B (tree nodes)")
    p.add_argument("--depth", type=int, default=None, help="tree depth D (default: drafter block size - 1)")
    p.add_argument("--candidates", type=int, default=64, help="candidates per position C")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dartree", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode prompts with one method")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the user turn (the chat template is applied)")
    src.add_argument("--prompt-file", help="JSONL with a 'prompt' field per line")
    gen.add_argument("--limit", type=int, default=None, help="first N prompts of the file")
    gen.add_argument("--json", action="store_true", help="one JSON line per prompt")
    _add_decode_args(gen)
    _add_model_args(gen)

    bench = sub.add_parser("bench", help="interleaved speed comparison against plain decoding")
    bench.add_argument("--prompt-file", default=None, help="JSONL prompts (default: the shared dev prompts)")
    bench.add_argument("--limit", type=int, default=10)
    bench.add_argument("--methods", default="ar,chain,ddtree,dartree-fixed,dartree")
    bench.add_argument("--budgets", type=_int_list, default=None)
    bench.add_argument("--widths", type=_int_list, default=None)
    bench.add_argument("--out", default=None, help="results JSON path")
    bench.add_argument("--cost-curve", action="store_true", help="also measure t_verify(N) and t_draft")
    bench.add_argument("--no-progress", action="store_true")
    _add_decode_args(bench, sweep=True)
    _add_model_args(bench)

    train = sub.add_parser("train", help="generate data and train a drafter (see dartree.train)")
    try:
        from .train.cli import add_train_arguments
        add_train_arguments(train)
    except ImportError:
        pass
    return parser


def _set_threads(n):
    import torch

    if n:
        torch.set_num_threads(n)


def default_shape(device_type: str) -> dict:
    """The measured best (W, B) for this CPU; the DARTree reference's GPU defaults on CUDA."""
    from .defaults import CPU_DEFAULTS, GPU_DEFAULTS

    return dict(GPU_DEFAULTS if device_type == "cuda" else CPU_DEFAULTS)


def cmd_generate(args) -> int:
    from .engine import DecodeSettings, generate
    from .models.loading import load_models
    from .prompts import read_prompt_file

    if args.prompt is not None and not args.prompt.strip():
        raise UserError("the prompt is empty: pass --prompt with some text")
    if args.method not in METHODS:
        raise UserError(f"unknown method {args.method!r}: choose one of {', '.join(METHODS)}")
    prompts = [args.prompt] if args.prompt is not None else read_prompt_file(args.prompt_file, args.limit)
    _set_threads(args.threads)
    models = load_models(args.target, args.drafter if args.method != "ar" else "none", args.device, args.dtype)
    shape = default_shape(models.target.device.type)
    settings = DecodeSettings(method=args.method, width=shape["width"] if args.width is None else args.width,
                              budget=shape["budget"] if args.budget is None else args.budget, depth=args.depth, candidates=args.candidates,
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              max_new_tokens=args.max_new_tokens)
    if not args.json and args.method != "ar":
        print(f"[dartree] drafter: {models.drafter_description}", file=sys.stderr)
    for i, prompt in enumerate(prompts):
        res = generate(models.target, models.drafter, models.target.chat_ids(prompt), settings)
        if args.json:
            print(json.dumps({"prompt_index": i, "method": args.method, "text": res.text, "token_ids": res.token_ids,
                              "new_tokens": res.new_tokens, "rounds": res.rounds, "tau": res.tau,
                              "decode_seconds": res.decode_seconds, "tokens_per_second": res.tokens_per_second}),
                  flush=True)
        else:
            print(res.text)
            print(f"[{args.method}] {res.new_tokens} tokens, {res.rounds} rounds, tau {res.tau:.2f}, "
                  f"{res.tokens_per_second:.1f} tok/s", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .bench import bench_configs, cost_curve, format_table, run_bench
    from .engine import DecodeSettings
    from .models.loading import load_models
    from .prompts import DEV_PROMPTS, read_prompt_file

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"unknown method {unknown[0]!r}: choose from {', '.join(METHODS)}")
    prompts = read_prompt_file(args.prompt_file or DEV_PROMPTS, args.limit)
    _set_threads(args.threads)
    models = load_models(args.target, args.drafter, args.device, args.dtype)
    shape = default_shape(models.target.device.type)
    budgets = args.budgets or [shape["budget"]]
    widths = args.widths or [shape["width"]]
    base = DecodeSettings(depth=args.depth, candidates=args.candidates, temperature=args.temperature, top_p=args.top_p,
                          seed=args.seed, max_new_tokens=args.max_new_tokens)
    for w in widths:  # validate every knob before spending minutes
        for b in budgets:
            DecodeSettings(width=w, budget=b, candidates=args.candidates, depth=args.depth).validated(
                models.drafter.max_depth if models.drafter else None, models.target.vocab_size)
    print(f"[dartree] drafter: {models.drafter_description}", file=sys.stderr)
    results = run_bench(models, prompts, bench_configs(methods, widths, budgets), base, progress=not args.no_progress)
    if args.cost_curve:
        results["cost_curve"] = cost_curve(models, prompts[0])
    print(format_table(results))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"[dartree] wrote {args.out}", file=sys.stderr)
    return 0


def cmd_train(args) -> int:
    try:
        from .train.cli import run_train
    except ImportError as exc:
        raise UserError(f"the training recipe is unavailable: {exc}") from exc
    return run_train(args) or 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return {"generate": cmd_generate, "bench": cmd_bench, "train": cmd_train}[args.command](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
