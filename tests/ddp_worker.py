"""One rank of the 2-process DDP smoke test (launched by torchrun from test_train_distributed.py)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_train import random_prompts, store_of, tiny_drafter, tiny_target  # noqa: E402

from dartree.train import stream  # noqa: E402
from dartree.train.distributed import DistContext  # noqa: E402
from dartree.train.trainer import TrainConfig, split_heldout, train  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist = DistContext.from_env("cpu")
    target = tiny_target()
    store = store_of(stream.generate_batch(target, random_prompts(12), 16, (0, 1)))
    train_ids, held = split_heldout(store, 2)
    drafter = tiny_drafter()
    cfg = TrainConfig(steps=2, lr=3e-3, warmup_steps=1, seqs_per_step=2, anchors_per_seq=4, eval_every=2,
                      ckpt_every=0, log_every=1, heldout_seqs=2, autocast="off")
    lines = []
    hist = train(target, drafter, store, train_ids, held, cfg, log=lines.append, dist=dist)
    torch.save({"state": drafter.state_dict(), "log": lines, "loss": hist["loss"], "world": dist.world},
               out / f"rank{dist.rank}.pt")
    dist.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
