"""Verification: one target forward over the whole tree, then the walk down the matching path.

The walk is vectorised: with y[n] the target's token at node n (its argmax, or one draw from its
processed distribution), node n matches when its own token equals y[parent(n)], and it is accepted
when it and all its ancestors match. Siblings carry distinct tokens, so the accepted nodes form one
path; the target's token at its deepest node is the bonus token. At T > 0 this is sample-and-match:
the tree is a deterministic function of the context, so committing the target's draws keeps the
output distribution of plain sampling (the drafter's probabilities are never used as q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import additive_mask, ancestor_matrix, position_ids
from .sampling import next_tokens
from .tree import Tree


@dataclass
class TreeVerification:
    """The target's view of one tree."""

    logits: torch.Tensor  # [N, V]
    features: torch.Tensor | None  # [N, F] drafter features of every node
    visible: torch.Tensor  # [N, N] bool ancestor-or-self matrix (the tree part of the mask)


@dataclass
class Walk:
    target_tokens: torch.Tensor  # [N] the target's token at every node
    accepted: torch.Tensor  # [N] bool, root included
    path: torch.Tensor  # [a + 1] node indices from the root down to the deepest accepted node
    bonus: torch.Tensor  # [] the target's token after the path


def verify_tree(target, tree: Tree, cache, prefix_len: int, feature_layers=()) -> TreeVerification:
    """Run the target once over all tree nodes appended to the cached prefix."""
    visible = ancestor_matrix(tree.parents, tree.max_depth)
    mask = additive_mask(visible, prefix_len, target.dtype)
    out = target.forward(tree.tokens[None], position_ids(tree.depths, prefix_len), cache,
                         attention_mask=mask, feature_layers=feature_layers)
    return TreeVerification(out.logits, out.features, visible)


def walk_tree(tree: Tree, verification: TreeVerification, temperature: float = 0.0, top_p: float = 1.0,
              generator: torch.Generator | None = None) -> Walk:
    """Follow the target's tokens down the tree; one host sync at the end to size the path."""
    y = next_tokens(verification.logits, temperature, top_p, generator)
    parent_token = y[tree.parents.clamp(min=0)]
    matched = tree.tokens == parent_token
    matched[0] = True
    accepted = ~(verification.visible & ~matched[None, :]).any(dim=-1)
    deepest = torch.where(accepted, tree.depths, -1).argmax()
    path = verification.visible[deepest].nonzero().squeeze(-1)  # ancestors are in topological order
    return Walk(target_tokens=y, accepted=accepted, path=path, bonus=y[deepest])
