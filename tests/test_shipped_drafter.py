"""The drafter shipped in assets/ is the default, loads through the public Domino path, fits the target."""

import json

import pytest
import torch

from dartree.errors import UserError
from dartree.models import loading
from dartree.models.drafter import DominoDrafter
from dartree.train.presets import PRESETS

pytestmark = pytest.mark.real


def test_shipped_checkpoint_is_small_16_bit_and_documented():
    folder = loading.SHIPPED_DRAFTER
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert "config.json" in files and "TRAINING.md" in files
    weights = [n for n in files if n.endswith(".safetensors")]
    assert weights and sum(files.values()) <= 40e6, files
    from safetensors import safe_open

    with safe_open(str(folder / weights[0]), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    # every weight in 16 bits; the draft vocabulary is the one integer tensor (token ids)
    assert {d for k, d in dtypes.items() if k != "draft_vocab"} <= {"BF16", "F16"}, dtypes
    assert dtypes.get("draft_vocab") == "I64"
    card = (folder / "TRAINING.md").read_text()
    assert "python -m dartree.train --preset smollm2-cpu" in card and "git commit" in card
    info = json.loads((folder / "config.json").read_text())["dartree_training"]
    assert info["steps"] >= 1000


def test_shipped_checkpoint_loads_by_default_and_matches_the_target(real_target):
    drafter, description = loading.load_drafter("default", real_target)
    assert description.startswith("trained on") and "UNTRAINED" not in description
    cfg, preset = drafter.cfg, PRESETS["smollm2-cpu"]["drafter"]
    assert cfg.hidden_size == real_target.hidden_size == preset["hidden_size"]
    assert cfg.vocab_size == real_target.vocab_size
    assert list(cfg.target_layer_ids) == preset["target_layer_ids"]
    assert cfg.num_target_layers == real_target.num_layers
    assert cfg.has_correction
    # its draft vocabulary is the preset's size, ascending ids of the target's vocabulary, end of turn included
    assert cfg.draft_vocab_size == preset["draft_vocab_size"] == drafter.draft_vocab.numel()
    ids = drafter.draft_vocab.cpu()
    assert bool((ids[1:] > ids[:-1]).all()) and 0 <= int(ids[0]) and int(ids[-1]) < real_target.vocab_size
    assert set(real_target.eos_token_ids) <= set(ids.tolist())
    # the same public loader a hub checkpoint uses (Huang2020/Qwen3-4B-Domino-b16's layout)
    again = DominoDrafter.from_pretrained(loading.SHIPPED_DRAFTER)
    for (k, a), (_, b) in zip(again.state_dict().items(), drafter.state_dict().items()):
        assert torch.equal(a.float(), b.float().cpu()), k


def test_a_missing_shipped_checkpoint_is_an_error_not_random_weights(real_target, monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "SHIPPED_DRAFTER", tmp_path / "gone")
    with pytest.raises(UserError, match="missing"):
        loading.load_drafter("default", real_target)
