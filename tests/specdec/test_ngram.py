from __future__ import annotations

import pytest

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
