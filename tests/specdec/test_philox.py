"""The compiled Philox (specq.specdec.philox) gives numpy's bits, so every draw and
race key a request was decoded with before stays what it was."""

from __future__ import annotations

import numpy as np
import pytest

from specq.specdec.philox import first_draw
from specq.specdec.rng import DRAW_RACE, race_key, uniform

_MASK64 = (1 << 64) - 1


def _numpy_first_draw(key: int, counter: list[int]) -> int:
    """numpy's first 64-bit draw, its counter set as uint64 words (a list of Python
    ints above 2**63 is not taken whole by Philox's constructor)."""
    bits = np.random.Philox(key=key)
    state = bits.state
    state["state"]["counter"] = np.array(counter, dtype=np.uint64)
    state["buffer_pos"] = 4  # the next draw enciphers the next counter, as a fresh generator's
    bits.state = state
    return int(bits.random_raw())


def test_first_draw_is_numpy_philox_for_random_keys_and_counters():
    rng = np.random.default_rng(7)
    for _ in range(500):
        key = int(rng.integers(0, 2**64, dtype=np.uint64)) | (int(rng.integers(0, 2**64, dtype=np.uint64)) << 64)
        counter = [int(rng.integers(0, 2**64, dtype=np.uint64)) for _ in range(4)]
        got = first_draw(np.uint64(key & _MASK64), np.uint64(key >> 64), *(np.uint64(c) for c in counter))
        assert int(got) == _numpy_first_draw(key, counter)


@pytest.mark.parametrize(
    "counter",
    [
        [_MASK64, 3, 0, 0],  # carry into the second word
        [_MASK64, _MASK64, 0, 0],  # into the third
        [_MASK64, _MASK64, _MASK64, 1],  # into the fourth
        [_MASK64, _MASK64, _MASK64, _MASK64],  # all the way round
    ],
)
def test_first_draw_carries_the_counter_as_numpy_does(counter):
    got = first_draw(np.uint64(99), np.uint64(0), *(np.uint64(c) for c in counter))
    assert int(got) == _numpy_first_draw(99, counter)


def test_uniform_and_race_key_are_numpys_draws():
    """As rng computed them with numpy's generators before (the checkpoints of
    sampled requests rely on the same numbers)."""
    rng = np.random.default_rng(11)
    seeds = [0, 1, -1, -(2**40), 2**63 + 5, 2**64 + 3, *(int(s) for s in rng.integers(0, 2**62, 40))]
    for seed in seeds:
        for position in (0, 1, 17, 4095, int(rng.integers(0, 10**6))):
            for draw in range(4):
                bits = np.random.Philox(key=seed & _MASK64, counter=[position, draw, 0, 0])
                assert uniform(seed, position, draw) == float(np.random.Generator(bits).random())
            bits = np.random.Philox(key=seed & _MASK64, counter=[position, DRAW_RACE, 0, 0])
            assert race_key(seed, position) == int(bits.random_raw())
