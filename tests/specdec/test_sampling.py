from __future__ import annotations

import math

import numpy as np
import pytest

from specq.errors import ParameterError
from specq.specdec.rng import DRAW_ACCEPT, DRAW_PROPOSE, DRAW_SAMPLE, uniform
from specq.specdec.sampling import SamplingParams, probabilities, sample, warped_row
from specq.specdec.sampling_kernels import exp_nonpositive, kth_largest

LOGITS = np.array([[2.0, 1.0, 0.5, -1.0, 3.0]])


def test_greedy_is_one_hot_argmax():
    p = probabilities(LOGITS, SamplingParams())
    assert p.tolist() == [[0, 0, 0, 0, 1]]


def test_temperature_softmax():
    p = probabilities(LOGITS, SamplingParams(temperature=2.0))[0]
    expected = np.exp(LOGITS[0] / 2) / np.exp(LOGITS[0] / 2).sum()
    np.testing.assert_allclose(p, expected, rtol=1e-12)


def test_top_k_keeps_the_k_most_likely():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=2))[0]
    assert set(np.flatnonzero(p)) == {0, 4}
    assert p.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = probabilities(LOGITS, SamplingParams(temperature=1.0))[0]
    order = np.argsort(-full)
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.9))[0]
    kept = set(np.flatnonzero(p))
    # The top two hold less than 0.9, the top three more: exactly three are kept.
    assert full[order[:2]].sum() < 0.9 < full[order[:3]].sum()
    assert kept == set(order[:3].tolist())
    np.testing.assert_allclose(p[order[:3]], full[order[:3]] / full[order[:3]].sum())


def _top_p_by_full_sort(probs, top_p):
    """The rule spelled out: every row sorted whole, most likely first, lower id first
    on ties; the kept mass summed in that order, as the cumulative sums that chose them."""
    order = np.argsort(-probs, axis=1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=1)
    cumulative = np.cumsum(sorted_probs, axis=1)
    keep_sorted = cumulative - sorted_probs < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    mass = cumulative[np.arange(len(probs)), keep_sorted.sum(axis=1) - 1][:, None]
    return np.where(keep, probs * (1.0 / mass), 0.0)


def test_top_p_is_the_full_sorts_bit_for_bit_on_peaked_flat_and_tied_rows():
    rng = np.random.default_rng(7)
    vocab = 49152
    rows = [
        rng.normal(size=vocab) * 6,  # peaked: a handful of tokens hold the mass
        rng.normal(size=vocab) * 0.3,  # flat: thousands are kept, past every candidate step
        np.round(rng.normal(size=vocab) * 4),  # many ties, some at the boundary of the kept set
        np.where(np.arange(vocab) < 300, 5.0, -5.0),  # 300 equal tokens hold nearly all the mass
    ]
    logits = np.stack(rows)
    for temperature in (0.7, 1.0, 1.6):
        for top_p in (0.05, 0.5, 0.9, 0.95, 0.999999):
            params = SamplingParams(temperature=temperature, top_p=top_p)
            got = probabilities(logits, params)
            want = _top_p_by_full_sort(probabilities(logits, SamplingParams(temperature=temperature)), top_p)
            assert np.array_equal(got, want), (temperature, top_p)
    # A row whose kept set ends exactly among tied tokens keeps the lower ids.
    tied = probabilities(np.array([[0.0, 1.0, 1.0, 1.0, -9.0]]), SamplingParams(temperature=1.0, top_p=0.5))[0]
    assert np.flatnonzero(tied).tolist() == [1, 2]


def test_sample_is_the_inverse_cdf():
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    assert sample(probs, 0.0) == 0
    assert sample(probs, 0.0999) == 0
    assert sample(probs, 0.1001) == 2
    assert sample(probs, 0.6999) == 2
    assert sample(probs, 0.7001) == 3
    assert sample(probs, 0.999999) == 3
    # Never a zero-probability token, even for u at the very top.
    assert sample(np.array([0.5, 0.5, 0.0]), 1.0 - 1e-17) == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_invalid_parameters_are_refused(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        SamplingParams(**kwargs)


def test_uniform_is_a_pure_function_of_seed_position_and_draw():
    assert uniform(7, 10, DRAW_SAMPLE) == uniform(7, 10, DRAW_SAMPLE)
    values = {uniform(s, p, d) for s in (0, 7) for p in (0, 1, 10) for d in (DRAW_ACCEPT, DRAW_SAMPLE, DRAW_PROPOSE)}
    assert len(values) == 18  # every key gives its own number


def test_uniform_is_uniform():
    u = np.array([uniform(3, position, DRAW_SAMPLE) for position in range(4000)])
    assert ((u >= 0) & (u < 1)).all()
    # Kolmogorov-Smirnov distance against U(0,1); 1.95/sqrt(n) is the 0.1% critical value.
    u.sort()
    ks = np.max(np.abs(u - (np.arange(1, len(u) + 1) / len(u))))
    assert ks < 1.95 / np.sqrt(len(u))


def test_the_compiled_exp_is_float64s_to_a_few_ulps_and_zero_past_its_floor():
    x = np.concatenate([-np.geomspace(1e-12, 700, 20000), [0.0, -0.0, -707.9, -708.5, -800.0, -np.inf]])
    out, scratch = np.empty_like(x), np.empty(len(x), np.int64)
    exp_nonpositive(x, out, scratch)
    normal = x >= -708
    np.testing.assert_allclose(out[normal], np.exp(x[normal]), rtol=1e-15, atol=0)
    assert out[-3:].tolist() == [0.0, 0.0, 0.0] and out[-4] > 0  # below e^-708: zero, as is -inf


def test_a_row_is_warped_alone_and_warped_row_gives_its_bits():
    """A verification's rows give the bits plain decoding gives for the same row, and
    acceptance may warp only the rows it reaches (warped_row)."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(5, 3000)) * 4
    logits[2, :1500] = -np.inf  # a draft's row: nothing outside its vocabulary
    for params in (
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.3, top_k=40),
        SamplingParams(temperature=0.5, top_k=200, top_p=0.8),
    ):
        together = probabilities(logits, params)
        for i in range(len(logits)):
            alone = probabilities(logits[i : i + 1], params)[0]
            assert np.array_equal(together[i], alone) and np.array_equal(warped_row(logits[i], params), alone)
        assert np.allclose(together.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        # The model's float32 logits, widened by the kernel: the bits of their float64 copy.
        narrow = logits.astype(np.float32)
        assert np.array_equal(probabilities(narrow, params), probabilities(narrow.astype(np.float64), params))
        assert np.array_equal(warped_row(narrow[0], params), probabilities(narrow[:1].astype(np.float64), params)[0])
        assert not together[2, :1500].any()
        if params.top_k:  # the top_k most likely at most, every other token zero
            assert (np.count_nonzero(together, axis=1) <= params.top_k).all()
            for row, p in zip(logits, together):
                assert set(np.flatnonzero(p)) <= set(np.argsort(-row, kind="stable")[: params.top_k])


def test_the_compiled_draw_is_numpys_inverse_cdf_bit_for_bit():
    rng = np.random.default_rng(4)
    for trial in range(200):
        p = rng.dirichlet(np.full(500, 0.05))
        p[rng.integers(0, 500, 100)] = 0.0  # zeros inside, where a step back lands
        u = rng.random() if trial % 10 else 1.0 - 1e-17
        cdf = np.cumsum(p)
        want = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(p) - 1)
        while p[want] == 0 and want > 0:
            want -= 1
        assert sample(p, u) == want


def test_the_kth_largest_is_the_partitions_for_every_k():
    rng = np.random.default_rng(5)
    z = np.round(rng.normal(size=5000) * 3, 1)  # many repeats
    z[:50] = -np.inf
    for k in (1, 2, 7, 50, 999, 1024, 1025, 3000, 4999, 5000):
        assert kth_largest(z, k) == np.partition(z, len(z) - k)[len(z) - k], k
