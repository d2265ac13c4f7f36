"""The drafter's config.json: the fields of the public Domino layout that the drafter reads, and the one
place that maps a draft depth to its block row (`DrafterConfig.first_draft_row`, from ``shift_label``).

``make_config`` writes such a dict (tests, the random drafter, the trainer); ``build_target_layer_ids``
is DFlash's choice of target layers to read features from.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

REQUIRED_DFLASH_KEYS = ("target_layer_ids", "mask_token_id")


def build_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """Evenly spaced target layers from the second to the fourth-from-last (the DFlash convention)."""
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (count - 1))) for i in range(count)]


@dataclass(frozen=True)
class DrafterConfig:
    """The fields of the Qwen3-style config that the drafter reads; `raw` keeps the rest for saving."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    projector_type: str | None
    emb_dim: int
    gru_hidden_dim: int
    pure_draft_prefix_len: int
    draft_vocab_size: int  # 0: the full vocabulary
    shift_label: bool  # True: block row d-1 drafts depth d (the public Domino checkpoints); False: row d
    raw: dict

    @classmethod
    def from_dict(cls, raw: dict) -> "DrafterConfig":
        try:
            dcfg = raw.get("dflash_config") or {}
            missing = [k for k in REQUIRED_DFLASH_KEYS if k not in dcfg]
            if missing:
                raise KeyError(f"dflash_config.{missing[0]}")
            rope = raw.get("rope_parameters") or {}
            theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
            heads = int(raw["num_attention_heads"])
            projector = dcfg.get("projector_type")
            if projector not in (None, "domino"):
                raise UserError(f"drafter projector_type {projector!r} is not supported (only 'domino' or none)")
            shift_label = dcfg.get("shift_label", False)
            if not isinstance(shift_label, bool):
                raise UserError(f"drafter dflash_config.shift_label must be true or false, got {shift_label!r}")
            cfg = cls(
                hidden_size=int(raw["hidden_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads", heads)),
                head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
                intermediate_size=int(raw["intermediate_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                vocab_size=int(raw["vocab_size"]),
                block_size=int(raw["block_size"]),
                num_target_layers=int(raw["num_target_layers"]),
                target_layer_ids=tuple(int(i) for i in dcfg["target_layer_ids"]),
                mask_token_id=int(dcfg["mask_token_id"]),
                projector_type=projector,
                emb_dim=int(dcfg.get("emb_dim", 0)),
                gru_hidden_dim=int(dcfg.get("gru_hidden_dim", 0)),
                pure_draft_prefix_len=int(dcfg.get("pure_draft_prefix_len", 0)),
                draft_vocab_size=int(dcfg.get("draft_vocab_size", 0) or 0),
                shift_label=shift_label,
                raw=raw,
            )
        except KeyError as exc:
            raise UserError(f"drafter config.json lacks the field {exc.args[0]}") from exc
        if cfg.max_depth < 1:
            raise UserError(f"drafter block_size {cfg.block_size} drafts no depth (shift_label {cfg.shift_label})")
        return cfg

    @property
    def has_correction(self) -> bool:
        return self.projector_type == "domino"

    @property
    def output_size(self) -> int:
        """Columns of the drafter's logits: the draft vocabulary, or the whole vocabulary."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def first_draft_row(self) -> int:
        """The block row that drafts depth 1 (depth d uses row first_draft_row + d - 1)."""
        return 0 if self.shift_label else 1

    @property
    def max_depth(self) -> int:
        """Depths one block drafts: the rows from `first_draft_row` to the block's end."""
        return self.block_size - self.first_draft_row


def make_config(*, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int,
                vocab_size: int, num_target_layers: int, target_layer_ids, mask_token_id: int,
                num_layers: int = 2, block_size: int = 8, emb_dim: int = 128, gru_hidden_dim: int = 256,
                pure_draft_prefix_len: int = 0, rope_theta: float = 10000.0, rms_norm_eps: float = 1e-6,
                max_position_embeddings: int = 8192, correction: bool = True, draft_vocab_size: int = 0,
                shift_label: bool = False) -> dict:
    """A config.json dict in the public Domino layout (Qwen3-style with a dflash_config)."""
    dflash = {"target_layer_ids": list(target_layer_ids), "mask_token_id": int(mask_token_id),
              "shift_label": bool(shift_label)}
    if correction:
        dflash.update(projector_type="domino", emb_dim=emb_dim, gru_hidden_dim=gru_hidden_dim,
                      pure_draft_prefix_len=pure_draft_prefix_len)
    if draft_vocab_size:
        dflash["draft_vocab_size"] = int(draft_vocab_size)
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_act": "silu",
        "hidden_size": hidden_size, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads, "head_dim": head_dim, "intermediate_size": intermediate_size,
        "rms_norm_eps": rms_norm_eps, "rope_theta": rope_theta, "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings, "attention_bias": False, "tie_word_embeddings": False,
        "block_size": block_size, "num_target_layers": num_target_layers, "dflash_config": dflash,
    }
