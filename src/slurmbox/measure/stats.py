"""Timing statistics: summary, stopping rule, two-candidate comparison.

Anchored on NVBench's stopping criterion (github.com/NVIDIA/nvbench,
docs/benchmarks.md "stopping criteria"): at least ``min_samples`` samples and
``min_time`` seconds of measured time, then stop once the relative standard
deviation ("noise") is at or below ``max_noise``, or at a wall-clock cap,
reporting that the measurement did not converge. Outliers use the median
absolute deviation (MAD, scaled by 1.4826 to estimate sigma for normal data;
Leys et al. 2013, threshold 3.5 by default). The comparison of two
candidates uses scipy.stats.mannwhitneyu and a percentile-bootstrap
confidence interval of the ratio of medians, never a ratio of means.
"""

from dataclasses import dataclass

import numpy as np

MAD_SCALE = 1.4826


@dataclass
class StoppingRule:
    """When to stop sampling. Times in seconds; ``max_noise`` is a fraction (0.005 = 0.5%)."""

    min_samples: int = 10
    min_time: float = 0.5
    max_noise: float = 0.005
    max_wall: float = 60.0
    max_samples: int = 10000
    warmup_samples: int = 3

    def done(self, samples_ns, elapsed_wall):
        """``(stop, converged)`` for the timed samples so far (ns) after ``elapsed_wall`` seconds."""
        count = len(samples_ns)
        measured = float(np.sum(samples_ns)) / 1e9 if count else 0.0
        if count >= self.min_samples and measured >= self.min_time and relative_stdev(samples_ns) <= self.max_noise:
            return True, True
        if elapsed_wall >= self.max_wall or count >= self.max_samples:
            return True, False
        return False, False


def relative_stdev(samples):
    """Sample standard deviation (ddof=1) over the mean; inf for fewer than 2 samples."""
    values = np.asarray(samples, dtype=float)
    if values.size < 2 or values.mean() == 0:
        return float("inf")
    return float(values.std(ddof=1) / values.mean())


def mad_outliers(samples, threshold=3.5):
    """Boolean mask of outliers: ``|x - median| / (1.4826 * MAD) > threshold`` (none when MAD is 0)."""
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        return np.zeros(0, dtype=bool)
    median = np.median(values)
    mad = np.median(np.abs(values - median)) * MAD_SCALE
    if mad == 0:
        return np.zeros(values.size, dtype=bool)
    return np.abs(values - median) / mad > threshold


def summarize(samples_ns):
    """Summary of timed samples (ns): dict with count, median_ns, mean_ns, min_ns, max_ns,
    stdev_ns, rel_stdev, q1_ns, q3_ns, iqr_ns and outliers (MAD count). Empty input gives count 0."""
    values = np.asarray(samples_ns, dtype=float)
    if values.size == 0:
        return {"count": 0}
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return {
        "count": int(values.size),
        "median_ns": float(median),
        "mean_ns": float(values.mean()),
        "min_ns": float(values.min()),
        "max_ns": float(values.max()),
        "stdev_ns": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "rel_stdev": relative_stdev(values),
        "q1_ns": float(q1),
        "q3_ns": float(q3),
        "iqr_ns": float(q3 - q1),
        "outliers": int(mad_outliers(values).sum()),
    }


def compare(a_ns, b_ns, confidence=0.95, resamples=4000, seed=0):
    """Compare candidate A against B (timed samples in ns).

    Returns a dict: ``median_ratio`` (median(A)/median(B); < 1 means A is
    faster), ``ratio_ci`` [low, high] (percentile bootstrap of the ratio of
    medians, ``resamples`` draws, fixed ``seed`` for reproducible reports),
    ``mannwhitney_u`` and ``p_value`` (two-sided, scipy.stats.mannwhitneyu),
    ``hodges_lehmann_ns`` (median of all pairwise differences A-B) and
    ``significant`` (p < 1 - confidence and the CI excludes 1).
    Raises ValueError when either side has fewer than 2 samples.
    """
    from scipy import stats as sps

    a = np.asarray(a_ns, dtype=float)
    b = np.asarray(b_ns, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError("each candidate needs at least 2 timed samples to be compared (got %d and %d)"
                         % (a.size, b.size))
    test = sps.mannwhitneyu(a, b, alternative="two-sided")
    rng = np.random.default_rng(seed)
    ratios = np.median(rng.choice(a, (resamples, a.size)), axis=1) / np.median(rng.choice(b, (resamples, b.size)), axis=1)
    alpha = 1 - confidence
    low, high = np.percentile(ratios, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    pairwise = a[:, None] - b[None, :] if a.size * b.size <= 4_000_000 else \
        rng.choice(a, 2_000_000) - rng.choice(b, 2_000_000)
    return {
        "median_ratio": float(np.median(a) / np.median(b)),
        "ratio_ci": [float(low), float(high)],
        "confidence": confidence,
        "mannwhitney_u": float(test.statistic),
        "p_value": float(test.pvalue),
        "hodges_lehmann_ns": float(np.median(pairwise)),
        "significant": bool(test.pvalue < alpha and (high < 1 or low > 1)),
    }
