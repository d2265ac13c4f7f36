"""`python -m dartree train ...` / `python -m dartree.train ...`: data, train, eval stages of a preset.

The main CLI calls :func:`add_train_arguments` on its `train` sub-parser and :func:`train_command` with the
parsed arguments.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from ..errors import UserError, run_command
from ..models.drafter import DominoDrafter
from ..models.loading import training_record
from ..models.target import load_target
from .card import (KEPT_CARD_SECTIONS, git_commit, history_section, read_card_sections, replace_card_section,
                   training_curve_section, write_card)
from .datagen import REPO_ROOT, features_dir, tokens_dir
from .datastage import add_datagen_arguments, run_datagen
from .distributed import DistContext
from .evaluate import evaluate_chain, format_eval
from .grow import grow
from .presets import get_preset
from .trainer import (TrainConfig, drafter_from_preset, export, load_window, summarize, train,
                      write_json)

DEFAULT_EXPORT = {"smollm2-cpu": REPO_ROOT / "assets" / "drafter-smollm2"}


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stage", choices=("data", "train", "eval", "all"), default="all",
                   help="data: generate (resumable); train: train + export + card; eval: evaluate the export")
    add_datagen_arguments(p)  # --preset, --max-prompts, --batch-size, ... (data stage)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                   help="where the target and drafter run (under torchrun: one GPU per rank on cuda)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=None, help="length of the schedule (warm-up, cosine, base weight)")
    g.add_argument("--stop-at", type=int, default=None,
                   help="stop and export at this step of the --steps schedule (resumable runs split by time)")
    g.add_argument("--max-shards", type=int, default=None,
                   help="train on the shards before shard N only (default: all; the data stage adds shards over time); "
                        "with --first-shard, the window [first, N)")
    g.add_argument("--also-data", action="append", default=[], metavar="PRESET[:N]",
                   help="also train on another preset's data (its first N shards with features); training only, "
                        "the held-out slice stays the preset's own. Repeatable")
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--seqs-per-step", type=int, default=None)
    g.add_argument("--anchors-per-seq", type=int, default=None)
    g.add_argument("--anchor-balance", type=float, default=None,
                   help="0: anchors uniform over the data; 1: every position bucket (<256, 256-511, 512-1023, ...) alike")
    g.add_argument("--warmup-steps", type=int, default=None)
    g.add_argument("--gamma", type=float, default=None)
    g.add_argument("--eval-every", type=int, default=None)
    g.add_argument("--heldout-seqs", type=int, default=None)
    g.add_argument("--init", choices=("target", "random"), default=None,
                   help="drafter layers from the target's last layers, or random")
    g.add_argument("--init-from", default=None,
                   help="start from this drafter folder's weights and draft vocabulary (a fine-tuning leg on new "
                        "data); a fresh schedule and optimizer")
    g.add_argument("--draft-vocab", choices=("keep", "data"), default="keep",
                   help="with --init-from: keep its draft vocabulary, or take this data's (the shared tokens keep "
                        "their learnt rows)")
    g.add_argument("--drafter-layers", type=int, default=None,
                   help="backbone layers (capacity runs; preset: 2); with --init-from, grows that drafter (train/grow.py)")
    g.add_argument("--gru-hidden", type=int, default=None,
                   help="the correction head's GRU width (preset: 256); with --init-from, grows that drafter")
    g.add_argument("--autocast", choices=("bf16", "off"), default=None,
                   help="bf16 matmuls with fp32 weights (default, ~4x faster on this AMX CPU) or plain fp32")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--run-name", default="default", help="checkpoint name under the cache dir")
    g.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint of this run")
    g.add_argument("--out", default=None, help="export folder (default assets/drafter-<target>)")
    g.add_argument("--drafter", default=None, help="eval stage: drafter folder (default the export)")


def _command_line() -> str:
    argv0 = Path(sys.argv[0])
    if argv0.name == "__main__.py":
        mod = ".".join(argv0.resolve().parent.relative_to(REPO_ROOT).parts)
        return shlex.join(["python", "-m", mod] + sys.argv[1:])
    return shlex.join(["python"] + sys.argv)


def _train_config(preset: dict, args):
    d = dict(preset["train"])
    for key in ("steps", "lr", "seqs_per_step", "anchors_per_seq", "anchor_balance", "warmup_steps", "gamma",
                "eval_every",
                "heldout_seqs", "init", "autocast", "seed", "stop_at"):
        v = getattr(args, key, None)
        if v is not None:
            d[key] = v
    return TrainConfig.from_dict(d)


def _drafter_spec(preset: dict, args) -> dict:
    spec = dict(preset["drafter"])
    if getattr(args, "drafter_layers", None):
        spec["num_layers"] = args.drafter_layers
    if getattr(args, "gru_hidden", None):
        spec["gru_hidden_dim"] = args.gru_hidden
    return spec


def run_train(args) -> dict:
    torch.set_num_threads(args.threads)
    preset = get_preset(args.preset)
    result = {}
    if args.stage in ("data", "all"):
        result["data"] = run_datagen(args)
    if args.stage in ("train", "all"):
        result["train"] = _stage_train(args, preset)
    if args.stage == "eval":
        result["eval"] = _stage_eval(args, preset)
    return result


def _load(args, preset, device=None):
    device = device or torch.device("cpu")
    # CPU: an fp32 target (autocast does the bf16 matmuls). CUDA: --dtype, bf16 by default.
    dtype = None if device.type == "cpu" else (getattr(args, "dtype", None) or "bf16")
    target = load_target(preset["target"], device=str(device), dtype=dtype)
    cfg = _train_config(preset, args)
    store, train_ids, heldout_ids = load_window(tokens_dir(args.preset), features_dir(args.preset), cfg.heldout_seqs,
                                                getattr(args, "max_shards", None), getattr(args, "first_shard", 0))
    for name, n_shards in map(_also_data, getattr(args, "also_data", None) or []):
        other = get_preset(name)
        if (other["target"], other["drafter"]["target_layer_ids"]) != (preset["target"], preset["drafter"]["target_layer_ids"]):
            raise UserError(f"--also-data {name}: its features come from another target or other layers")
        added = store.add_shards(tokens_dir(name), features_dir(name), n_shards)
        print(f"[train] + {len(added)} training sequences of {name}", flush=True)
        train_ids += list(added)
    return target, store, cfg, train_ids, heldout_ids


def _also_data(spec: str) -> tuple[str, int | None]:
    """'PRESET' or 'PRESET:N' -> (preset, shard limit)."""
    name, _, n = spec.partition(":")
    if n and not n.isdigit():
        raise UserError(f"--also-data {spec!r}: N must be a whole number of shards")
    return name, int(n) if n else None


def _stage_train(args, preset) -> dict:
    t_start = time.time()
    dist = DistContext.from_env(getattr(args, "device", "cpu"))
    target, store, cfg, train_ids, heldout_ids = _load(args, preset, dist.device)
    spec = _drafter_spec(preset, args)
    if args.init_from:
        drafter = DominoDrafter.from_pretrained(args.init_from).to(dist.device)
        phase_init = f"from {args.init_from}"
        grown = (args.drafter_layers or drafter.cfg.num_layers, args.gru_hidden or drafter.cfg.gru_hidden_dim)
        if grown != (drafter.cfg.num_layers, drafter.cfg.gru_hidden_dim):
            drafter = grow(drafter, *grown, seed=cfg.seed)
            phase_init += f", grown to {grown[0]} layers and GRU {grown[1]}"
    else:
        drafter = drafter_from_preset(target, spec, init=cfg.init, seed=cfg.seed).to(dist.device)
        phase_init = cfg.init
    drafter.check_matches(target)
    ckpt = features_dir(args.preset) / "ckpt" / f"{args.run_name}.pt"
    if args.fresh and ckpt.exists():
        ckpt.unlink()
    data = {"sequences (train)": len(train_ids), "sequences (held-out)": len(heldout_ids),
            "tokens (all)": store.num_tokens(), "response tokens (all)": store.num_response_tokens(),
            "token ids": str(tokens_dir(args.preset).relative_to(REPO_ROOT))
            if tokens_dir(args.preset).is_relative_to(REPO_ROOT) else str(tokens_dir(args.preset)),
            "generation": json.dumps(preset["data"]),
            **({"also trained on": ", ".join(args.also_data)} if getattr(args, "also_data", None) else {})}
    print(f"[train] {data}", flush=True)
    phase = {"command": _command_line(), "commit": git_commit(REPO_ROOT), "schedule_steps": cfg.steps,
             "init": phase_init,
             "stop_at": cfg.stop_at, "shards": len(store.shards), "first_shard": getattr(args, "first_shard", 0),
             "train_sequences": len(train_ids),
             "response_tokens": data["response tokens (all)"]}
    history = train(target, drafter, store, train_ids, heldout_ids, cfg, ckpt_path=ckpt, dist=dist, phase=phase,
                    draft_vocab=("remap" if args.draft_vocab == "data" else "keep") if args.init_from else "data")
    if not dist.is_main:
        dist.close()
        return {}
    # final evaluation in fp32, like inference (periodic ones follow --autocast)
    final_eval = evaluate_chain(target, drafter, store, heldout_ids, anchors_per_seq=cfg.eval_anchors_per_seq)
    print("[eval] final (fp32): " + format_eval(final_eval), flush=True)
    out = Path(args.out) if args.out else DEFAULT_EXPORT.get(args.preset, REPO_ROOT / "assets" / f"drafter-{args.preset}")
    record = {"preset": args.preset, "steps": min(cfg.steps, cfg.stop_at or cfg.steps), "schedule_steps": cfg.steps,
              "init": phase_init,
              "train_tokens": data["response tokens (all)"], "train_sequences": data["sequences (train)"],
              "command": _command_line()}
    if args.init_from:  # the drafter this leg started from (its own record: the checkpoint's lineage)
        record["parent"] = training_record(args.init_from)
    size = export(drafter, out, record=record)
    summary = summarize(history)
    write_json(features_dir(args.preset) / "ckpt" / f"{args.run_name}-summary.json",
               {"summary": summary, "eval": history["eval"], "data": data})
    kept = read_card_sections(out / "TRAINING.md", KEPT_CARD_SECTIONS)
    card = write_card(out, command=_command_line(), repo=REPO_ROOT, preset=args.preset,
                      preset_config={"drafter": spec, "train": {**cfg.__dict__, "init": phase_init}, "data": preset["data"]},
                      data=data, train_summary=summary,
                      eval_results={"teacher_forced_chain (held-out train slice)": final_eval},
                      steps=min(cfg.steps, cfg.stop_at or cfg.steps), wall_seconds=history["seconds"],
                      extra={"export size (MB)": f"{size / 1e6:.1f}",
                             "process wall time incl. loading (min)": f"{(time.time() - t_start) / 60:.1f}"})
    curve = training_curve_section(history, cfg, drafter.block_size, out)
    if curve:
        replace_card_section(card, "τ against training tokens", curve)
    legs = history_section(history)
    if legs:
        replace_card_section(card, "History of this run", legs)
    for title, body in kept.items():
        replace_card_section(card, title, body)
    print(f"[train] exported {out} ({size / 1e6:.1f} MB), card {card}", flush=True)
    dist.close()
    return {"summary": summary, "eval": final_eval, "export": str(out), "size_bytes": size}


def _stage_eval(args, preset) -> dict:
    target, store, cfg, _, heldout_ids = _load(args, preset)
    folder = args.drafter or args.out or DEFAULT_EXPORT.get(args.preset)
    drafter = DominoDrafter.from_pretrained(folder)
    ev = evaluate_chain(target, drafter, store, heldout_ids, anchors_per_seq=cfg.eval_anchors_per_seq)
    print("[eval] " + format_eval(ev), flush=True)
    return ev


def train_command(args) -> int:
    """The exit status of a training command, for both entry points: 0 once its stages ran (they log their
    own results; the result dict itself, passed to sys.exit, would read as exit status 1)."""
    run_train(args)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dartree.train", description="Train a DARTree drafter")
    add_train_arguments(p)
    return run_command(train_command, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
