"""Goodness-of-fit helpers for the statistical tests of sampling."""

from __future__ import annotations

import numpy as np


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.09 is the
    one-sided normal quantile at alpha = 0.001."""
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * np.sqrt(h)) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of observed counts against probabilities, and its degrees
    of freedom. Fails outright if a zero-probability cell was observed."""
    n = counts.sum()
    expected = n * probs
    cells = expected > 0
    assert counts[~cells].sum() == 0, "a token the target gives zero probability was emitted"
    stat = float((((counts - expected) ** 2)[cells] / expected[cells]).sum())
    return stat, int(cells.sum()) - 1
