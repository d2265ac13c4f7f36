"""Growing a trained drafter (capacity legs): the grown one computes what its parent does, and its new weights learn."""

import pytest
import torch

from dartree.errors import UserError
from dartree.train.grow import grow
from tiny import block_outputs, tiny_drafter, tiny_target


@pytest.mark.parametrize("layers, gru", [(3, 24), (2, 40), (4, 48)])
def test_a_grown_drafter_drafts_what_its_parent_drafts(layers, gru):
    target = tiny_target()
    parent = tiny_drafter(target)
    child = grow(parent, layers, gru, seed=5)
    assert (child.cfg.num_layers, child.cfg.gru_hidden_dim) == (layers, gru)
    assert len(child.layers) == layers and child.prefix_gru.hidden_size == gru
    tokens, base, hidden, residual = block_outputs(parent, target)
    c_tokens, c_base, c_hidden, c_residual = block_outputs(child, target)
    assert torch.equal(tokens, c_tokens)
    torch.testing.assert_close(c_hidden, hidden, rtol=0, atol=1e-6)
    torch.testing.assert_close(c_base, base, rtol=0, atol=1e-5)
    torch.testing.assert_close(c_residual, residual, rtol=0, atol=1e-6)
    # the parent is untouched (that the new weights learn is the next test)
    assert len(parent.layers) == 2 and parent.prefix_gru.hidden_size == 24


def test_the_new_weights_get_gradients_at_once():
    target = tiny_target()
    child = grow(tiny_drafter(target), 3, 40, seed=5).train()
    _, _, hidden, residual = block_outputs(child, target, grad=True)
    (hidden.square().sum() + residual.square().sum()).backward()
    new_layer = child.layers[2]
    assert new_layer.self_attn.o_proj.weight.grad.abs().sum() > 0
    assert new_layer.mlp.down_proj.weight.grad.abs().sum() > 0
    h = target.hidden_size
    new_columns = child.embed_proj[0].weight.grad[:, h + 24:]  # the correction's input from the new GRU units
    assert new_columns.abs().sum() > 0


def test_growing_to_the_same_size_is_the_parent_and_shrinking_is_refused():
    target = tiny_target()
    parent = tiny_drafter(target)
    assert grow(parent, 2, 24) is parent
    with pytest.raises(UserError, match="only grow"):
        grow(parent, 1, 24)
    with pytest.raises(UserError, match="only grow"):
        grow(parent, 2, 16)
    with pytest.raises(UserError, match="no correction head"):
        grow(tiny_drafter(target, correction=False), 2, 48)
