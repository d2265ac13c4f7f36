"""Tiny random models for the algorithm tests: real classes and real checkpoint formats, small sizes."""

from __future__ import annotations

import torch

from dartree.draft import DrafterContext, draft_block
from dartree.models.drafter import DominoDrafter, make_config
from dartree.models.target import Target

TINY_VOCAB = 64


def tiny_target(vocab: int = TINY_VOCAB, layers: int = 2, seed: int = 0, hidden: int = 64,
                attn: str = "sdpa", std: float = 0.2) -> Target:
    """A random Llama with a peaked next-token distribution (large init), so greedy paths are not flat."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         max_position_embeddings=4096, initializer_range=std, tie_word_embeddings=True,
                         eos_token_id=vocab - 1, bos_token_id=0, pad_token_id=0, attn_implementation=attn)
    model = LlamaForCausalLM(config).eval()
    return Target(model=model, tokenizer=None, name="tiny", device=torch.device("cpu"), dtype=torch.float32,
                  eos_token_ids=(vocab - 1,))


def tiny_drafter_config(target: Target, block_size: int = 6, correction: bool = True, prefix: int = 0,
                        draft_vocab_size: int = 0) -> dict:
    cfg = target.model.config
    return make_config(hidden_size=cfg.hidden_size, num_heads=4, num_kv_heads=2, head_dim=cfg.hidden_size // 4,
                       intermediate_size=2 * cfg.hidden_size, vocab_size=cfg.vocab_size,
                       num_target_layers=cfg.num_hidden_layers,
                       target_layer_ids=list(range(cfg.num_hidden_layers)), mask_token_id=1, num_layers=2,
                       block_size=block_size, emb_dim=16, gru_hidden_dim=24, pure_draft_prefix_len=prefix,
                       correction=correction, draft_vocab_size=draft_vocab_size)


def tiny_drafter(target: Target, seed: int = 1, std: float = 0.3, **kw) -> DominoDrafter:
    torch.manual_seed(seed)
    drafter = DominoDrafter(tiny_drafter_config(target, **kw))
    drafter.reset_parameters(std=std)
    return drafter.eval()


def block_outputs(drafter: DominoDrafter, target: Target, grad: bool = False):
    """One drafted block on fixed random features: (candidate tokens, base logits, block hidden, a residual)."""
    feats = torch.randn(5, len(drafter.cfg.target_layer_ids) * target.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.set_grad_enabled(grad):
        context = DrafterContext.from_prefill(drafter, feats)
        block = draft_block(drafter, target, context, torch.tensor(3), 5, drafter.max_depth, 8)
        state = drafter.gru_step(target.embed(torch.tensor([3, 4])), drafter.initial_state(2, "cpu"))
        residual = drafter.correction(block.hidden[0][None], state)
    return block.draft.cand_tokens, block.draft.cand_base_logits, block.hidden, residual
