"""Resolve `--target` / `--drafter` names into loaded models, once per process.

Drafter names:
- ``default``: the drafter shipped in ``assets/drafter-smollm2`` for the embedded target;
- ``random``: a seeded random drafter shaped for the target, for tests and for showing that
  correctness does not depend on the drafter; everything that reports on it says "untrained";
- a checkpoint folder or a hub id in the public Domino layout.
A named checkpoint that is missing or corrupt is an error, never a silent switch to random weights.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError
from .drafter import DominoDrafter, build_target_layer_ids, make_config
from .gguf_panels import head_block_panels, target_block_panels
from .packed import use_packed_linears
from .rows_kernel import describe_linear_path, route_like_target, use_rows_kernel
from .target import EMBEDDED_NAME, Target, load_target

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DRAFTER = REPO_ROOT / "assets" / "drafter-smollm2"
SMOLLM2_MASK_TOKEN = 16  # <empty_output>: a special token a chat never produces


@dataclass
class Models:
    target: Target
    drafter: DominoDrafter | None
    drafter_name: str
    drafter_description: str  # shown next to every number measured with it

    @property
    def trained(self) -> bool:
        return not self.drafter_description.startswith("UNTRAINED")


def random_drafter(target: Target, seed: int = 0, num_layers: int = 2, block_size: int = 8) -> DominoDrafter:
    """A random Domino drafter whose shapes fit `target` (hidden size, vocabulary, layers)."""
    cfg = target.config
    heads = cfg.num_attention_heads
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    config = make_config(
        hidden_size=cfg.hidden_size, num_heads=heads, num_kv_heads=getattr(cfg, "num_key_value_heads", heads),
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, intermediate_size=cfg.intermediate_size,
        vocab_size=target.vocab_size, num_target_layers=cfg.num_hidden_layers,
        target_layer_ids=build_target_layer_ids(cfg.num_hidden_layers, min(5, cfg.num_hidden_layers)),
        mask_token_id=SMOLLM2_MASK_TOKEN if target.vocab_size > SMOLLM2_MASK_TOKEN else 0,
        num_layers=num_layers, block_size=block_size, rope_theta=float(rope))
    gen = torch.get_rng_state()
    torch.manual_seed(seed)
    drafter = DominoDrafter(config)
    torch.set_rng_state(gen)
    return drafter


def training_record(folder: Path) -> dict | None:
    """The ``dartree_training`` record the trainer's export wrote into a drafter's config.json (None: none)."""
    return json.loads((Path(folder) / "config.json").read_text()).get("dartree_training")


def describe_checkpoint(folder: Path) -> str:
    info = training_record(folder)
    if not info:
        return f"checkpoint {folder.name} (no training record)"
    text = f"trained on {_training_amount(info)}"
    if info.get("parent"):  # a fine-tuning leg (--init-from) records the drafter it started from
        text += f", fine-tuned from one trained on {_training_amount(info['parent'])}"
    if info.get("averaged"):  # scripts/average_drafters.py: this record is the second drafter's, plus the first's
        avg, first = info["averaged"], info["averaged"].get("a_record") or {}
        other = "that one" if first == info.get("parent") else f"one trained on {_training_amount(first)}"
        text += f", then weight-averaged with {other} ({avg['alpha']:g} of this one, {1 - avg['alpha']:g} of that one)"
    return f"{text} (see {folder.name}/TRAINING.md)"


def _training_amount(info: dict) -> str:
    tokens = info.get("train_tokens")
    tokens = f"{tokens:,}" if isinstance(tokens, int) else "?"
    return f"{tokens} response tokens, {info.get('steps', '?')} steps"


def load_drafter(name: str, target: Target) -> tuple[DominoDrafter | None, str]:
    """Returns the drafter (on the target's device and dtype) and a one-line description."""
    if name in (None, "", "none"):
        return None, "no drafter"
    if name == "random":
        drafter, description = random_drafter(target), "UNTRAINED: random initialisation (seed 0)"
    else:
        folder = SHIPPED_DRAFTER if name == "default" else Path(name).expanduser()
        if name == "default" and target.name != EMBEDDED_NAME:
            raise UserError("there is no shipped drafter for this target: pass --drafter PATH_OR_HUB_ID")
        if name == "default" and not folder.exists():
            raise UserError(f"the shipped drafter {folder} is missing (a partial checkout?); restore it with "
                            "`git checkout -- assets/drafter-smollm2`, or pass --drafter random to run untrained")
        drafter = DominoDrafter.from_pretrained(folder if folder.exists() else name)
        description = describe_checkpoint(folder) if folder.exists() else f"checkpoint {name}"
    drafter.check_matches(target)
    return drafter.to(device=target.device, dtype=target.dtype).keep_gru_fp32().eval(), description


_LOADED: dict = {}


def load_models(target: str = EMBEDDED_NAME, drafter: str = "default", device: str = "auto",
                dtype: str | None = None) -> Models:
    """Load (or reuse) target and drafter; the app calls this once per process, not once per click."""
    key = (target, drafter, device, dtype)
    if key not in _LOADED:
        tgt_key = (target, device, dtype)
        tgt = _LOADED.get(tgt_key) or load_target(target, device=device, dtype=dtype)
        if tgt_key not in _LOADED:
            # CPU fp32 linears: the row-streaming kernel where it builds (streaming the GGUF's blocks where
            # they rebuild the weights exactly), else MKL's packed GEMM
            blocks, tgt.linear_weights = target_block_panels(tgt)
            tgt.rows_kernel = use_rows_kernel(tgt.model, blocks=blocks)
            tgt.weights = "gguf" if blocks and tgt.rows_kernel else "fp32"
            tgt.head_blocks = head_block_panels(tgt, blocks) if tgt.rows_kernel else None  # the draft head's
            tgt.packed_weights = None if tgt.rows_kernel else use_packed_linears(tgt.model)
            if tgt.device.type == "cpu":  # stderr: the CLI's --json output stays clean
                print(f"[dartree] {describe_linear_path(tgt)}", file=sys.stderr, flush=True)
        _LOADED[tgt_key] = tgt
        model, description = load_drafter(drafter, tgt)
        if model is not None:
            route_like_target(model, tgt, skip=("embed_proj",))
        _LOADED[key] = Models(tgt, model, drafter, description)
    return _LOADED[key]
