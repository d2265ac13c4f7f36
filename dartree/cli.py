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
from .defaults import default_shape
from .errors import UserError, run_command
from .methods import METHODS as REGISTRY
from .methods import method_help


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def _budget(text: str):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from exc


def _add_prompt_source(p: argparse.ArgumentParser, limit: int) -> None:
    p.add_argument("--prompt-file", default=None, help="JSONL prompts (default: the shared dev prompts)")
    p.add_argument("--limit", type=int, default=limit)
    p.add_argument("--spread", action="store_true",
                   help="take --limit prompts evenly spaced over the file (the dev file is grouped by source)")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="smollm2-135m (embedded), a HF id or a folder")
    p.add_argument("--drafter", default="default",
                   help="'default' (shipped for the embedded target), 'random' (untrained), a folder or a HF id")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto",
                   help="auto (fp32 on CPU, bf16 on CUDA), fp32, bf16 or fp16; fp32 is the exact mode (tokens "
                        "identical to plain decoding at T = 0), 16-bit rounding can flip near-ties")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


def _add_decode_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    if not sweep:
        p.add_argument("--method", default="dartree", help=method_help())
        p.add_argument("--width", type=int, default=None, help="supertree width W (default: this device's)")
        p.add_argument("--budget", type=_budget, default=None,
                       help="verification budget B (tree nodes), or 'auto' (dartree: cost-aware, per round)")
    p.add_argument("--depth", type=int, default=None, help="tree depth D (default: drafter block size - 1)")
    p.add_argument("--candidates", type=int, default=None, help="candidates per position C (default: this device's)")
    p.add_argument("--depth-bonus", type=float, default=None,
                   help="dartree's top-B cut ranks nodes by path score + bonus x depth, in [-1, 0] "
                        "(default: this device's, see dartree/defaults.py)")
    p.add_argument("--retrieval", default=None,
                   help="retrieved branches in the tree before the top-B cut (dartree, dartree-fixed): "
                        "none, ngram (context n-grams), table (online successor table) or both "
                        "(default: dartree/defaults.py's RETRIEVAL_DEFAULT)")
    p.add_argument("--continuity", type=float, default=None,
                   help="weight of DART's n-gram continuity term in the tree scores (dartree, dartree-fixed), "
                        "from the target's own committed answers; 0: off (default: this device's)")
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
    _add_prompt_source(bench, 10)
    bench.add_argument("--methods", default="ar,chain,ddtree,dartree-fixed,dartree")
    bench.add_argument("--budgets", type=_int_list, default=None)
    bench.add_argument("--widths", type=_int_list, default=None)
    bench.add_argument("--configs", default=None,
                       help="exact configs instead of the grid, e.g. 'chain,ddtree:B=32,dartree:W=8:B=32,dartree:W=8:B=auto'; "
                            "with --best-of, extra configs decoded in the same run")
    bench.add_argument("--best-of", default=None, metavar="SWEEP_JSON",
                       help="decode each method's best configuration of a sweep (by predicted tokens/s), plus any --configs")
    bench.add_argument("--budget-policy", default=None, help="calibration file for B=auto (default: the shipped one)")
    bench.add_argument("--out", default=None, help="results JSON path")
    bench.add_argument("--cost-curve", action="store_true", help="also measure t_verify(N) and t_draft")
    bench.add_argument("--context-curve", action="store_true",
                       help="instead of the bench: how t_AR, t_round of the default shape, t_verify(N) and t_draft "
                            "grow with the context (contexts cut from --prompt-file, default the long dev prompts)")
    bench.add_argument("--contexts", type=_int_list, default=[128, 512, 1024, 2048],
                       help="context lengths in tokens for --context-curve")
    bench.add_argument("--plot", default=None, help="HTML plot path (speedups and the per-stage time split)")
    bench.add_argument("--no-progress", action="store_true")
    _add_decode_args(bench, sweep=True)
    _add_model_args(bench)

    sw = sub.add_parser("sweep", help="replay every (method, W, B) on greedy continuations: exact tau, "
                                      "speed predicted from the measured cost curve")
    _add_prompt_source(sw, 30)
    sw.add_argument("--methods", default="ar,chain,ddtree,dartree-fixed,dartree")
    sw.add_argument("--budgets", type=_int_list, default=[8, 16, 24, 32, 48, 64])
    sw.add_argument("--widths", type=_int_list, default=[2, 4, 8, 12])
    sw.add_argument("--configs", default=None,
                    help="exact configs instead of the grid, e.g. 'dartree:W=4:B=8:bonus=0,dartree:W=4:B=8:bonus=-0.2'")
    sw.add_argument("--calibrate-out", default=None,
                    help="also calibrate --budget auto on train prompts and write the policy here (then replay B=auto)")
    sw.add_argument("--calibrate-prompts", type=int, default=12,
                    help="train prompts for the calibration: the first ones of the train file, which the trainer "
                         "holds out (its 64 lowest prompt indices are never trained on; never dev)")
    sw.add_argument("--costs", default=None, metavar="RESULTS_JSON",
                    help="predict speeds from the cost curve (and tree-build times) of a committed sweep or bench JSON "
                         "instead of timing this machine (a busy machine); τ is unaffected")
    sw.add_argument("--out", default=None, help="results JSON path")
    sw.add_argument("--plot", default=None, help="HTML plot path")
    sw.add_argument("--card", default=None, help="a drafter's TRAINING.md: write its tree-τ section from this sweep")
    sw.add_argument("--no-progress", action="store_true")
    _add_decode_args(sw, sweep=True)
    _add_model_args(sw)

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


def _budget_policy(models, path, temperature: float = 0.0):
    from .budget import policy_for

    return policy_for(models.target, models.drafter_name, path, temperature)


def _check_continuity(args, models, configs=()) -> None:
    """Refuse an n-gram continuity weight asked for on a target without committed answers to count."""
    from .continuity import corpus_folders

    asked = getattr(args, "continuity", None) or any(c.continuity for c in configs)
    if asked and not corpus_folders(models.target.name):
        raise UserError(f"--continuity counts the target's own answers in assets/train_data, and "
                        f"{models.target.name!r} has none there: leave it out or pass 0")


def _check_retrieval(args) -> None:
    """Refuse an unknown --retrieval before the models load."""
    from .retrieval import RETRIEVAL_MODES

    if getattr(args, "retrieval", None) is not None and args.retrieval not in RETRIEVAL_MODES:
        raise UserError(f"unknown --retrieval {args.retrieval!r}: choose one of {', '.join(RETRIEVAL_MODES)}")


def cmd_generate(args) -> int:
    from .budget import shape_for
    from .engine import DecodeSettings, generate
    from .models.loading import load_models
    from .prompts import read_prompt_file

    if args.prompt is not None and not args.prompt.strip():
        raise UserError("the prompt is empty: pass --prompt with some text")
    if args.method not in METHODS:
        raise UserError(f"unknown method {args.method!r}: choose one of {', '.join(METHODS)}")
    _check_retrieval(args)
    prompts = [args.prompt] if args.prompt is not None else read_prompt_file(args.prompt_file, args.limit)
    _set_threads(args.threads)
    models = load_models(args.target, args.drafter if args.method != "ar" else "none", args.device, args.dtype)
    _check_continuity(args, models)
    # unset W, B, C, bonus: DecodeSettings resolves the device's defaults (dartree.defaults), the auto
    # budget included where it is the default and a calibrated policy fits these models (shape_for)
    auto = args.budget == "auto" or (args.budget is None and shape_for(models, args.temperature).get("auto_budget")
                                     and REGISTRY[args.method].auto_budget)
    settings = DecodeSettings(method=args.method, width=args.width,
                              budget=None if args.budget in (None, "auto") else args.budget,
                              auto_budget=True if args.budget == "auto" else (None if args.budget is None else False),
                              depth=args.depth, candidates=args.candidates,
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              max_new_tokens=args.max_new_tokens, depth_bonus=args.depth_bonus,
                              retrieval=args.retrieval, continuity=args.continuity)
    policy = _budget_policy(models, None, args.temperature) if auto else None
    if not args.json and args.method != "ar":
        print(f"[dartree] drafter: {models.drafter_description}", file=sys.stderr)
    for i, prompt in enumerate(prompts):
        res = generate(models.target, models.drafter, models.target.chat_ids(prompt), settings, policy)
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


def _grid(args, models):
    """The configs of --methods x --widths x --budgets (or --configs), validated before minutes are spent."""
    from .bench import bench_configs, parse_configs
    from .engine import DecodeSettings

    shape = default_shape(models.target.device.type, args.temperature)  # the grid's default W and B
    if getattr(args, "best_of", None):
        from .sweep import best_configs

        path = Path(args.best_of)
        if not path.is_file():
            raise UserError(f"--best-of: no sweep results at {path} (make them with `python -m dartree sweep --out FILE`)")
        try:
            configs = best_configs(json.loads(path.read_text())["rows"])
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"--best-of: {path} is not a sweep results file ({exc})") from None
        if getattr(args, "configs", None):  # extra configurations in the same interleaved run
            configs += [c for c in parse_configs(args.configs) if c not in configs]
    elif getattr(args, "configs", None):
        configs = parse_configs(args.configs)
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            raise UserError(f"unknown method {unknown[0]!r}: choose from {', '.join(METHODS)}")
        configs = bench_configs(methods, args.widths or [shape["width"]], args.budgets or [shape["budget"]])
    device_type = models.target.device.type
    base = DecodeSettings(depth=args.depth, candidates=args.candidates, temperature=args.temperature, top_p=args.top_p,
                          seed=args.seed, max_new_tokens=args.max_new_tokens,
                          depth_bonus=getattr(args, "depth_bonus", None),
                          retrieval=getattr(args, "retrieval", None),
                          continuity=getattr(args, "continuity", None)).resolved(device_type)
    _check_continuity(args, models, configs)
    for cfg in configs:
        cfg.settings(base).validated(models.drafter.max_depth if models.drafter else None, models.target.vocab_size,
                                     device_type, policy_given=cfg.auto)
    return configs, base


def _write_json(path, results) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1))
        print(f"[dartree] wrote {path}", file=sys.stderr)


def cmd_context_curve(args) -> int:
    from .context_costs import context_curve, format_context_curve
    from .models.loading import load_models
    from .prompts import DEV_LONG_PROMPTS, read_prompt_file

    documents = read_prompt_file(args.prompt_file or DEV_LONG_PROMPTS)
    _set_threads(args.threads)
    models = load_models(args.target, args.drafter, args.device, args.dtype)
    results = context_curve(models, documents, contexts=args.contexts)
    results["command"] = _command_line(args)
    print(format_context_curve(results))
    _write_json(args.out, results)
    return 0


def cmd_bench(args) -> int:
    from .bench import cost_curve, format_table, run_bench
    from .models.loading import load_models
    from .prompts import DEV_PROMPTS, read_prompt_rows

    if args.context_curve:
        return cmd_context_curve(args)
    _check_retrieval(args)
    rows = read_prompt_rows(args.prompt_file or DEV_PROMPTS, args.limit, args.spread)
    prompts = [prompt for prompt, _ in rows]
    _set_threads(args.threads)
    models = load_models(args.target, args.drafter, args.device, args.dtype)
    configs, base = _grid(args, models)
    policy = _budget_policy(models, args.budget_policy, args.temperature) if any(c.auto for c in configs) else None
    print(f"[dartree] drafter: {models.drafter_description}", file=sys.stderr)
    results = run_bench(models, prompts, configs, base, progress=not args.no_progress, budget_policy=policy,
                        sources=[source for _, source in rows])
    results["command"] = _command_line(args)
    if args.cost_curve:
        results["cost_curve"] = cost_curve(models, prompts[0])
    print(format_table(results))
    _write_json(args.out, results)
    if args.plot:
        from .sweep import write_bench_plot

        write_bench_plot(results, args.plot)
        print(f"[dartree] wrote {args.plot}", file=sys.stderr)
    return 0


def cmd_sweep(args) -> int:
    from .models.loading import load_models
    from .prompts import DEV_PROMPTS, TRAIN_PROMPTS, read_prompt_file
    from .sweep import card_section, committed_costs, format_sweep, run_sweep, write_plot

    _check_retrieval(args)
    prompts = read_prompt_file(args.prompt_file or DEV_PROMPTS, args.limit, args.spread)
    calibration_prompts = None
    if args.calibrate_out:
        # the trainer's held-out slice (dartree.train.trainer.split_heldout): these are never trained on,
        # whatever share of the train file data generation has reached
        calibration_prompts = read_prompt_file(TRAIN_PROMPTS, args.calibrate_prompts)
    _set_threads(args.threads)
    costs = committed_costs(args.costs) if args.costs else None
    models = load_models(args.target, args.drafter, args.device, args.dtype)
    if models.drafter is None:
        raise UserError("the sweep needs a drafter")
    configs, base = _grid(args, models)
    print(f"[dartree] drafter: {models.drafter_description}", file=sys.stderr)
    results = run_sweep(models, prompts, configs, base, calibration_prompts, args.calibrate_out,
                        progress=not args.no_progress, costs=costs)
    results["command"] = _command_line(args)
    print(format_sweep(results))
    _write_json(args.out, results)
    if args.plot:
        write_plot(results, args.plot)
        print(f"[dartree] wrote {args.plot}", file=sys.stderr)
    if args.card:
        from .train.card import replace_card_section

        replace_card_section(Path(args.card), "Tree τ on dev prompts", card_section(results))
        print(f"[dartree] updated {args.card}", file=sys.stderr)
    return 0


def _command_line(args) -> str:
    import shlex

    return "python -m dartree " + " ".join(shlex.quote(a) for a in args.argv)


def cmd_train(args) -> int:
    try:
        from .train.cli import train_command
    except ImportError as exc:
        raise UserError(f"the training recipe is unavailable: {exc}") from exc
    return train_command(args)


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    command = {"generate": cmd_generate, "bench": cmd_bench, "sweep": cmd_sweep, "train": cmd_train}[args.command]
    return run_command(command, args)
