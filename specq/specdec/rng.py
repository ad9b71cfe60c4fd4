"""Counter-based randomness: a draw is a pure function of (seed, position, draw), and
a position's race key of (seed, position).

Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) is
keyed by the request's seed and indexed by a counter, so the uniform used to decide
output token j never depends on how many rounds came before it. A decode restarted
from any committed state therefore draws exactly the numbers an uninterrupted
decode would have drawn, and the decode state needs no generator state of its own.
"""

from __future__ import annotations

import numpy as np

# Which uniform of an output position is meant. Each (position, draw) pair is used
# at most once per request, which keeps the draws independent (the sample rule's
# exactness relies on it).
DRAW_ACCEPT = 0  # the acceptance test of a draft token
DRAW_SAMPLE = 1  # sampling the emitted token (residual, bonus or plain step)
DRAW_PROPOSE = 2  # a stochastic proposer sampling its draft token
DRAW_RACE = 3  # the key of the race rule's exponential race at a position

_MASK64 = (1 << 64) - 1
_ZERO = np.uint64(0)
_2_TO_MINUS_53 = 1.0 / (1 << 53)
_compiled_draw = None  # philox.first_draw, once a draw is asked for


def _first_draw(seed: int, position: int, draw: int) -> int:
    """The first 64-bit draw of np.random.Philox(key=seed mod 2**64, counter=[position,
    draw, 0, 0]), compiled (philox.py: numpy's bits, about 1 us a call from Python,
    where numpy built a generator for each draw in about 30)."""
    global _compiled_draw
    if _compiled_draw is None:
        # Imported at the first draw: acceptance (and so this module) is read by the
        # command line, which must not load numba until a command decodes
        # (tests/test_architecture.py). An import at every call cost 1 us more.
        from specq.specdec.philox import first_draw

        _compiled_draw = first_draw
    return int(_compiled_draw(np.uint64(seed & _MASK64), _ZERO, np.uint64(position), np.uint64(draw), _ZERO, _ZERO))


def uniform(seed: int, position: int, draw: int) -> float:
    """A uniform number in [0, 1) for output position `position` of request `seed`:
    np.random.Generator(np.random.Philox(key=seed, counter=[position, draw, 0, 0]))
    .random(), its first draw's top 53 bits."""
    assert position >= 0 and draw >= 0
    return (_first_draw(seed, position, draw) >> 11) * _2_TO_MINUS_53


def race_key(seed: int, position: int) -> int:
    """The 64-bit key of output position `position`'s exponential race (the race
    rule, sampling_kernels.race): the target's and every draft's race there share it."""
    assert position >= 0
    return _first_draw(seed, position, DRAW_RACE)
