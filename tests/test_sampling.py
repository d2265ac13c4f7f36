"""At T > 0 sample-and-match keeps the target's distribution: DARTree's first tokens vs exact probabilities.

A tiny target with a 16-token vocabulary lets us enumerate the exact joint distribution of the first
three new tokens under the processed distribution (temperature, top-p). Thousands of seeded DARTree
generations are then compared with it by Pearson chi-square tests (cells with an expected count
below 5 pooled). The same test is shown to reject samples drawn at another temperature, so it has power.
"""

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dartree import TREE_METHODS
from dartree.engine import DecodeSettings, generate
from dartree.models.rows_kernel import rows_kernel_available
from dartree.sampling import draw, native_draw, next_tokens, processed_probs
from tiny import tiny_drafter, tiny_target

VOCAB = 16
PROMPT = [3, 7, 1, 12]
ALPHA = 1e-3
RUNS = 1500


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    target = dataclasses.replace(tiny_target(vocab=VOCAB, std=0.2, seed=3), eos_token_ids=())
    yield target, tiny_drafter(target, seed=4, std=0.5)
    torch.set_num_threads(threads)


@torch.no_grad()
def exact_joint(target, temperature, top_p):
    """P(t1, t2, t3) by enumeration: [V, V, V]."""
    def next_probs(seqs):
        logits = target.model(torch.tensor(seqs)).logits[:, -1]
        return processed_probs(logits, temperature, top_p)

    p1 = next_probs([PROMPT])[0]
    p2 = next_probs([PROMPT + [a] for a in range(VOCAB)])
    p3 = next_probs([PROMPT + [a, b] for a in range(VOCAB) for b in range(VOCAB)]).view(VOCAB, VOCAB, VOCAB)
    return (p1[:, None, None] * p2[:, :, None] * p3).double().numpy()


def pooled_chisquare(observed, expected_probs):
    n = observed.sum()
    expected = expected_probs * n
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def sample_counts(target, drafter, settings, runs):
    counts = np.zeros((VOCAB, VOCAB, VOCAB))
    for seed in range(runs):
        out = generate(target, drafter, PROMPT, dataclasses.replace(settings, seed=seed)).token_ids
        counts[tuple(out[:3])] += 1
    return counts


# dartree in the inner loop; every other tree method in the full run (each takes ~15 s); all at their defaults,
# so with RETRIEVAL_DEFAULT's retrieval (ngram) where the method takes it
EVERY_TREE_METHOD = [m if m == "dartree" else pytest.param(m, marks=pytest.mark.slow) for m in TREE_METHODS]


@pytest.mark.parametrize("top_p", [0.9, 1.0])  # 1.0: the C draw (models/sample_rows.c), where it is built
@pytest.mark.parametrize("method", EVERY_TREE_METHOD)
def test_first_tokens_follow_the_target_distribution(models, method, top_p):
    target, drafter = models
    settings = DecodeSettings(method=method, width=4, budget=24, candidates=8, temperature=0.8, top_p=top_p,
                              max_new_tokens=3)
    assert settings.resolved().score_temperature > 0  # the trees are built with the sampling scores
    assert_follows_target(target, drafter, settings)


def assert_follows_target(target, drafter, settings):
    """RUNS seeded generations' first three tokens against the exact joint at the settings' T and top-p."""
    counts = sample_counts(target, drafter, settings, runs=RUNS)
    joint = exact_joint(target, settings.temperature, settings.top_p)
    # per-position marginals and the pairs (t1, t2), (t2, t3)
    assert pooled_chisquare(counts.sum((0, 1)), joint.sum((0, 1))) > ALPHA
    assert pooled_chisquare(counts.sum((0, 2)), joint.sum((0, 2))) > ALPHA
    assert pooled_chisquare(counts.sum(2).ravel(), joint.sum(2).ravel()) > ALPHA
    assert pooled_chisquare(counts.sum(0).ravel(), joint.sum(0).ravel()) > ALPHA


# retrieved branches (dartree.retrieval): dartree with both sources in the inner loop, the rest (and dartree
# without retrieval, no longer the default) in the full run
RETRIEVAL_CASES = [("dartree", "both")] + [pytest.param(m, r, marks=pytest.mark.slow) for m, r in (
    ("dartree", "none"), ("dartree", "ngram"), ("dartree", "table"), ("dartree-fixed", "both"))]


@pytest.mark.parametrize("method,retrieval", RETRIEVAL_CASES)
def test_first_tokens_follow_the_target_distribution_with_retrieval(models, method, retrieval):
    target, drafter = models
    settings = DecodeSettings(method=method, width=4, budget=24, candidates=8, temperature=0.8, top_p=0.9,
                              max_new_tokens=3, retrieval=retrieval)
    assert_follows_target(target, drafter, settings)


def test_the_check_rejects_a_different_distribution(models):
    target, drafter = models
    settings = DecodeSettings(method="dartree", width=4, budget=24, candidates=8, temperature=1.3, max_new_tokens=3)
    counts = sample_counts(target, drafter, settings, runs=RUNS)
    joint = exact_joint(target, 0.8, 0.9)
    assert pooled_chisquare(counts.sum(2).ravel(), joint.sum(2).ravel()) < ALPHA


@pytest.mark.parametrize("method", ("ar",) + TREE_METHODS)
def test_a_seeded_run_is_a_prefix_of_a_longer_one(models, method):
    """The walk's random draws do not depend on max_new_tokens: n tokens are the start of n + k tokens."""
    target, drafter = models
    for seed in range(12):
        settings = DecodeSettings(method=method, width=3, budget=10, candidates=8, temperature=0.9, top_p=0.95,
                                  seed=seed, max_new_tokens=20)
        longer = generate(target, drafter, PROMPT, settings).token_ids
        for n in (1, 4, 7):
            shorter = generate(target, drafter, PROMPT, dataclasses.replace(settings, max_new_tokens=n)).token_ids
            assert shorter == longer[:n], (seed, n)


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(processed_probs(logits, 1.0, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(processed_probs(logits, 1.0, 0.1), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(processed_probs(logits, 1.0, 1.0), torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def _native_draw_of_probs(probs, g):
    """models/sample_rows.c's draw of the distribution `probs` (its logits: log 0 = -inf, at T = 1)."""
    return native_draw(torch.log(probs), 1.0, torch.rand(probs.shape[0], dtype=torch.float64, generator=g))


needs_kernels = pytest.mark.skipif(not rows_kernel_available(), reason="the C kernels need AVX-512F and gcc")
DRAWS = ["torch", pytest.param("native", marks=needs_kernels)]


@pytest.mark.parametrize("which", DRAWS)
def test_draw_follows_its_distribution_and_never_draws_a_token_of_probability_zero(which):
    """The two-level inverse-CDF draw against the exact probabilities: a vocabulary of several blocks (the last
    one padded), zeros scattered through it and a whole zero tail (top-p's shape), chi-square per row. For
    both draws: `sampling.draw` over probabilities and the C draw over logits (-inf where the probability is 0)."""
    from dartree.sampling import DRAW_BLOCK

    draw_ = draw if which == "torch" else _native_draw_of_probs
    g = torch.Generator().manual_seed(0)
    vocab = 3 * DRAW_BLOCK + 37
    probs = torch.rand(3, vocab, generator=g) ** 4
    probs[:, ::3] = 0.0  # zeros inside every block
    probs[1, DRAW_BLOCK:] = 0.0  # row 1: everything past the first block is 0
    probs[2, :] = 0.0
    probs[2, [5, vocab - 1]] = torch.tensor([0.25, 0.75])  # row 2: two tokens, one of them the very last
    probs = probs / probs.sum(-1, keepdim=True)
    n = 60000
    counts = np.zeros((3, vocab))
    for _ in range(n // 1000):
        tokens = draw_(probs.repeat_interleave(1000, dim=0), g).view(3, 1000)
        for row in range(3):
            counts[row] += np.bincount(tokens[row].numpy(), minlength=vocab)
    assert (counts[probs.numpy() == 0] == 0).all()
    for row in range(3):
        assert pooled_chisquare(counts[row], probs[row].double().numpy()) > ALPHA


@needs_kernels
def test_the_native_draw_is_the_torch_draw_up_to_rounding():
    """The same uniforms give the same tokens: the two differ only in their exp's last bits, which moves a draw
    only when its uniform falls within ~1e-6 of a cumulative boundary. And `next_tokens` at top-p 1 on fp32
    CPU logits is the C draw, taking as many uniforms from the generator as `draw` does."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 3 * 256 + 37, generator=g) * 3
    logits[:, ::7] = -float("inf")
    uniforms = torch.rand(64, 500, dtype=torch.float64, generator=g)
    probs = processed_probs(logits, 0.7)
    cdf = probs.double().cumsum(-1)
    differ = 0
    for j in range(500):
        ours = native_draw(logits, 0.7, uniforms[:, j])
        assert torch.isfinite(logits.gather(1, ours[:, None])).all()
        theirs = torch.searchsorted(cdf / cdf[:, -1:], uniforms[:, j:j + 1].contiguous(), right=True)[:, 0]
        differ += int((ours != theirs).sum())
    assert differ <= 3, differ  # of 32,000 draws
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    u = torch.rand(64, dtype=torch.float64, generator=g2)
    assert torch.equal(next_tokens(logits, 0.7, 1.0, g1), native_draw(logits, 0.7, u))
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))  # the same uniforms used up


@needs_kernels
def test_a_row_draws_the_same_token_whatever_rows_share_its_call():
    """Plain decoding draws one row, a tree walk B + 1 rows: a row's token must not depend on the others."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(13, 49152, generator=g) * 4
    u = torch.rand(13, dtype=torch.float64, generator=g)
    together = native_draw(logits, 0.8, u)
    alone = torch.cat([native_draw(logits[i:i + 1], 0.8, u[i:i + 1]) for i in range(13)])
    assert torch.equal(together, alone)
    assert torch.equal(native_draw(logits[::2], 0.8, u[::2]), together[::2])  # a strided view of rows


@pytest.mark.parametrize("which", DRAWS)
def test_the_draw_check_rejects_another_distribution(which):
    draw_ = draw if which == "torch" else _native_draw_of_probs
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(1, 300, generator=g), -1)
    tokens = draw_(probs.expand(20000, -1), g)
    other = torch.softmax(torch.log(probs) / 0.8, -1)  # the same logits at another temperature
    assert pooled_chisquare(np.bincount(tokens.numpy(), minlength=300), other[0].double().numpy()) < ALPHA
