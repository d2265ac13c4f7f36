"""A drafter with a draft vocabulary: it proposes only its own tokens, scores them exactly like the full
head would, survives a checkpoint round trip, and decoding with it stays lossless."""

import pytest
import torch

from dartree import TREE_METHODS
from dartree.draft import DrafterContext, PathCorrector, draft_block
from dartree.engine import DecodeSettings, generate
from dartree.errors import UserError
from dartree.models.drafter import DominoDrafter
from tiny import TINY_VOCAB, tiny_drafter, tiny_target

VOCAB_IDS = torch.tensor(sorted({2, 3, 5, 8, 13, 21, 34, 40, 41, 42, 50, 55, 60, 62, TINY_VOCAB - 1}))


def vocab_drafter(target, seed=1):
    drafter = tiny_drafter(target, seed=seed, draft_vocab_size=len(VOCAB_IDS))
    drafter.set_draft_vocab(VOCAB_IDS[torch.randperm(len(VOCAB_IDS))])  # any order in, ascending stored
    return drafter


def context_for(drafter, target, n=5):
    feats = torch.randn(n, len(drafter.cfg.target_layer_ids) * target.hidden_size,
                        generator=torch.Generator().manual_seed(0))
    return DrafterContext.from_prefill(drafter, feats)


def test_columns_and_tokens_map_both_ways():
    drafter = vocab_drafter(tiny_target())
    assert torch.equal(drafter.draft_vocab, VOCAB_IDS)
    cols = drafter.to_draft_columns(torch.tensor([2, 4, 13, TINY_VOCAB - 1, 0, 63]))
    assert cols.tolist() == [0, -1, 4, len(VOCAB_IDS) - 1, -1, len(VOCAB_IDS) - 1]
    assert torch.equal(drafter.column_tokens(torch.arange(len(VOCAB_IDS))), VOCAB_IDS)
    with pytest.raises(ValueError, match="exactly"):
        drafter.set_draft_vocab([2, 3])


@torch.no_grad()
def test_block_candidates_come_from_the_vocabulary_with_the_full_heads_scores():
    target = tiny_target()
    drafter = vocab_drafter(target)
    block = draft_block(drafter, target, context_for(drafter, target), torch.tensor(3), 5, drafter.max_depth, 8)
    d = block.draft
    assert set(d.cand_tokens.flatten().tolist()) <= set(VOCAB_IDS.tolist())
    full = target.lm_head(block.hidden)  # [D, V]
    restricted = full[:, VOCAB_IDS]
    # the candidates are the top-8 of the restricted head, with its logits and its own normalisation
    top = restricted.topk(8, dim=-1)
    torch.testing.assert_close(d.cand_base_logits, top.values, rtol=1e-5, atol=1e-5)
    assert torch.equal(d.cand_tokens, VOCAB_IDS[top.indices])
    torch.testing.assert_close(d.cand_marginal_lp, top.values - restricted.logsumexp(-1, keepdim=True))
    # the correction head scores the same columns: its residual for a candidate is its draft-vocab row
    corrector = PathCorrector(drafter, target, block)
    state = corrector.root_state()
    residual = corrector.residual(1, state)
    whole = drafter.correction(block.hidden[0][None], state)  # [1, draft vocab]
    torch.testing.assert_close(residual, whole[:, top.indices[0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_keeps_the_vocabulary_and_the_drafts(tmp_path, dtype):
    target = tiny_target()
    drafter = vocab_drafter(target)
    if dtype != torch.float32:
        drafter.load_state_dict({k: v.to(dtype).float() if v.is_floating_point() else v
                                 for k, v in drafter.state_dict().items()})
    drafter.save_pretrained(tmp_path, dtype=dtype)
    loaded = DominoDrafter.from_pretrained(tmp_path)
    assert loaded.cfg.draft_vocab_size == len(VOCAB_IDS) and torch.equal(loaded.draft_vocab, VOCAB_IDS)
    with torch.no_grad():
        a = draft_block(drafter, target, context_for(drafter, target), torch.tensor(3), 5, drafter.max_depth, 8)
        b = draft_block(loaded, target, context_for(loaded, target), torch.tensor(3), 5, loaded.max_depth, 8)
    assert torch.equal(a.draft.cand_tokens, b.draft.cand_tokens)
    assert torch.equal(a.draft.cand_base_logits, b.draft.cand_base_logits)


def test_a_corrupt_vocabulary_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    target = tiny_target()
    vocab_drafter(target).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["draft_vocab"] = state["draft_vocab"].flip(0)  # not ascending
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="draft_vocab"):
        DominoDrafter.from_pretrained(tmp_path)


@pytest.mark.parametrize("method", TREE_METHODS)
def test_decoding_with_a_draft_vocabulary_equals_plain_decoding(method):
    target = tiny_target()
    drafter = vocab_drafter(target)
    prompt = [4, 9, 33, 12, 7]
    ref = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=30)).token_ids
    settings = DecodeSettings(method=method, width=4, budget=10, candidates=6, max_new_tokens=30)
    got = generate(target, drafter, prompt, settings)
    assert got.token_ids == ref


def test_decoding_through_packed_weights_builds_the_draft_head_outside_inference_mode():
    """The draft head is first built inside the decoder's inference mode; MKL packing keys on its version."""
    from dartree.models.packed import packing_available, use_packed_linears

    if not packing_available():
        pytest.skip("no MKL packed GEMM in this torch build")
    target = tiny_target()
    target.packed_weights = use_packed_linears(target.model)
    drafter = vocab_drafter(target)
    use_packed_linears(drafter, target.packed_weights, skip=("embed_proj",))
    prompt = [4, 9, 33, 12, 7]
    ref = generate(target, None, prompt, DecodeSettings(method="ar", max_new_tokens=20)).token_ids
    for _ in range(2):  # the second run meets the cached head (and its packs)
        got = generate(target, drafter, prompt, DecodeSettings(method="dartree", width=4, budget=10, candidates=6,
                                                               max_new_tokens=20))
        assert got.token_ids == ref
    assert not drafter._head_cache[1].weight.is_inference()
