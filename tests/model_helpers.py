"""Checks shared by the engine's model tests."""

from __future__ import annotations

import numpy as np

from specq.specdec.model import LlamaModel, Segment
from specq.specdec.proposers import RecurrentHead

# 24 token ids of the toy models (vocabulary of at least 307), for prompts and chains.
TOY_TOKENS = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306, 0, 75, 76, 77]


def assert_stack_equals_python_loop(model: LlamaModel, tokens: list[int]) -> None:
    """The compiled block loop (layer_stack / int8_stack) gives the logits and
    hidden states of the Python loop over the same weights, bit for bit."""
    assert model._stack is not None
    stacked = model.forward([Segment(model.new_cache(), tokens, 0)])[0]
    stack, model._stack = model._stack, None
    try:
        looped = model.forward([Segment(model.new_cache(), tokens, 0)])[0]
    finally:
        model._stack = stack
    np.testing.assert_array_equal(stacked.logits.view(np.uint32), looped.logits.view(np.uint32))
    np.testing.assert_array_equal(stacked.hidden.view(np.uint32), looped.hidden.view(np.uint32))


def random_recurrent_head(model, seed: int = 0, scale: float = 0.05, hidden: int = 32) -> RecurrentHead:
    """Random weights (stored as Q8_0, as trained heads are), and a draft vocabulary of
    every other token: drafts outside it are impossible, as with a real head's."""
    rng = np.random.default_rng(seed)
    d = model.config.d_model
    return RecurrentHead.from_float(
        w_in=rng.normal(size=(2 * d, hidden)) * scale,
        b_in=rng.normal(size=hidden) * scale,
        w_out=rng.normal(size=(hidden, d)) * scale,
        vocab=np.arange(0, model.config.vocab_size, 2, dtype=np.int64),
        target_fingerprint=model.fingerprint,
        metadata={"made_by": "test"},
    )
