"""The drafter's side of a round: its context cache, the one block pass, and the path corrector.

`DrafterContext` keeps the drafter's per-layer context keys/values. They depend only on committed
tokens, so each committed token's target features are projected once, when it is committed, rather
than the whole prefix being re-projected every round.

`draft_block` runs the block [anchor, MASK, ...] once and returns, per depth, the top-C candidates by
base logit (the marginals a DFlash drafter gives) plus the hidden rows the correction head needs (the
drafter's `draft_rows` say which block row drafts which depth). `PathCorrector` exposes the head to the
tree builders: GRU states along paths and the logit residual restricted to the candidate columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .models.rows_kernel import cached_panels, gru_cell
from .tree import Draft


class DrafterContext:
    """Context keys/values of the drafter for all committed positions (batch of one).

    Preallocated like the target's cache (dartree.cache): per drafter layer, buffers [1, kv_heads,
    capacity, d] whose first `length` rows are in use; a commit writes its rows in place instead of
    concatenating the whole context onto them, and a write past the capacity doubles it (one copy).
    """

    def __init__(self, drafter, capacity: int = 0):
        self.drafter = drafter
        self.capacity = capacity
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer (keys, values)
        self.length = 0

    @property
    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Per layer (keys, values) [1, kv_heads, length, d]: views of the rows in use."""
        if self.buffers is None:
            return None
        return [(k[:, :, :self.length], v[:, :, :self.length]) for k, v in self.buffers]

    @classmethod
    def from_prefill(cls, drafter, features: torch.Tensor, start: int = 0, capacity: int = 0) -> "DrafterContext":
        """The context of a prefilled sequence: its target features [n, F] at positions start..start+n-1,
        with room for `capacity` positions in all (the Decoder's prompt + output)."""
        context = cls(drafter, capacity)
        context.append(features, torch.arange(start, start + features.shape[0], device=features.device))
        return context

    def prefix(self, length: int) -> "DrafterContext":
        """The first `length` positions, as a context of their own (views of this one's buffers: a later
        append to the view writes past `length`, so only read from it)."""
        view = DrafterContext(self.drafter)
        view.buffers, view.length, view.capacity = self.buffers, length, self.capacity
        return view

    def append(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        """Add the target features [n, F] of newly committed tokens at positions [n]."""
        new = self.drafter.context_kv(features[None].to(self.drafter.fc.weight.dtype), positions[None])
        start, end = self.length, self.length + int(features.shape[0])
        if self.buffers is None or end > self.buffers[0][0].shape[2]:
            self._reserve(new, max(end, self.capacity, 2 * self.length))
        for (k, v), (nk, nv) in zip(self.buffers, new):
            k[:, :, start:end] = nk
            v[:, :, start:end] = nv
        self.length = end

    def _reserve(self, like, capacity: int) -> None:
        """Buffers of `capacity` rows, shaped like the new rows `like`, holding the rows in use."""
        old = self.kv
        self.buffers = [(k.new_empty(*k.shape[:2], capacity, k.shape[3]), v.new_empty(*v.shape[:2], capacity, v.shape[3]))
                        for k, v in like]
        for (k, v), (ok, ov) in zip(self.buffers, old or []):
            k[:, :, :self.length] = ok
            v[:, :, :self.length] = ov
        self.capacity = capacity


@dataclass
class BlockDraft:
    draft: Draft
    hidden: torch.Tensor  # [D, h] the block rows that draft depths 1..D (z_1..z_D of the head)
    columns: torch.Tensor | None = None  # [D, C] the candidates' columns in the drafter's logits (None: token ids)

    @property
    def cand_columns(self) -> torch.Tensor:
        return self.draft.cand_tokens if self.columns is None else self.columns


def draft_block(drafter, target, context: DrafterContext, anchor: torch.Tensor, position: int,
                depth: int, candidates: int, siblings: int = 0) -> BlockDraft:
    """One drafter pass for the block that starts at `position` with the committed `anchor` token.

    `siblings` > C also ranks the top min(siblings, V) tokens per depth (DDTree's heap with B > C; V is
    the drafter's vocabulary, the draft vocabulary when it has one): one wider top-k, the first C of
    which are the candidates.
    """
    k = drafter.block_size
    dev = anchor.device
    block = torch.full((1, k), drafter.cfg.mask_token_id, dtype=torch.long, device=dev)
    block[0, 0] = anchor
    positions = torch.arange(position, position + k, device=dev)[None]
    embeds = target.embed(block).to(drafter.fc.weight.dtype)
    hidden = drafter.draft_rows(drafter.block_hidden(embeds, positions, context.kv)[0], depth)  # [D, h]
    base = drafter.base_logits(hidden.to(target.dtype), target)  # [D, V or draft vocabulary] fp32
    n_cand = min(candidates, base.shape[-1])
    top_logits, top_columns = base.topk(max(n_cand, min(siblings, base.shape[-1])), dim=-1)  # sorted
    top_lp = top_logits - torch.logsumexp(base, dim=-1, keepdim=True)
    top_tokens = drafter.column_tokens(top_columns)
    columns = top_columns[:, :n_cand]
    wide = top_columns.shape[1] > n_cand
    draft = Draft(anchor.reshape(()), top_tokens[:, :n_cand], top_logits[:, :n_cand], top_lp[:, :n_cand],
                  top_tokens if wide else None, top_lp if wide else None)
    return BlockDraft(draft, hidden, None if drafter.draft_vocab is None else columns)


class PathCorrector:
    """The Domino head as the builders see it (the `Corrector` protocol in dartree.tree).

    Everything of the head that does not depend on the path is computed once a round, when the
    corrector is made: the block-position half of ``embed_proj.0`` ([z ; s] -> W_z z + W_s s, so W_z z
    is one [D, h] x [h, emb] product for all depths) and the ``embed_proj.2`` rows of every depth's
    candidates. A depth then costs one [F, g] x [g, emb] product, a SiLU and one [F, emb] x [emb, C]
    product, plus a fused GRU cell to advance the survivors: a handful of ops on W rows, which is what
    keeps the depth-batched build cheap on a CPU.
    """

    def __init__(self, drafter, target, block: BlockDraft):
        self.drafter = drafter
        self.target = target
        self.block = block
        self.active = drafter.cfg.has_correction
        self.first_corrected_depth = drafter.cfg.pure_draft_prefix_len + 1
        self.dtype = drafter.fc.weight.dtype
        if self.active:
            w0 = drafter.embed_proj[0].weight  # [emb, h + g]
            h = drafter.cfg.hidden_size
            self._z_part = block.hidden.to(w0.dtype) @ w0[:, :h].T  # [D, emb]
            self._state_weight = w0[:, h:].T.contiguous()  # [g, emb]
            self._column_weight = drafter.embed_proj[2].weight[block.cand_columns].transpose(1, 2)  # [D, emb, C]
            gru = drafter.prefix_gru
            self._gru_weights = (gru.weight_ih_l0, gru.weight_hh_l0)
            self._gru_panels = None
            if getattr(target, "rows_kernel", False) and gru.weight_ih_l0.dtype == torch.float32 \
                    and gru.weight_ih_l0.device.type == "cpu":
                self._gru_panels = (cached_panels(drafter, "_gru_ih_panels", gru.weight_ih_l0),
                                    cached_panels(drafter, "_gru_hh_panels", gru.weight_hh_l0))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.target.embed(tokens).to(self.dtype)

    def root_state(self) -> torch.Tensor:
        anchor = self.block.draft.anchor.reshape(1)
        state = self.drafter.initial_state(1, anchor.device)
        return self.advance(anchor, state) if self.active else state

    def residual(self, depth: int, states: torch.Tensor):
        """The head's logit residual [F, C] for depth `depth`'s candidates under each of F path states."""
        if not self.active or depth < self.first_corrected_depth:
            return None
        hidden = F.silu(torch.addmm(self._z_part[depth - 1], states.to(self._state_weight.dtype), self._state_weight))
        return (hidden @ self._column_weight[depth - 1]).float()

    def advance(self, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """GRU states after each path's next token (one fused cell; the same maths as `DominoDrafter.gru_step`)."""
        if not self.active:
            return states
        w_ih, w_hh = self._gru_weights
        x, h = self._embed(tokens).to(w_ih.dtype), states.to(w_ih.dtype)
        if self._gru_panels is not None:
            return gru_cell(x, h, *self._gru_panels)
        return torch.gru_cell(x, h, w_ih, w_hh)
