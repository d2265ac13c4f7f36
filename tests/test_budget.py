"""The auto budget's calibration curve: monotone bin rates against the min-max formula of isotonic regression."""

import numpy as np

from dartree.budget import monotone_rates


def brute_force_isotonic(rates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted isotonic regression by its closed form: y_i = max over j <= i of min over k >= i of mean(j..k)."""
    n = len(rates)
    mean = lambda j, k: (rates[j:k + 1] * weights[j:k + 1]).sum() / weights[j:k + 1].sum()  # noqa: E731
    return np.array([max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)])


def test_monotone_rates_pool_violators():
    assert monotone_rates([1, 0, 3], [2, 2, 4]) == [0.25, 0.25, 0.75]
    assert monotone_rates([0, 1, 1], [1, 2, 1]) == [0.0, 0.5, 1.0]  # already monotone: unchanged


def test_monotone_rates_equal_the_closed_form_with_empty_bins():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        counts = rng.integers(0, 6, size=n).astype(float)
        hits = np.floor(rng.random(n) * (counts + 1))
        got = np.array(monotone_rates(hits.tolist(), counts.tolist()))
        seen = counts > 0
        want = np.zeros(n)
        if seen.any():
            fitted = brute_force_isotonic(hits[seen] / counts[seen], counts[seen])
            below = np.cumsum(seen) - 1  # the nearest non-empty bin at or below each bin (-1: none)
            want = np.where(below >= 0, fitted[np.maximum(below, 0)], 0.0)
        np.testing.assert_allclose(got, want, atol=1e-12)
        assert np.all(np.diff(got) >= -1e-12)
