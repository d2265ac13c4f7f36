"""The row-streaming CPU linear (models/rows_linear.c): close to F.linear, and bit-exact per row.

Bit-exactness per row is what keeps tree verification lossless: plain decoding runs one row at a time,
a verify runs B + 1 rows at once, and each row must get the same bits either way. The reference for
that is brute force: every row computed alone.
"""

import pytest
import torch
import torch.nn.functional as F

from dartree.models import rows_kernel
from dartree.models.rows_kernel import panel_weight, rows_kernel_available, rows_linear, use_rows_kernel

pytestmark = pytest.mark.skipif(not rows_kernel._cpu_has_avx512f(), reason="the kernel needs AVX-512F")


def test_the_kernel_builds_and_loads_on_this_machine():
    assert rows_kernel_available(), rows_kernel.rows_kernel_status()


@pytest.mark.parametrize("n,k", [(64, 32), (37, 576), (49, 23), (16, 1536), (1, 7), (96, 17)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear_and_each_row_is_bitwise_its_own_single_row_result(n, k, with_bias):
    torch.manual_seed(n * 1000 + k)
    w = torch.randn(n, k)
    b = torch.randn(n) if with_bias else None
    panels = panel_weight(w)
    for m in (1, 2, 5, 11, 12, 13, 30):
        x = torch.randn(m, k)
        y = rows_linear(x, panels, n, b)
        torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-4, atol=1e-4 * k ** 0.5)
        for i in range(m):  # brute force: the row alone, and the row among other rows
            assert torch.equal(rows_linear(x[i:i + 1], panels, n, b)[0], y[i])
            others = torch.randn(7, k)
            mixed = torch.cat([others[:3], x[i:i + 1], others[3:]])
            assert torch.equal(rows_linear(mixed, panels, n, b)[3], y[i])


def test_leading_dimensions_and_strided_rows():
    torch.manual_seed(0)
    w = torch.randn(40, 24)
    wide = torch.randn(2, 5, 48)
    x = wide[..., ::2]  # last dimension not contiguous: copied, same result
    got = rows_linear(x, panel_weight(w), 40)
    assert got.shape == (2, 5, 40)
    assert torch.equal(got, rows_linear(x.contiguous(), panel_weight(w), 40))
    rows = torch.randn(6, 64)[:, :24]  # rows with a stride of 64: read in place
    assert torch.equal(rows_linear(rows, panel_weight(w), 40), rows_linear(rows.contiguous(), panel_weight(w), 40))
    assert rows_linear(torch.randn(0, 24), panel_weight(w), 40).shape == (0, 40)


def test_a_routed_model_keeps_its_output_training_and_weight_updates():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(), torch.nn.Linear(50, 3, bias=False))
    x = torch.randn(4, 20)
    before = model(x)
    assert use_rows_kernel(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
    # autograd still works (training takes F.linear) ...
    model(x).sum().backward()
    assert model[0].weight.grad is not None
    # ... and an in-place update is seen by the next no-grad call (the panels are rebuilt)
    with torch.no_grad():
        model[2].weight.mul_(2)
        torch.testing.assert_close(model(x), 2 * before.detach(), rtol=1e-5, atol=1e-5)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(rows_kernel, "_state", {})
    monkeypatch.setenv("DARTREE_ROWS_KERNEL", "0")
    assert not rows_kernel_available()
    assert "DARTREE_ROWS_KERNEL=0" in rows_kernel.rows_kernel_status()
    model = torch.nn.Linear(3, 3)
    assert not use_rows_kernel(model)
    assert "forward" not in model.__dict__


def test_a_tree_decode_through_the_kernel_equals_plain_decoding():
    """Tiny random target and drafter, both routed: every tree method's greedy output equals AR's."""
    from dartree import TREE_METHODS
    from dartree.engine import DecodeSettings, generate
    from tests.tiny import tiny_drafter, tiny_target

    target = tiny_target()
    drafter = tiny_drafter(target)
    assert use_rows_kernel(target.model) and use_rows_kernel(drafter, skip=("embed_proj",))
    target.rows_kernel = True
    prompt = list(range(3, 20))
    ref = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=40)).token_ids
    for method in TREE_METHODS:
        got = generate(target, drafter, prompt, DecodeSettings(method=method, width=3, budget=9,
                                                               max_new_tokens=40)).token_ids
        assert got == ref, method


def test_the_draft_head_of_a_reduced_vocabulary_goes_through_the_kernel_too():
    """The head is built lazily inside the decoder's inference mode; it must get panels and stay exact."""
    from dartree.engine import DecodeSettings, generate
    from tests.test_draft_vocab import vocab_drafter
    from tests.tiny import tiny_target

    target = tiny_target()
    assert use_rows_kernel(target.model)
    target.rows_kernel = True
    drafter = vocab_drafter(target)
    use_rows_kernel(drafter, skip=("embed_proj",))
    prompt = [4, 9, 33, 12, 7]
    ref = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=20)).token_ids
    for _ in range(2):  # the second run meets the cached head
        got = generate(target, drafter, prompt, DecodeSettings(method="dartree", width=3, budget=8, candidates=6,
                                                               max_new_tokens=20))
        assert got.token_ids == ref
    head = drafter._head_cache[1]
    assert "_rows_panels" in head.__dict__


def test_a_bf16_exact_weight_streams_as_bf16_with_the_fp32_results_bit_for_bit():
    torch.manual_seed(3)
    w = torch.randn(70, 50).to(torch.bfloat16).float()  # every value an exact bf16 number
    b = torch.randn(70)
    half, full = panel_weight(w), panel_weight(w, allow_bf16=False)
    assert half.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert panel_weight(w + 1e-3).dtype == torch.float32  # not exact: stays fp32
    for m in (1, 4, 13):
        x = torch.randn(m, 50)
        assert torch.equal(rows_linear(x, half, 70, b), rows_linear(x, full, 70, b))


def test_the_kernel_gru_cell_matches_torch():
    torch.manual_seed(4)
    w_ih, w_hh = torch.randn(3 * 24, 40) * 0.2, torch.randn(3 * 24, 24) * 0.2
    x, h = torch.randn(5, 40), torch.randn(5, 24)
    got = rows_kernel.gru_cell(x, h, panel_weight(w_ih), panel_weight(w_hh))
    torch.testing.assert_close(got, torch.gru_cell(x, h, w_ih, w_hh), rtol=1e-5, atol=1e-5)
