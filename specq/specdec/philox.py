"""Philox4x64-10 compiled: the bits numpy's `np.random.Philox` gives, for one draw.

Why. rng.uniform and rng.race_key are pure functions of (seed, position, draw), and
numpy answers one by building a Philox bit generator (and a Generator) each time:
about 30 us a call, against 0.17 ms for the warp and race of a row it keys. A
sampled round of 32 requests asked for 32 keys or more, about 1 ms of Python a
round. Here a call is the ten rounds of the cipher: about 1 us from Python.

numpy's Philox (Salmon et al. 2011, Random123's philox4x64_R with 10 rounds) keeps
a 256-bit counter and a 128-bit key, and on its first draw adds one to the counter
before enciphering it; the four 64-bit words it returns are then handed out in
order. So the first draw of `Philox(key=k, counter=c)` is word 0 of the cipher of
c + 1 under (k mod 2**64, k >> 64). tests/specdec/test_philox.py checks the bits
against numpy's for many keys and counters, carries included.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_M0 = np.uint64(0xD2E7470EE14C6C93)
_M1 = np.uint64(0xCA5A826395121157)
_W0 = np.uint64(0x9E3779B97F4A7C15)
_W1 = np.uint64(0xBB67AE8584CAA73B)
_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_ROUNDS = 10


@njit(inline="always")
def _mulhilo(a, b):  # pragma: no cover - compiled
    """(high, low) 64-bit halves of the 128-bit product a * b, from 32-bit pieces."""
    a_lo, a_hi = a & _LOW32, a >> _S32
    b_lo, b_hi = b & _LOW32, b >> _S32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    hi_hi = a_hi * b_hi
    middle = (lo_lo >> _S32) + (hi_lo & _LOW32) + (lo_hi & _LOW32)
    high = hi_hi + (hi_lo >> _S32) + (lo_hi >> _S32) + (middle >> _S32)
    return high, a * b


@njit(nogil=True, cache=True)
def first_draw(key0, key1, c0, c1, c2, c3):  # pragma: no cover - compiled
    """The first 64-bit draw (uint64) of numpy's Philox with key (key0, key1) and
    counter (c0, c1, c2, c3), all uint64: word 0 of the cipher of the counter plus one."""
    one = np.uint64(1)
    c0 = c0 + one
    if c0 == 0:  # the counter's carry, as numpy's
        c1 = c1 + one
        if c1 == 0:
            c2 = c2 + one
            if c2 == 0:
                c3 = c3 + one
    for r in range(_ROUNDS):
        if r > 0:
            key0 = key0 + _W0
            key1 = key1 + _W1
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ key0, lo1, hi0 ^ c3 ^ key1, lo0
    return c0
