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


def assert_rounds_and_chains_equal_rows_alone(model: LlamaModel, prompts: list[list[int]], chain: list[int]) -> None:
    """A decode round of every prompt's last token gives each row the logits it gets
    in a round alone, and a chain of tokens in one forward those it gets token by
    token, bit for bit (bitwise row invariance, whatever path many rows take)."""

    def prefilled() -> list:
        caches = [model.new_cache() for _ in prompts]
        for cache, p in zip(caches, prompts):
            model.forward([Segment(cache, p[:-1], 0, all_logits=False)])
        return caches

    together = model.forward([Segment(c, [p[-1]], len(p) - 1) for c, p in zip(prefilled(), prompts)])
    alone = [model.forward([Segment(c, [p[-1]], len(p) - 1)])[0] for c, p in zip(prefilled(), prompts)]
    for a, b in zip(together, alone):
        np.testing.assert_array_equal(a.logits.view(np.uint32), b.logits.view(np.uint32))
    whole = model.forward([Segment(model.new_cache(), chain, 0)])[0].logits
    cache = model.new_cache()
    one_by_one = [model.forward([Segment(cache, [t], i)])[0].logits for i, t in enumerate(chain)]
    np.testing.assert_array_equal(whole.view(np.uint32), np.concatenate(one_by_one).view(np.uint32))


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
