"""Tree attention: which node sees which, and where each node sits in the sequence.

Every tree node attends to the whole committed prefix, to its ancestors and to itself, and sits at
position prefix_len + depth, exactly where it would sit if its path were decoded on its own. That is
what makes one forward over the tree give, for each node, the logits of sequential decoding.
"""

from __future__ import annotations

import torch


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
