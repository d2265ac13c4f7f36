"""The target's processed next-token distribution (temperature, then top-p) and draws from it.

Plain decoding and every speculative method draw from exactly this function, which is what makes
sample-and-match lossless: each token the walk commits is a draw from the target's own distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .models.rows_kernel import load_rows_kernel, rows_kernel_available


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
    """One token per row: the argmax at temperature 0, else one independent draw per row.

    Where the C kernels are built, fp32 CPU logits at top-p 1 draw in `models/sample_rows.c` (one call for
    every row; the same inverse-CDF search as `draw`, over weights from the kernels' exp); everything else
    draws here. Which path runs depends only on the settings and the device, never on the row count, so
    plain decoding and every tree walk of one generation sample the same distribution."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    if top_p >= 1.0 and native_draws(logits):
        uniforms = torch.rand(logits.shape[0], dtype=torch.float64, generator=generator)  # as many as `draw` takes
        return native_draw(logits, temperature, uniforms)
    return draw(processed_probs(logits, temperature, top_p), generator)


def native_draws(logits: torch.Tensor) -> bool:
    """Whether `next_tokens` draws these logits [N, V] in C: fp32 on a CPU, with the kernels built."""
    return logits.dtype == torch.float32 and logits.device.type == "cpu" and rows_kernel_available()


def native_draw(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row of softmax(logits / temperature) [N, V], row i with the uniform uniforms[i] in [0, 1)
    (`models/sample_rows.c` has the search)."""
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    u = uniforms.to(torch.float64).contiguous()
    out = torch.empty(x.shape[0], dtype=torch.long)
    if x.shape[0]:
        load_rows_kernel()["sample_rows"](x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), 1.0 / temperature,
                                          u.data_ptr(), out.data_ptr())
    return out


DRAW_BLOCK = 256  # tokens per block of the two-level search in `draw`


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One independent draw per row of `probs` [N, V], by inverting the cumulative distribution in two levels:
    a search over the block sums (DRAW_BLOCK tokens each), then one inside the block found, with one uniform
    per row. Hand-written rather than torch.multinomial, which on a CPU costs ~250x more over a 49k vocabulary
    (9 rows: 53 ms against 0.21 ms, one thread, a loaded machine: scripts/sampler_cost.py), as does one flat
    cumulative sum of the whole vocabulary (22 ms): at T > 0 the walk draws at every tree node, so that cost
    ate the speedup.

    A token of probability 0 never comes out: its cumulative value equals the one before it and each search
    returns the first index whose cumulative value exceeds the uniform; `_last_positive` guards the one place
    where rounding could step past the last token of positive probability. Sums run in doubles.
    """
    n, v = probs.shape
    blocks = F.pad(probs, (0, (-v) % DRAW_BLOCK)).view(n, -1, DRAW_BLOCK)  # [N, nb, K]
    sums = blocks.sum(dim=-1, dtype=torch.float64)  # [N, nb]
    cdf = sums.cumsum(dim=-1)
    u = torch.rand(n, 1, dtype=torch.float64, device=probs.device, generator=generator) * cdf[:, -1:]  # [N, 1]
    block = torch.minimum(torch.searchsorted(cdf, u, right=True), _last_positive(sums))  # [N, 1]
    rest = u - (cdf - sums).gather(1, block)  # >= 0: the mass before the block is <= u
    inside = blocks.gather(1, block[:, :, None].expand(n, 1, DRAW_BLOCK))[:, 0]  # [N, K]
    column = torch.minimum(torch.searchsorted(inside.double().cumsum(dim=-1), rest, right=True), _last_positive(inside))
    return (block * DRAW_BLOCK + column).squeeze(-1)


def _last_positive(x: torch.Tensor) -> torch.Tensor:
    """[N, 1] index of each row's last positive entry of x [N, K]."""
    return x.shape[-1] - 1 - (x > 0).flip(-1).int().argmax(dim=-1, keepdim=True)


OUTSIDE_NUCLEUS = -1e4  # the log-prob given to a candidate top-p removes: finite, so scores stay printable


def processed_log_probs(lp: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Candidate log-probs [..., C] after temperature, then top-p: `processed_probs` on the C candidates of a
    tree depth, as logs (dartree.tree.child_log_probs scores with them).

    p_T(x) = p(x)^(1/T) / sum_v p(v)^(1/T). The C candidates are the top C of their distribution; where
    their probabilities do not sum to 1 (full-vocabulary marginals), the tokens beyond them are counted as
    if each were as likely as the last candidate: the tail's mass m contributes m x p_C^(1/T - 1) to the
    sum (exact at T = 1, and 0 where the candidates hold all the mass, as the head's corrected ones do).
    Top-p keeps the candidates whose processed mass above them is below top_p and renormalises by the
    nucleus mass, which is the kept candidates' mass when they close the nucleus and about top_p when
    the nucleus runs on into the tail.
    """
    lp = lp.float()
    tail_mass = (1.0 - lp.exp().sum(dim=-1, keepdim=True)).clamp(min=0.0)
    last = lp.min(dim=-1, keepdim=True).values
    tail = tail_mass.log() + last * (1.0 / temperature - 1.0)  # -inf without a tail
    scaled = lp / temperature
    out = scaled - torch.logsumexp(torch.cat([scaled, tail], dim=-1), dim=-1, keepdim=True)
    if top_p >= 1.0:
        return out
    probs = out.exp()
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # processed mass strictly above each candidate
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, before < top_p)
    nucleus = torch.where(kept, probs, 0.0).sum(dim=-1, keepdim=True).clamp(min=top_p)
    return torch.where(kept, out - nucleus.log(), OUTSIDE_NUCLEUS)
