"""The target's processed next-token distribution (temperature, then top-p) and draws from it.

Plain decoding and every speculative method draw from exactly this function, which is what makes
sample-and-match lossless: each token the walk commits is a draw from the target's own distribution.
"""

from __future__ import annotations

import torch


def processed_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Rows of probabilities after temperature scaling and nucleus (top-p) filtering."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def next_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: the argmax at temperature 0, else one independent draw per row."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = processed_probs(logits, temperature, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
