from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from specq.errors import ParameterError
from specq.specdec.proposers.ngram import lookup


def test_longest_suffix_match_wins():
    tokens = [1, 2, 3, 9, 8, 2, 3, 4, 5, 1, 2, 3]
    # Suffix (1, 2, 3) occurs at 0 and is followed by 9, 8, 2.
    assert lookup(tokens, 3, max_ngram=3, min_ngram=1) == [9, 8, 2]
    # With at most 2-grams the latest (2, 3) is at 5, followed by 4, 5, 1.
    assert lookup(tokens, 3, max_ngram=2, min_ngram=1) == [4, 5, 1]


def test_latest_match_and_truncated_continuation():
    assert lookup([5, 6, 5, 7, 5], 4, 3, 1) == [7, 5]
    assert lookup([4, 4, 4, 4], 3, 3, 1) == [4]  # (4,4,4) at 0 continues with one token


def test_no_match_proposes_nothing():
    assert lookup([1, 2, 3, 4], 5, 3, 1) == []
    assert lookup([1], 5, 3, 1) == []
    assert lookup([1, 2, 1], 5, 3, 2) == []  # only a 1-gram matches, below min_ngram


def test_invalid_sizes():
    from specq.specdec.proposers.ngram import NgramProposer

    with pytest.raises(ParameterError):
        NgramProposer(max_ngram=1, min_ngram=2)


def _numpy_lookup(tokens, k, max_ngram, min_ngram):
    """The first implementation (whole sliding windows compared), kept as the oracle."""
    seq = np.asarray(tokens, dtype=np.int64)
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start : start + k].tolist()
    return []


def test_the_compiled_lookup_proposes_what_whole_windows_find():
    rng = np.random.default_rng(0)
    for trial in range(3000):
        length = int(rng.integers(0, 60))
        tokens = rng.integers(0, 1 + trial % 7, size=length).tolist()  # small alphabets: many matches
        k, max_ngram = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        min_ngram = int(rng.integers(1, max_ngram + 1))
        assert lookup(tokens, k, max_ngram, min_ngram) == _numpy_lookup(tokens, k, max_ngram, min_ngram)
