"""Checks shared by the engine's model tests."""

from __future__ import annotations

import numpy as np

from specq.specdec.model import LlamaModel, Segment


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
