"""The Domino checkpoint format: exact round trips, the public layout, and clear errors on bad files."""

import json

import pytest
import torch
from safetensors.torch import load_file

from dartree.errors import UserError
from dartree.models.drafter import DominoDrafter, build_target_layer_ids
from dartree.models.loading import describe_checkpoint
from tiny import block_outputs, tiny_drafter, tiny_target

PUBLIC_PREFIXES = ("layers.", "fc.", "hidden_norm.", "norm.", "prefix_gru.", "embed_proj.0.", "embed_proj.2.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_exact(tmp_path, dtype):
    target = tiny_target()
    drafter = tiny_drafter(target)
    if dtype != torch.float32:  # 16-bit storage: compare against the same rounding
        drafter.load_state_dict({k: v.to(dtype).float() for k, v in drafter.state_dict().items()})
    drafter.save_pretrained(tmp_path, dtype=dtype)
    loaded = DominoDrafter.from_pretrained(tmp_path)
    for a, b in zip(block_outputs(drafter, target), block_outputs(loaded, target)):
        assert torch.equal(a, b)


def test_checkpoint_uses_the_public_domino_layout(tmp_path):
    target = tiny_target()
    tiny_drafter(target, prefix=1).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("block_size", "num_target_layers", "hidden_size", "num_hidden_layers", "vocab_size"):
        assert key in config
    dcfg = config["dflash_config"]
    assert dcfg["projector_type"] == "domino"
    for key in ("target_layer_ids", "mask_token_id", "emb_dim", "gru_hidden_dim", "pure_draft_prefix_len"):
        assert key in dcfg
    names = load_file(str(tmp_path / "model.safetensors")).keys()
    assert all(n.startswith(PUBLIC_PREFIXES) for n in names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0",
            "embed_proj.0.weight", "embed_proj.2.weight", "layers.0.self_attn.q_norm.weight"} <= set(names)
    assert not any("bias" in n for n in names)


def test_a_qwen3_style_config_with_rope_parameters_loads(tmp_path):
    """Configs written by newer transformers carry rope_theta inside rope_parameters."""
    target = tiny_target()
    drafter = tiny_drafter(target)
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1234.0}
    del config["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert DominoDrafter.from_pretrained(tmp_path).cfg.rope_theta == 1234.0


def test_pure_draft_prefix_positions_use_base_logits_only():
    from dartree.draft import PathCorrector, BlockDraft
    target = tiny_target()
    drafter = tiny_drafter(target, prefix=2)
    block = block_outputs(drafter, target)
    from dartree.tree import Draft
    bd = BlockDraft(Draft(torch.tensor(3), block[0], block[1], block[1]), block[2])
    corr = PathCorrector(drafter, target, bd)
    states = corr.root_state()
    assert corr.residual(1, states) is None and corr.residual(2, states) is None
    assert corr.residual(3, states) is not None


def test_missing_and_corrupt_checkpoints_are_clear_errors(tmp_path):
    target = tiny_target()
    with pytest.raises(UserError, match="does not exist"):
        DominoDrafter.from_pretrained(tmp_path / "nope")
    folder = tmp_path / "ckpt"
    tiny_drafter(target).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="unreadable"):
        DominoDrafter.from_pretrained(folder)
    tiny_drafter(target).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"]["emb_dim"] = 999
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="shape"):
        DominoDrafter.from_pretrained(folder)
    (folder / "config.json").write_text("{broken")
    with pytest.raises(UserError, match="JSON"):
        DominoDrafter.from_pretrained(folder)


def test_the_description_names_a_fine_tuned_drafters_lineage(tmp_path):
    folder = tmp_path / "ckpt"
    tiny_drafter(tiny_target()).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["dartree_training"] = {"train_tokens": 1317818, "steps": 4000}
    (folder / "config.json").write_text(json.dumps(config))
    assert describe_checkpoint(folder) == "trained on 1,317,818 response tokens, 4000 steps (see ckpt/TRAINING.md)"
    config["dartree_training"]["parent"] = {"train_tokens": 2785587, "steps": 30000}
    (folder / "config.json").write_text(json.dumps(config))
    assert describe_checkpoint(folder) == ("trained on 1,317,818 response tokens, 4000 steps, fine-tuned from one "
                                           "trained on 2,785,587 response tokens, 30000 steps (see ckpt/TRAINING.md)")


def test_a_drafter_for_another_target_is_refused():
    small, other = tiny_target(vocab=64), tiny_target(vocab=80)
    with pytest.raises(UserError, match="vocabulary"):
        tiny_drafter(small).check_matches(other)


def test_target_layer_ids_follow_the_dflash_spacing():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B's DFlash drafters
    assert build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]


def test_half_precision_models_run_with_an_fp32_gru():
    """The CUDA path runs target and drafter in bf16; the GRU stays fp32. Exercised here on CPU."""
    import dataclasses
    from dartree.engine import DecodeSettings, generate

    target = tiny_target()
    target.model.to(torch.bfloat16)
    target = dataclasses.replace(target, dtype=torch.bfloat16, eos_token_ids=())
    drafter = tiny_drafter(target).to(torch.bfloat16).keep_gru_fp32()
    assert drafter.gru_dtype == torch.float32 and drafter.fc.weight.dtype == torch.bfloat16
    res = generate(target, drafter, [3, 4, 5], DecodeSettings(method="dartree", width=3, budget=8, candidates=8,
                                                              max_new_tokens=10))
    assert res.new_tokens == 10
