"""The written-out Llama forward (dartree.models.llama): its torch layers equal transformers' forward bit
for bit, and its native layers (models/llama_rows.c) agree with them closely and give every tree row
exactly what decoding that row alone gives.

Checked on every kind of pass the engine makes: the prefill with the drafter's features, a tree verify
under its mask, a single token with a mask (plain decoding's root-only tree) and without one, and a
causal block after cached rows (transformers' own mask). On a tiny random Llama, through the row kernel
(fused q/k/v and gate/up panels) and through torch's linears; on the real target, through whatever the
loader chose (the GGUF's blocks by default).
"""

from __future__ import annotations

import pytest
import torch

from dartree.attention import additive_mask, ancestor_matrix, position_ids, use_tree_sdpa
from dartree.cache import new_cache
from dartree.models.llama import FusedLinears, LlamaPass
from dartree.models.rows_kernel import rows_kernel_available, use_rows_kernel
from tests.tiny import tiny_target

PARENTS = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 5, 6])
DEPTHS = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3, 4])


def passes(target, prompt: list[int], features: tuple[int, ...]) -> list:
    """Logits and features of: prefill, a 9-node tree, one token with and without a mask, 3 causal rows."""
    vocab = target.vocab_size
    cache = new_cache(target, 64)
    p = len(prompt)
    outs = [target.forward(torch.tensor([prompt]), torch.arange(p)[None], cache, feature_layers=features)]
    tokens = (torch.arange(9) * 7 % vocab)[None]
    mask = additive_mask(ancestor_matrix(PARENTS, 4), p, target.dtype)
    outs.append(target.forward(tokens, position_ids(DEPTHS, p), cache, attention_mask=mask, feature_layers=features))
    cache = new_cache(target, 64)
    target.forward(torch.tensor([prompt]), torch.arange(p)[None], cache)
    one = additive_mask(torch.ones(1, 1, dtype=torch.bool), p, target.dtype)
    outs.append(target.forward(torch.tensor([[3]]), torch.tensor([[p]]), cache, attention_mask=one))
    outs.append(target.forward(torch.tensor([[5]]), torch.tensor([[p + 1]]), cache, feature_layers=features))
    outs.append(target.forward(torch.tensor([[1, 2, 3]]), torch.arange(p + 2, p + 5)[None], cache))
    return outs


def transformers_passes(target, prompt, features):
    """`passes` through transformers' `LlamaModel.forward` (no written-out forward)."""
    held, target.layers_pass = target.layers_pass, None
    try:
        return passes(target, prompt, features)
    finally:
        target.layers_pass = held


def assert_same_as_transformers(target, prompt, features):
    assert target.layers_pass is not None
    native, target.layers_pass.native = target.layers_pass.native, None  # the torch layers
    try:
        ours = passes(target, prompt, features)
    finally:
        target.layers_pass.native = native
    theirs = transformers_passes(target, prompt, features)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.logits, b.logits)
        assert (a.features is None) == (b.features is None)
        if a.features is not None:
            assert torch.equal(a.features, b.features)


def tiny_with_pass(kernel: bool):
    target = tiny_target(hidden=64, layers=3)
    use_tree_sdpa(target.model)
    if kernel:
        assert use_rows_kernel(target.model)
    target.layers_pass = LlamaPass(target.model)
    return target


def assert_native_close_and_row_exact(target, prompt, features):
    """The native layers' tree verify and single tokens: within float rounding of transformers' (through
    the torch layers), and each tree row bit-equal to decoding its path one token at a time (brute force)."""
    assert target.layers_pass.native is not None and target.layers_pass.native.tables() is not None
    native = passes(target, prompt, features)
    theirs = transformers_passes(target, prompt, features)
    for a, b in zip(native, theirs):
        scale = b.logits.abs().max()
        assert (a.logits - b.logits).abs().max() <= 1e-5 * scale + 1e-6
        if a.features is not None:
            assert (a.features - b.features).abs().max() <= 1e-5 * b.features.abs().max() + 1e-6
    tree = native[1]
    p, tokens = len(prompt), (torch.arange(9) * 7 % target.vocab_size)
    for node in range(len(PARENTS)):
        path = [node]
        while PARENTS[path[-1]] >= 0:
            path.append(int(PARENTS[path[-1]]))
        cache = new_cache(target, 64)
        target.forward(torch.tensor([prompt]), torch.arange(p)[None], cache)
        for depth, k in enumerate(reversed(path)):
            one = additive_mask(torch.ones(1, 1, dtype=torch.bool), p + depth, target.dtype)
            out = target.forward(tokens[k].reshape(1, 1), torch.tensor([[p + depth]]), cache, attention_mask=one,
                                 feature_layers=features)
        assert torch.equal(out.logits[0], tree.logits[node])
        assert torch.equal(out.features[0], tree.features[node])


def test_tiny_native_layers_are_close_and_row_exact():
    if not rows_kernel_available():
        pytest.skip("the row kernel does not build here")
    assert_native_close_and_row_exact(tiny_with_pass(kernel=True), [0, 5, 9, 11, 2, 7], features=(0, 2))


def test_native_layers_need_the_kernel_on_every_product():
    target = tiny_with_pass(kernel=False)  # torch's linears: no panels for the C layer to stream
    assert target.layers_pass.native.tables() is None


@pytest.mark.parametrize("kernel", [False, True])
def test_tiny_llama_equals_transformers_bit_for_bit(kernel):
    if kernel and not rows_kernel_available():
        pytest.skip("the row kernel does not build here")
    assert_same_as_transformers(tiny_with_pass(kernel), [0, 5, 9, 11, 2, 7], features=(0, 2))


def test_fused_panels_are_views_of_each_linears_own_and_follow_a_weight_change():
    if not rows_kernel_available():
        pytest.skip("the row kernel does not build here")
    target = tiny_with_pass(kernel=True)
    attn = target.model.model.layers[0].self_attn
    fused = FusedLinears([attn.q_proj, attn.k_proj, attn.v_proj])
    x = torch.randn(5, 64)

    def separate():
        return torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)

    with torch.no_grad():  # the kernel's calls: no gradient
        expected = separate()
        assert torch.equal(fused(x), expected)
        storage = fused.panels.untyped_storage().data_ptr()
        assert attn.k_proj.__dict__["_rows_panels"][1].untyped_storage().data_ptr() == storage  # no second copy
        attn.k_proj.weight.mul_(2.0)
        assert torch.equal(fused(x), separate())
        assert not torch.equal(fused(x), expected)


def test_other_architectures_keep_transformers_forward():
    target = tiny_target()  # plain "sdpa": the loader switches to TREE_SDPA before building a pass
    assert not LlamaPass.supports(target.model)
    use_tree_sdpa(target.model)
    assert LlamaPass.supports(target.model)
    target.model.config.model_type = "qwen3"
    assert not LlamaPass.supports(target.model)


@pytest.mark.slow
def test_the_real_target_equals_transformers_bit_for_bit(real_models):
    target = real_models.target
    prompt = target.chat_ids("Name three rivers in Europe and say which is longest.")
    assert_same_as_transformers(target, prompt, features=tuple(real_models.drafter.cfg.target_layer_ids))


@pytest.mark.slow
def test_the_real_targets_native_layers_are_close_and_row_exact(real_models):
    target = real_models.target
    if target.layers_pass.native is None or target.layers_pass.native.tables() is None:
        pytest.skip("the native layers are off here (no row kernel, or DARTREE_NATIVE_LAYERS=0)")
    prompt = target.chat_ids("Name three rivers in Europe and say which is longest.")
    assert_native_close_and_row_exact(target, prompt, features=tuple(real_models.drafter.cfg.target_layer_ids))
