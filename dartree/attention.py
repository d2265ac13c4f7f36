"""Tree attention: which node sees which, and where each node sits in the sequence.

Every tree node attends to the whole committed prefix, to its ancestors and to itself, and sits at
position prefix_len + depth, exactly where it would sit if its path were decoded on its own. That is
what makes one forward over the tree give, for each node, the logits of sequential decoding.

`TREE_SDPA` is the target's attention: transformers' SDPA, except that on a CPU a masked pass over
several tokens (a tree verify) reads each key/value head once for its group of query heads, instead of
copying every key and value `num_key_value_groups` times (`repeat_kv`), which transformers does whenever
a mask is given. That copy grows with the context: at 2,048 tokens it was a fifth of a tree verify on
SmolLM2 (docs/speed.md, "Costs that grow with the context"). A small tree (groups x nodes <= 32 rows, the
CPU default's 9 nodes x 3 heads) packs the group's heads into one query block, as transformers packs one
token's (0.71 against 0.88 ms a layer at 2,048 tokens); a larger one passes `enable_gqa=True`, since
packing it would cross the kernel's 32-row query blocks and change the last bits. Either way the CPU
kernel computes each row exactly as on the repeated tensors, so the result is the same bit for bit
(tests/test_context_costs.py) and trees and plain decoding agree as before.
Elsewhere (CUDA: its fused kernels take no mask with GQA) and for one token (transformers' own packed
path) or the prefill (no mask: transformers' `enable_gqa` path) it is transformers' function unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

TREE_SDPA = "dartree_sdpa"


def ancestor_matrix(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Bool [N, N]: entry (i, j) is True when node j is node i or one of its ancestors.

    Built by hopping to the parent `max_depth` times for all nodes at once (a loop over depths, never
    over nodes); the root's parent -1 is clamped to the root, which is everyone's ancestor anyway.
    """
    n = parents.shape[0]
    rows = torch.arange(n, device=parents.device)
    mask = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    mask[rows, rows] = True
    cur = rows
    for _ in range(max_depth):
        cur = parents[cur].clamp(min=0)
        mask[rows, cur] = True
    return mask


def additive_mask(visible: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Float mask [1, 1, N, prefix_len + N]: 0 where visible, the dtype's minimum elsewhere.

    A float additive mask works with both eager and SDPA attention (a bool mask is silently
    misread by eager attention).
    """
    n = visible.shape[0]
    out = torch.zeros(1, 1, n, prefix_len + n, dtype=dtype, device=visible.device)
    out[0, 0, :, prefix_len:].masked_fill_(~visible, torch.finfo(dtype).min)
    return out


def position_ids(depths: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[1, N]: position of each node = prefix length + depth."""
    return (depths + prefix_len).unsqueeze(0)


PACKED_ROWS = 32  # the CPU flash kernel's query block below 192 rows: one block per kv head up to this many


def tree_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: query [b, H, n, d], key/value [b, H_kv, L, d] -> [b, n, H, d].

    A tree pass on a CPU runs one of two ways, both bit-exact with transformers' repeated K/V:
    - groups x n <= PACKED_ROWS: the `groups` query heads that share a kv head are packed into one query
      block [b, H_kv, groups * n, d], under the mask tiled once per head, as transformers packs a single
      token's heads (`pack_gqa`): each kv head is read once for the whole group;
    - larger trees: `enable_gqa`, one query block per head (packing them would cross the kernel's 32-row
      blocks and change the last bits).
    """
    groups = getattr(module, "num_key_value_groups", 1)
    if (query.device.type != "cpu" or attention_mask is None or query.shape[2] == 1 or groups == 1 or dropout
            or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, n, d = query.shape
    if groups * n > PACKED_ROWS or attention_mask.shape[1] != 1:  # too many rows, or a mask per head
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    packed = query.reshape(b, heads // groups, groups * n, d)  # rows (head in group, node)
    mask = attention_mask.expand(-1, -1, n, -1).repeat(1, 1, groups, 1)  # [b or 1, 1, groups * n, L]
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.view(b, heads, n, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(TREE_SDPA, tree_sdpa_forward)
AttentionMaskInterface.register(TREE_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_tree_sdpa(model) -> None:
    """Switch a transformers model that runs SDPA to `TREE_SDPA` (the same numbers, no K/V copies)."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(TREE_SDPA)
