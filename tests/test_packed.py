"""MKL-packed linears (dartree.models.packed): same results as F.linear, lazy, bounded, never stale."""

import pytest
import torch
import torch.nn.functional as F

from dartree.models.packed import (MAX_ROWS, PackedWeights, packed_linear, packing_available, unpacked,
                                  use_packed_linears)

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no MKL packed GEMM")


def make_linear(out=48, inp=32, bias=False, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(inp, out, bias=bias)
    lin.weight.requires_grad_(False)
    return lin


@pytest.mark.parametrize("rows", [2, 7, 17, 65])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_linear(rows, bias):
    lin = make_linear(bias=bias)
    packs = PackedWeights()
    x = torch.randn(1, rows, 32)
    first = packed_linear(lin, x, packs)  # first sighting: plain path, nothing packed
    assert len(packs) == 0
    second = packed_linear(lin, x, packs)  # second: packed
    assert len(packs) == 1
    ref = F.linear(x, lin.weight, lin.bias)
    assert second.shape == ref.shape
    torch.testing.assert_close(second, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first, ref, rtol=0, atol=0)


def test_single_rows_long_inputs_and_grad_take_the_plain_path():
    lin = make_linear()
    packs = PackedWeights()
    for _ in range(3):
        packed_linear(lin, torch.randn(1, 32), packs)
        packed_linear(lin, torch.randn(MAX_ROWS + 1, 32), packs)
    assert len(packs) == 0
    trainable = torch.nn.Linear(32, 48)
    x = torch.randn(8, 32)
    for _ in range(3):
        out = packed_linear(trainable, x, packs)
    out.sum().backward()
    assert trainable.weight.grad is not None and len(packs) == 0


def test_lru_is_bounded_in_bytes():
    lin = make_linear()
    nbytes = lin.weight.numel() * 4
    packs = PackedWeights(budget_bytes=3 * nbytes)
    for rows in range(2, 10):
        for _ in range(2):
            packed_linear(lin, torch.randn(rows, 32), packs)
    assert len(packs) == 3 and packs.bytes == 3 * nbytes


def test_in_place_weight_update_never_uses_a_stale_pack():
    lin = make_linear()
    packs = PackedWeights()
    x = torch.randn(9, 32)
    packed_linear(lin, x, packs)
    packed_linear(lin, x, packs)
    with torch.no_grad():
        lin.weight.mul_(2.0)
    for _ in range(2):
        out = packed_linear(lin, x, packs)
    torch.testing.assert_close(out, F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


def test_use_packed_linears_routes_a_model_and_keeps_its_output():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(17, 16)
    with torch.no_grad():
        ref = model(x)
        packs = use_packed_linears(model)
        model(x)
        out = model(x)
    assert len(packs) == 2
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_unpacked_packs_nothing_and_restores_on_exit():
    lin = make_linear()
    packs = PackedWeights()
    x = torch.randn(9, 32)
    with unpacked():
        with unpacked():
            pass
        for _ in range(3):  # still off after the nested block ended
            out = packed_linear(lin, x, packs)
    assert len(packs) == 0
    torch.testing.assert_close(out, F.linear(x, lin.weight), rtol=0, atol=0)
    for _ in range(2):
        packed_linear(lin, x, packs)
    assert len(packs) == 1


def test_a_prompt_prefilled_twice_leaves_no_pack_for_its_length():
    """An interleaved bench prefills each prompt once per configuration: the prompt's row count must not
    be packed (it would evict the verify widths' packs), while repeated verify widths still are."""
    from dartree.engine import DecodeSettings, generate
    from tests.tiny import tiny_drafter, tiny_target

    target = tiny_target()
    drafter = tiny_drafter(target)
    packs = use_packed_linears(target.model)
    use_packed_linears(drafter, packs, skip=("embed_proj",))
    target.packed_weights = packs
    prompt = list(range(3, 3 + 23))
    for _ in range(2):
        generate(target, drafter, prompt, DecodeSettings(method="dartree", width=2, budget=5, max_new_tokens=12))
    rows = {key[-1] for key in packs._packs}
    assert 23 not in rows and 6 in rows  # the prompt's 23 rows never; B + 1 = 6 verify rows yes
