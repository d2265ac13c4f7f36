"""The data-parallel training path: a real 2-process torchrun launch with gloo on tiny random models."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def test_two_rank_gloo_smoke_run_keeps_ranks_in_sync(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           str(HERE / "ddp_worker.py"), str(tmp_path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2
    # each rank saw its own sequences (different losses) but DDP averaged the gradients: same weights
    assert r0["loss"] != r1["loss"]
    for (k, a), (_, b) in zip(r0["state"].items(), r1["state"].items()):
        assert torch.equal(a, b), k
    sys.path.insert(0, str(HERE))
    from test_train import tiny_drafter

    init = tiny_drafter().state_dict()
    assert any(not torch.equal(init[k], v) for k, v in r0["state"].items())  # it did train
    assert any("[train] step 2/2" in line for line in r0["log"]) and any("[eval]" in line for line in r0["log"])
    assert r1["log"] == []  # only rank 0 logs, evaluates and checkpoints


def test_cuda_request_without_a_gpu_is_a_clear_error():
    from dartree.errors import UserError
    from dartree.train.distributed import DistContext

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError, match="no CUDA device"):
        DistContext.from_env("cuda")


def test_device_and_dtype_arguments_parse():
    import argparse

    from dartree.train.cli import add_train_arguments

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    args = p.parse_args(["--stage", "train", "--device", "cuda", "--dtype", "bf16"])
    assert (args.device, args.dtype) == ("cuda", "bf16")
    with pytest.raises(SystemExit):
        p.parse_args(["--device", "tpu"])


def test_gpu_preset_describes_a_valid_qwen3_class_drafter():
    from dartree.models.drafter import DrafterConfig, make_config
    from dartree.train.presets import get_preset

    preset = get_preset("qwen3-4b-gpu")
    cfg = DrafterConfig.from_dict(make_config(**preset["drafter"]))
    assert cfg.block_size == 16 and cfg.has_correction
    assert all(0 <= i < 36 for i in cfg.target_layer_ids) and len(cfg.target_layer_ids) == 5
    assert preset["target"] == "Qwen/Qwen3-4B" and cfg.vocab_size == 151936
