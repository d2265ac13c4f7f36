"""A checkpoint in the exact public Domino layout (as `Huang2020/Qwen3-4B-Domino-b16` ships it), tiny.

The target is a Qwen3 saved by transformers (tied embeddings, GQA, rope_theta 1e6, an embedding table wider
than its tokenizer, with the mask id in between). The drafter's config.json and bf16 safetensors are written
here by hand, field by field and key by key, so nothing of the project's own writer is assumed. The public
configs set ``shift_label: true``: block row 0 (the anchor's) drafts depth 1, and a block drafts
``block_size`` depths. The weights are random: these tests are about positions and formats, not acceptance.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dartree import TREE_METHODS
from dartree.draft import DrafterContext, draft_block
from dartree.engine import DecodeSettings, generate
from dartree.errors import UserError
from dartree.models.drafter import DominoDrafter
from dartree.models.loading import load_models

WORDS = 64  # the tokenizer's size; the embedding table has VOCAB rows
VOCAB = 80
MASK = 72  # past the tokenizer, inside the embedding table (as Qwen3's <|MASK|>-style drafter tokens are)
EOS = WORDS - 1
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 3, 4, 2, 16
BLOCK = 16
EMB, GRU = 16, 24
PROMPT = "w3 w17 w5 w22 w9 w41 w8 w30"


def save_target(folder):
    """A tiny Qwen3 with a word-level tokenizer, saved as transformers saves any model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {f"w{i}": i for i in range(WORDS - 1)} | {"<eos>": EOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="w0").save_pretrained(folder)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         rope_theta=1e6, max_position_embeddings=512, tie_word_embeddings=True,
                         initializer_range=0.2, eos_token_id=EOS, bos_token_id=None, pad_token_id=None)
    Qwen3ForCausalLM(config).save_pretrained(folder)


def public_state(seed: int = 1) -> dict:
    """Every weight of the public checkpoint under its public name, random, bf16."""
    g = torch.Generator().manual_seed(seed)
    q, kv, inter = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, 2 * HIDDEN
    shapes = {"fc.weight": (HIDDEN, LAYERS * HIDDEN), "hidden_norm.weight": (HIDDEN,), "norm.weight": (HIDDEN,),
              "prefix_gru.weight_ih_l0": (3 * GRU, HIDDEN), "prefix_gru.weight_hh_l0": (3 * GRU, GRU),
              "embed_proj.0.weight": (EMB, HIDDEN + GRU), "embed_proj.2.weight": (VOCAB, EMB)}
    for i in range(2):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, HIDDEN), p + "self_attn.k_proj.weight": (kv, HIDDEN),
                   p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, q),
                   p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
                   p + "mlp.gate_proj.weight": (inter, HIDDEN), p + "mlp.up_proj.weight": (inter, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, inter), p + "input_layernorm.weight": (HIDDEN,),
                   p + "post_attention_layernorm.weight": (HIDDEN,)}
    return {k: (1 + 0.1 * torch.randn(s, generator=g) if len(s) == 1 else 0.3 * torch.randn(s, generator=g)
                ).to(torch.bfloat16) for k, s in shapes.items()}


def public_config(**dflash) -> dict:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_act": "silu", "attention_bias": False,
        "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "intermediate_size": 2 * HIDDEN, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "max_position_embeddings": 512, "vocab_size": VOCAB, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "block_size": BLOCK, "num_target_layers": LAYERS,
        "dflash_config": {"target_layer_ids": [0, 1, 2], "mask_token_id": MASK, "projector_type": "domino",
                          "emb_dim": EMB, "gru_hidden_dim": GRU, "pure_draft_prefix_len": 1, "shift_label": True,
                          **dflash},
    }


def save_drafter(folder, **dflash):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(public_config(**dflash), indent=2))
    save_file(public_state(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("public")
    save_target(root / "target")
    save_drafter(root / "drafter")
    return root


@pytest.fixture(scope="module")
def models(checkpoint):
    return load_models(str(checkpoint / "target"), str(checkpoint / "drafter"), device="cpu")


def one_block(models, depth=None):
    """The block after the prompt, plus the drafter's full hidden rows [K, h] for the same pass."""
    target, drafter = models.target, models.drafter
    ids = target.chat_ids(PROMPT)
    with torch.no_grad():
        out = target.prefill(ids, __import__("transformers").DynamicCache(), tuple(drafter.cfg.target_layer_ids))
        context = DrafterContext.from_prefill(drafter, out.features)
        anchor = out.logits[0].argmax()
        block = draft_block(drafter, target, context, anchor, len(ids), depth or drafter.max_depth, 8)
        embeds = target.embed(torch.cat([anchor[None], torch.full((BLOCK - 1,), MASK)])[None])
        rows = drafter.block_hidden(embeds, torch.arange(len(ids), len(ids) + BLOCK)[None], context.kv)[0]
    return block, rows


def test_the_public_checkpoint_loads_every_key(checkpoint, models):
    names = set(load_file(str(checkpoint / "drafter" / "model.safetensors")))
    assert names == set(models.drafter.state_dict())  # nothing missing, nothing unexpected
    cfg = models.drafter.cfg
    assert cfg.shift_label and cfg.has_correction and cfg.pure_draft_prefix_len == 1
    assert models.target.model.config.tie_word_embeddings and models.target.vocab_size == VOCAB
    assert len(models.target.tokenizer) == WORDS < MASK < VOCAB


def test_shift_label_drafts_block_size_depths_and_depth_1_from_row_0(models):
    target, drafter = models.target, models.drafter
    assert drafter.max_depth == BLOCK
    block, rows = one_block(models)
    assert block.draft.cand_tokens.shape == (BLOCK, 8)
    torch.testing.assert_close(block.hidden, rows[:BLOCK])  # z_d is row d - 1, for the head too
    head = target.model.get_input_embeddings().weight  # tied: the LM head is the embedding table
    by_hand = rows[0] @ head.T  # depth 1 from the anchor's own row
    top = by_hand.topk(8)
    assert block.draft.cand_tokens[0].tolist() == top.indices.tolist()
    torch.testing.assert_close(block.draft.cand_base_logits[0], top.values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(block.draft.cand_marginal_lp[0], torch.log_softmax(by_hand, -1)[top.indices],
                               atol=1e-4, rtol=1e-4)
    assert not torch.allclose(by_hand, rows[1] @ head.T, atol=1e-2)  # a one-row shift would be seen


@pytest.fixture(scope="module")
def reference(models):
    ids = models.target.chat_ids(PROMPT)
    return ids, generate(models.target, None, ids, DecodeSettings(method="ar", max_new_tokens=24)).token_ids


@pytest.mark.parametrize("method", TREE_METHODS)
def test_every_method_equals_plain_decoding(models, reference, method):
    ids, ref = reference
    settings = DecodeSettings(method=method, width=4, budget=24, candidates=8, max_new_tokens=24, depth_bonus=-0.2)
    got = generate(models.target, models.drafter, ids, settings)
    assert got.token_ids == ref
    assert max(r.tree_nodes for r in got.round_records) > 1


def test_without_shift_label_the_block_drafts_rows_1_to_15(checkpoint, models, tmp_path):
    folder = save_drafter(tmp_path / "unshifted", shift_label=False)
    drafter = DominoDrafter.from_pretrained(folder)
    assert drafter.max_depth == BLOCK - 1
    unshifted = type(models)(models.target, drafter, "unshifted", "test")
    block, rows = one_block(unshifted)
    assert block.draft.cand_tokens.shape[0] == BLOCK - 1
    torch.testing.assert_close(block.hidden, rows[1:BLOCK])


@pytest.mark.parametrize("value", ["true", 1, None])
def test_a_shift_label_that_is_not_a_boolean_is_refused_at_load(tmp_path, value):
    folder = save_drafter(tmp_path / "bad", shift_label=value)
    with pytest.raises(UserError, match="shift_label must be true or false"):
        DominoDrafter.from_pretrained(folder)
