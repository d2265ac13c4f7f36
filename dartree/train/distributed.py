"""Data parallelism for drafter training through PyTorch's own DDP, launched by `torchrun`.

    torchrun --nproc_per_node 8 -m dartree.train --preset NAME --stage train --device cuda --dtype bf16

`torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK; `DistContext.from_env` joins the process group (NCCL on
CUDA, gloo on CPU) and every rank trains on its own sample of sequences (seed + rank), while DDP
averages the gradients. Rank 0 alone logs, evaluates, checkpoints and exports. Without torchrun the
context is a single process and nothing here changes the training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

from ..errors import UserError
from .batch import drafter_logits


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, device: str = "cpu") -> "DistContext":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            if not torch.cuda.is_available():
                raise UserError("--device cuda: no CUDA device is visible to this process")
            dev = torch.device("cuda", local)
            torch.cuda.set_device(dev)
        elif device == "cpu":
            dev = torch.device("cpu")
        else:
            raise UserError(f"--device must be cpu, cuda or auto, got {device!r}")
        if world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        return cls(rank, world, local, dev)

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if not self.distributed:
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class DrafterLoss(torch.nn.Module):
    """The module DDP wraps: its forward is the drafter's training pass over a batch.

    The frozen target is held outside the module tree, so DDP neither broadcasts nor tracks its
    weights; only the drafter's parameters are synchronised.
    """

    def __init__(self, drafter, target):
        super().__init__()
        self.drafter = drafter
        object.__setattr__(self, "_target", target)

    def forward(self, batch):
        return drafter_logits(self._target, self.drafter, batch)
