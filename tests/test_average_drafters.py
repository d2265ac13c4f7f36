"""scripts/average_drafters.py on tiny drafters: the average of two exports loads as a drafter whose every
weight is the interpolation of theirs, alpha = 0 gives the first back bit for bit, and drafters that do not
share a draft vocabulary are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dartree.models.drafter import DominoDrafter
from dartree.models.loading import describe_checkpoint
from dartree.train.trainer import export
from tiny import tiny_drafter, tiny_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import average_drafters  # noqa: E402


@pytest.fixture
def two_exports(tmp_path):
    target = tiny_target()
    folders = []
    for seed in (1, 2):
        folder = tmp_path / f"d{seed}"
        export(tiny_drafter(target, seed=seed, draft_vocab_size=40), folder, record={"steps": seed})
        folders.append(folder)
    return folders


def test_the_average_interpolates_every_weight_and_loads(two_exports, tmp_path):
    a, b = two_exports
    average_drafters.main([str(a), str(b), "--alpha", "0.25", "--out", str(tmp_path / "avg")])
    wa, wb, avg = (load_file(d / average_drafters.WEIGHTS) for d in (a, b, tmp_path / "avg"))
    differ = 0  # tensors where the two seeds differ (norm weights start equal), so the check checks something
    for name, x in wa.items():
        if x.is_floating_point():
            want = (0.75 * x.float() + 0.25 * wb[name].float()).to(x.dtype)
            torch.testing.assert_close(avg[name], want, rtol=0, atol=0)
            differ += not torch.equal(x, wb[name])
        else:
            assert torch.equal(avg[name], x)
    assert differ >= len(wa) // 2
    drafter = DominoDrafter.from_pretrained(tmp_path / "avg")
    assert drafter.block_size == DominoDrafter.from_pretrained(a).block_size
    assert describe_checkpoint(tmp_path / "avg") == ("trained on ? response tokens, 2 steps, then weight-averaged "
                                                     "with one trained on ? response tokens, 1 steps (0.25 of this "
                                                     "one, 0.75 of that one) (see avg/TRAINING.md)")
    average_drafters.main([str(a), str(b), "--alpha", "0", "--out", str(tmp_path / "same")])
    assert all(torch.equal(t, wa[k]) for k, t in load_file(tmp_path / "same" / average_drafters.WEIGHTS).items())


def test_drafters_with_other_draft_vocabularies_are_refused(two_exports, tmp_path):
    a, b = two_exports
    w = load_file(b / average_drafters.WEIGHTS)
    name = next(k for k, t in w.items() if not t.is_floating_point())
    w[name] = torch.flip(w[name], [0])
    save_file(w, b / average_drafters.WEIGHTS)
    with pytest.raises(SystemExit, match="draft vocabulary"):
        average_drafters.main([str(a), str(b), "--out", str(tmp_path / "avg")])
    with pytest.raises(SystemExit, match="alpha"):
        average_drafters.main([str(a), str(a), "--alpha", "2", "--out", str(tmp_path / "avg")])
