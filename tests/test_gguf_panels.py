"""GGUF block panels (models/gguf_panels.py, rows_linear.c "GGUF blocks"): the kernel streams a GGUF's own
Q4_1 / Q8_0 blocks and must give what the fp32 panels of the dequantised weights give, bit for bit.

The reference for every weight is `gguf.quants.dequantize`, the function the conversion to fp32 used; for
the row order of q and k, llama.cpp's own permutation (written out below, from convert_hf_to_gguf.py).
"""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants

from dartree.errors import UserError
from dartree.models import gguf_panels, rows_kernel
from dartree.models.gguf_panels import block_panels, exact_block_panels, panels_from_gguf, target_block_panels
from dartree.models.rows_kernel import (BLOCK_BYTES, describe_linear_path, panel_weight, rebuild_mismatches,
                                        rows_linear, use_rows_kernel)

pytestmark = pytest.mark.skipif(not rows_kernel._cpu_has_avx512f(), reason="the kernel needs AVX-512F")

QTYPES = {"q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


def quantised(n: int, k: int, kind: str, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """GGUF rows of a random [n, k] weight, and the fp32 weight `gguf.quants` dequantises them to."""
    w = (np.random.default_rng(seed).standard_normal((n, k)) * 0.05).astype(np.float32)
    rows = quants.quantize(w, QTYPES[kind])
    return rows, torch.from_numpy(quants.dequantize(rows, QTYPES[kind]))


def any_finite_blocks(n: int, k: int, kind: str, seed: int) -> np.ndarray:
    """GGUF rows of random bytes whose fp16 scales (and mins) are any finite fp16 number, subnormals and
    signed zeros included: the rebuild must be exact over the whole range, not just for tidy weights."""
    rng = np.random.default_rng(seed)
    size = {"q4_1": 20, "q8_0": 34}[kind]
    blocks = rng.integers(0, 256, size=(n, k // 32, size), dtype=np.uint8)
    halves = 4 if kind == "q4_1" else 2
    fp16 = rng.integers(0, 1 << 16, size=(n, k // 32, halves // 2), dtype=np.uint16)
    fp16[(fp16 & 0x7C00) == 0x7C00] &= 0x83FF  # an inf / NaN exponent becomes a subnormal
    fp16[..., 0][::7] = 0x8000  # some -0.0 scales
    blocks[..., :halves] = fp16.view(np.uint8).reshape(n, k // 32, halves)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n,k", [(64, 64), (37, 96), (5, 32), (200, 576)])
def test_block_panels_rebuild_every_weight_exactly(kind, n, k):
    rows, weight = quantised(n, k, kind, seed=n + k)
    panels = block_panels(rows, kind, k)
    assert panels.data.shape == (-(-n // 32), k // 32, BLOCK_BYTES[kind])
    assert rebuild_mismatches(panels, weight) == 0
    # the check is able to fail: one weight one ulp off, and the rows in another order
    off = weight.clone()
    off[n // 2, k - 1] = torch.nextafter(off[n // 2, k - 1], torch.tensor(1.0))
    assert rebuild_mismatches(panels, off) == 1
    if n > 1:
        assert rebuild_mismatches(panels, weight.roll(1, dims=0)) > 0


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_any_finite_scales_rebuild_exactly(kind):
    rows = any_finite_blocks(45, 128, kind, seed=7)
    weight = torch.from_numpy(quants.dequantize(rows, QTYPES[kind]))
    assert torch.isfinite(weight).all()
    assert rebuild_mismatches(block_panels(rows, kind, 128), weight) == 0


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_block_panels_give_the_fp32_panels_results_bit_for_bit(kind):
    n, k = 70, 96
    rows, weight = quantised(n, k, kind, seed=3)
    blocks, fp32 = block_panels(rows, kind, k), panel_weight(weight, allow_bf16=False)
    bias = torch.randn(n)
    for m in (1, 2, 5, 9, 12, 13, 30):
        x = torch.randn(m, k)
        for b in (None, bias):
            got = rows_linear(x, blocks, n, b)
            assert torch.equal(got, rows_linear(x, fp32, n, b)), (m, b is None)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-4, atol=1e-4)


def test_a_routed_linear_streams_its_blocks_until_its_weight_changes():
    rows, weight = quantised(48, 64, "q4_1", seed=5)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False), torch.nn.ReLU(), torch.nn.Linear(48, 8))
    with torch.no_grad():
        model[0].weight.copy_(weight)
    x = torch.randn(3, 64)
    expected = model(x)
    assert use_rows_kernel(model, blocks={"0": block_panels(rows, "q4_1", 64)})
    assert "_rows_blocks" in model[0].__dict__ and "_rows_panels" not in model[0].__dict__
    assert "_rows_panels" in model[2].__dict__  # no blocks: fp32 panels as before
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        model[0].weight.mul_(2)  # the blocks no longer hold this weight: fp32 panels take over
        out = model(x)
    assert "_rows_panels" in model[0].__dict__
    torch.testing.assert_close(out, torch.nn.functional.linear(torch.relu(x @ (2 * weight).T), model[2].weight,
                                                               model[2].bias), rtol=1e-5, atol=1e-5)


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The row order llama.cpp's convert_hf_to_gguf.py gives q and k (for its RoPE), from Hugging Face's."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, model, permute_q: bool = True) -> None:
    """`model`'s linears as a llama GGUF the way llama.cpp writes one (Q4_1 linears, Q8_0 tied embedding),
    and `model`'s weights set to what the GGUF dequantises to, as `convert_embedded` would leave them."""
    cfg = model.config
    writer = GGUFWriter(path, arch="llama")
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    tensors = {"token_embd.weight": (model.model.embed_tokens, "q8_0", None)}
    for i, layer in enumerate(model.model.layers):
        for hf, gg in names.items():
            module = getattr(layer.self_attn, hf, None) or getattr(layer.mlp, hf)
            heads = {"q_proj": cfg.num_attention_heads if permute_q else None, "k_proj": cfg.num_key_value_heads}
            tensors[f"blk.{i}.{gg}.weight"] = (module, "q4_1", heads.get(hf))
    with torch.no_grad():
        for name, (module, kind, heads) in tensors.items():
            w = module.weight.detach().numpy()
            rows = quants.quantize(w, QTYPES[kind])
            module.weight.copy_(torch.from_numpy(quants.dequantize(rows, QTYPES[kind])))
            stored = quants.quantize(llamacpp_permute(w, heads), QTYPES[kind]) if heads else rows
            writer.add_tensor(name, stored, raw_dtype=QTYPES[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_llama_gguf_maps_onto_every_linear_in_the_converted_row_order(tmp_path):
    """q and k un-permuted as the conversion does, the head taken from the tied embedding: all exact."""
    from tests.tiny import tiny_target

    model = tiny_target().model
    write_tiny_gguf(tmp_path / "tiny.gguf", model)
    found = panels_from_gguf(model, tmp_path / "tiny.gguf")
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(found) == linears and len(linears) == 2 * 7 + 1
    assert found["lm_head"].kind == "q8_0" and found["model.layers.0.self_attn.q_proj"].kind == "q4_1"
    assert set(exact_block_panels(model, found)) == linears


def test_a_row_order_that_differs_from_the_weights_is_refused(tmp_path):
    """A GGUF whose q rows are not in llama.cpp's order: the un-permutation scrambles them, the load-time
    check sees it, and those linears keep their fp32 panels."""
    from tests.tiny import tiny_target

    model = tiny_target().model
    write_tiny_gguf(tmp_path / "tiny.gguf", model, permute_q=False)
    exact = exact_block_panels(model, panels_from_gguf(model, tmp_path / "tiny.gguf"))
    assert {name for name in exact if "q_proj" in name} == set()
    assert len(exact) == 2 * 7 + 1 - 2


def test_the_cache_is_reused_while_its_stamp_holds(tmp_path, monkeypatch):
    from tests.tiny import tiny_target

    model = tiny_target().model
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, model)
    built = []
    real = gguf_panels.panels_from_gguf
    monkeypatch.setattr(gguf_panels, "panels_from_gguf", lambda *a: built.append(1) or real(*a))
    cache = tmp_path / "cache" / "panels.safetensors"
    first = gguf_panels.cached_panels_from_gguf(model, gguf, cache)
    again = gguf_panels.cached_panels_from_gguf(model, gguf, cache)
    assert len(built) == 1 and set(again) == set(first)
    assert all(torch.equal(again[n].data, first[n].data) and again[n].kind == first[n].kind for n in first)
    cache.write_bytes(cache.read_bytes()[:100])  # a damaged cache is made again
    assert set(gguf_panels.cached_panels_from_gguf(model, gguf, cache)) == set(first) and len(built) == 2
    monkeypatch.setattr(gguf_panels, "LAYOUT", "another")  # a new layout: the stale cache is made again
    gguf_panels.cached_panels_from_gguf(model, gguf, cache)
    assert len(built) == 3
    unwritable = tmp_path / "a-file"
    unwritable.write_text("")  # a cache that cannot be written: the panels still come back
    assert set(gguf_panels.cached_panels_from_gguf(model, gguf, unwritable / "p.safetensors")) == set(first)


def test_dartree_weights_picks_the_panels_and_refuses_other_values(monkeypatch):
    monkeypatch.delenv("DARTREE_WEIGHTS", raising=False)
    assert gguf_panels.weights_choice() == "gguf"
    monkeypatch.setenv("DARTREE_WEIGHTS", "fp32")
    assert target_block_panels(SimpleNamespace()) == ({}, "fp32 panels (DARTREE_WEIGHTS=fp32)")
    monkeypatch.setenv("DARTREE_WEIGHTS", "q4")
    with pytest.raises(UserError, match="DARTREE_WEIGHTS"):
        gguf_panels.weights_choice()


def test_other_targets_keep_fp32_panels_and_the_log_line_says_which(monkeypatch):
    from tests.tiny import tiny_target

    monkeypatch.delenv("DARTREE_WEIGHTS", raising=False)
    blocks, words = target_block_panels(tiny_target())
    assert blocks == {} and words == "fp32 panels (no GGUF behind this target)"
    line = describe_linear_path(SimpleNamespace(rows_kernel=True, linear_weights="the GGUF's Q4_1 blocks for 3 of 3"))
    assert line == "CPU linears: the row kernel (rows_linear.c), the GGUF's Q4_1 blocks for 3 of 3"


@pytest.mark.parametrize("n,k", [(100, 64), (64, 96), (7, 32)])
def test_selected_rows_of_q8_0_panels_rebuild_those_rows(n, k):
    """The draft head is a row slice of the tied Q8_0 LM head: `select_rows` re-lays the slice's blocks."""
    rows, weight = quantised(n, k, "q8_0", seed=n)
    panels = block_panels(rows, "q8_0", k)
    g = torch.Generator().manual_seed(n)
    for picked in (torch.randperm(n, generator=g)[: n // 3 + 1], torch.arange(n), torch.tensor([n - 1, 0, n - 1])):
        sub = panels.select_rows(picked)
        assert sub.n == picked.numel() and sub.data.shape[0] == -(-picked.numel() // 32)
        assert rebuild_mismatches(sub, weight[picked]) == 0
        assert rebuild_mismatches(sub, weight[picked.roll(1)]) > 0 or picked.unique().numel() == 1
        x = torch.randn(5, k)
        assert torch.equal(rows_linear(x, sub, sub.n), rows_linear(x, panel_weight(weight[picked], False), sub.n))
    with pytest.raises(ValueError, match="Q8_0"):
        block_panels(quantised(n, k, "q4_1", seed=1)[0], "q4_1", k).select_rows(torch.arange(3))


def test_a_draft_head_streams_its_rows_of_the_targets_q8_0_head_and_decodes_as_plain():
    from dartree.engine import DecodeSettings, generate
    from tests.test_draft_vocab import vocab_drafter
    from tests.tiny import tiny_target

    target = tiny_target()
    head = target.model.get_output_embeddings()
    rows, weight = quantised(*head.weight.shape, "q8_0", seed=2)
    with torch.no_grad():
        head.weight.copy_(weight)  # tied: the embedding holds the GGUF's weights too, as the embedded target's
    assert use_rows_kernel(target.model)
    target.rows_kernel, target.head_blocks = True, block_panels(rows, "q8_0", head.weight.shape[1])
    drafter = vocab_drafter(target)
    use_rows_kernel(drafter, skip=("embed_proj",))
    prompt = [4, 9, 33, 12, 7]
    ref = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=20)).token_ids
    got = generate(target, drafter, prompt, DecodeSettings(method="dartree", width=3, budget=8, candidates=6,
                                                           max_new_tokens=20))
    assert got.token_ids == ref
    draft_head = drafter._head_cache[1]
    blocks = draft_head.__dict__["_rows_blocks"][1]
    assert blocks.kind == "q8_0" and rebuild_mismatches(blocks, draft_head.weight) == 0


# ---- the real embedded target -------------------------------------------------------------------------


@pytest.mark.real
def test_the_embedded_targets_head_blocks_rebuild_any_row_slice(real_models):
    """On both weight paths (DARTREE_WEIGHTS), the draft head streams the Q8_0 head's blocks."""
    target = real_models.target
    if not getattr(target, "rows_kernel", False):
        pytest.skip("the CPU row kernel's path")
    weight = target.model.get_output_embeddings().weight
    assert target.head_blocks is not None and target.head_blocks.kind == "q8_0"
    picked = torch.randperm(weight.shape[0], generator=torch.Generator().manual_seed(0))[:16384]
    assert rebuild_mismatches(target.head_blocks.select_rows(picked), weight[picked]) == 0


def _linears(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@pytest.mark.real
def test_all_211_linears_of_the_embedded_target_stream_blocks_that_rebuild_its_weights(real_models):
    target = real_models.target
    if target.device.type != "cpu" or os.environ.get("DARTREE_WEIGHTS") == "fp32":
        pytest.skip("the block panels are the CPU default path")
    linears = _linears(target.model)
    assert len(linears) == 30 * 7 + 1
    assert target.linear_weights == "the GGUF's Q4_1/Q8_0 blocks for 211 of 211 linears"
    for name, module in linears.items():
        blocks = module.__dict__["_rows_blocks"][1]
        assert blocks.kind == ("q8_0" if name == "lm_head" else "q4_1"), name
        assert rebuild_mismatches(blocks, module.weight) == 0, name


@pytest.mark.real
@pytest.mark.slow
def test_logits_through_the_blocks_equal_the_fp32_panels_bit_for_bit(real_models):
    """Whole passes over 1, 2, 9, 13 and 33 rows: every linear sees that many rows, through its blocks and
    then through fp32 panels of the same weights."""
    target = real_models.target
    if target.device.type != "cpu" or os.environ.get("DARTREE_WEIGHTS") == "fp32":
        pytest.skip("the block panels are the CPU default path")
    linears = _linears(target.model)
    ids = torch.tensor([target.chat_ids("Write a haiku about the sea, then explain it in two sentences.")])
    assert ids.shape[1] >= 33
    with torch.inference_mode():
        via_blocks = {m: target.model(ids[:, :m]).logits for m in (1, 2, 9, 13, 33)}
    held = {name: module.__dict__.pop("_rows_blocks") for name, module in linears.items()}
    try:
        with torch.inference_mode():
            for m, logits in via_blocks.items():
                assert torch.equal(target.model(ids[:, :m]).logits, logits), m
        assert all("_rows_panels" in module.__dict__ for module in linears.values())
    finally:
        for name, module in linears.items():
            module.__dict__.pop("_rows_panels", None)  # 540 MB: the session's other tests do not need them
            module.__dict__["_rows_blocks"] = held[name]
