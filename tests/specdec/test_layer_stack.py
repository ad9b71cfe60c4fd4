"""The compiled layer stack gives every row the bits of the Python layer loop.

A forward of short segments (decode steps, verifications, a batched round) runs all
blocks in one numba call (layer_stack); a forward holding a prompt of BULK_ROWS rows
or more (at int16 and int8: of 1,024 rows or more) and every model with non-Q4_1
blocks keep the Python loop (LlamaModel._blocks). Plain decoding, verification and batched rounds only agree
bit for bit if the two do.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from specq.specdec import block_ops, int8
from specq.specdec.matmul import BULK_ROWS
from specq.specdec.model import LlamaModel, Segment

TOKENS = [3, 17, 42, 8, 99, 150, 7, 7, 61, 200, 5, 33, 12, 120, 64, 9, 250, 1, 77, 18]


@pytest.fixture(scope="module")
def q4_model(toy_model_file) -> LlamaModel:
    # d_model 64: the attention output and down products (64 rows) pad their last
    # chunk of 96 lanes, the q|k|v product (96 rows) does not.
    return LlamaModel.load(toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0"))


@pytest.fixture(scope="module", params=["f32", "int16", "int8"])
def stacked(q4_model, request) -> LlamaModel:
    """The model at each precision, each with its own cache: float32, float16 and
    8-bit (model.KV_TYPES)."""
    if request.param != "f32" and not int8.AVAILABLE:
        pytest.skip("the integer precisions need AVX2")
    return q4_model.at_precision(request.param)


def _both_paths(model: LlamaModel, prefix: list[int], new: list[int], parents=None):
    """(stack output, loop output, stack cache, loop cache) for the same segment."""
    results = []
    for use_stack in (True, False):
        cache = model.new_cache(64)
        if prefix:
            model.forward([Segment(cache, prefix, 0)])
        seg = Segment(cache, new, len(prefix), parents=parents)
        stack = model._stack
        try:
            if not use_stack:
                model._stack = None
            results.append((model.forward([seg])[0], cache))
        finally:
            model._stack = stack
    (a, cache_a), (b, cache_b) = results
    return a, b, cache_a, cache_b


def test_default_toy_q4_model_is_stacked(q4_model):
    assert q4_model._stack is not None
    # The layers view the stack's arrays: one copy of the weights in memory.
    lw = q4_model.weights.layers[1]
    arrays = q4_model._stack.arrays  # per kind (qkv, out, gate_up, down): quants, scales
    assert np.shares_memory(lw.w_qkv.quants, arrays[0])
    assert np.shares_memory(lw.w_down.scales, arrays[7])
    # At int8 the same: the int8 layout's arrays are the stack's (quants, d, m per kind).
    if not int8.AVAILABLE:
        return
    int8_model = q4_model.at_precision("int8")
    lw, arrays = int8_model.weights.layers[1], int8_model._stack.arrays
    assert np.shares_memory(lw.w_qkv.quants, arrays[0]) and np.shares_memory(lw.w_down.m, arrays[11])


@pytest.mark.parametrize(
    "prefix,new",
    [
        ([], TOKENS[:1]),  # a first step
        (TOKENS[:9], TOKENS[9:10]),  # a decode step
        (TOKENS[:6], TOKENS[6:11]),  # a verification of 4 drafts
        ([], TOKENS[:17]),  # a short prompt (below matmul.BULK_ROWS)
    ],
)
def test_stack_equals_layer_loop_bit_for_bit(stacked, prefix, new):
    a, b, cache_a, cache_b = _both_paths(stacked, prefix, new)
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.hidden, b.hidden)
    end = len(prefix) + len(new)
    for a_part, b_part in zip(cache_a.stored(end), cache_b.stored(end), strict=True):
        np.testing.assert_array_equal(a_part, b_part)


def test_residuals_are_a_prefills_hidden_states_and_each_blocks_output(stacked):
    prompt = TOKENS[:17]
    final, taps = stacked.residuals(prompt, [0, 1])
    out = stacked.forward([Segment(stacked.new_cache(64), prompt, 0)])[0]
    np.testing.assert_array_equal(final, out.hidden)  # the stack's bits, from the loop
    assert set(taps) == {0, 1} and taps[0].shape == taps[1].shape == (len(prompt), stacked.config.d_model)
    # The last block's output is what the final norm reads.
    np.testing.assert_array_equal(
        block_ops.rms_norm(taps[1], stacked.weights.output_norm, stacked.config.rms_eps), final
    )
    # The first block's output is the second's input: the second block alone, fed it,
    # gives the last output (the loop on a model of the second block only).
    second = copy.copy(stacked)
    second.weights = dataclasses.replace(stacked.weights, layers=stacked.weights.layers[1:])
    second._stack = None
    seg = Segment(second.new_cache(64), prompt, 0)
    rest = second._blocks([seg], taps[0], seg.positions(), np.array([0, len(prompt)]))
    np.testing.assert_array_equal(rest, taps[1])
    assert not np.array_equal(taps[0], taps[1])
    with pytest.raises(ValueError, match="the model has blocks 0 to 1"):
        stacked.residuals(prompt, [2])


def test_stack_equals_layer_loop_on_a_tree(stacked):
    a, b, _, _ = _both_paths(stacked, TOKENS[:8], [5, 9, 11, 13, 2], parents=[-1, 0, 0, 1, 2])
    np.testing.assert_array_equal(a.logits, b.logits)


def test_a_batched_round_through_the_stack_equals_each_segment_alone_through_the_loop(stacked):
    specs = [  # (cached prefix, new tokens, tree parents)
        (TOKENS[:5], TOKENS[5:8], None),
        ([], TOKENS[8:15], None),
        (TOKENS[:10], TOKENS[10:11], None),
        (TOKENS[:7], [4, 6, 8, 10], [-1, 0, 0, 1]),
    ]
    caches = []
    for prefix, _, _ in specs:
        cache = stacked.new_cache(64)
        if prefix:
            stacked.forward([Segment(cache, prefix, 0)])
        caches.append(cache)
    batched = stacked.forward(
        [Segment(c, new, len(prefix), parents=parents) for c, (prefix, new, parents) in zip(caches, specs)]
    )
    for cache, (prefix, new, parents), out in zip(caches, specs, batched):
        _, alone, _, alone_cache = _both_paths(stacked, prefix, new, parents=parents)
        np.testing.assert_array_equal(out.logits, alone.logits)
        np.testing.assert_array_equal(out.hidden, alone.hidden)
        end = len(prefix) + len(new)
        for part, alone_part in zip(cache.stored(end), alone_cache.stored(end), strict=True):
            np.testing.assert_array_equal(part, alone_part)


def test_stack_serves_rounds_without_a_prompt_of_bulk_length(q4_model, monkeypatch):
    """Single sequences and batched rounds go through the stack (so the equality
    tests above compare two paths); a prompt of BULK_ROWS rows or more (BLAS) does
    not, and the forward that holds one runs the other segments apart, through it."""
    calls = []
    real = type(q4_model._stack).run

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(q4_model._stack), "run", counting)
    q4_model.forward([Segment(q4_model.new_cache(), TOKENS[:3], 0)])
    q4_model.forward([Segment(q4_model.new_cache(), TOKENS[:3], 0), Segment(q4_model.new_cache(), TOKENS[:2], 0)])
    assert len(calls) == 2
    long_prompt = (TOKENS * 3)[:BULK_ROWS]
    q4_model.forward([Segment(q4_model.new_cache(), long_prompt, 0)])
    assert len(calls) == 2
    q4_model.forward([Segment(q4_model.new_cache(), long_prompt, 0), Segment(q4_model.new_cache(), TOKENS[:2], 0)])
    assert len(calls) == 3


def test_models_with_other_block_types_keep_the_loop(toy_model_file):
    for kwargs in (dict(), dict(seed=5, tensor_type="Q8_0")):
        model = LlamaModel.load(toy_model_file(**kwargs))
        assert model._stack is None
    q4 = LlamaModel.load(toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0"))
    assert q4.dequantized()._stack is None


@pytest.fixture(params=["int16", "int8"])
def integer_model(q4_model, request) -> LlamaModel:
    if not int8.AVAILABLE:
        pytest.skip("the integer precisions need AVX2")
    return q4_model.at_precision(request.param)


def _prefilled(model: LlamaModel, tokens: list[int], cuts: list[int]):
    """(last row's logits, the cache's contents) after prefilling `tokens` in
    segments ending at `cuts`, one forward each."""
    cache = model.new_cache(len(tokens))
    start = 0
    for end in [*cuts, len(tokens)]:
        out = model.forward([Segment(cache, tokens[start:end], start, all_logits=False)])[0]
        start = end
    return out.logits[-1], cache.stored(len(tokens))


def test_integer_prompts_run_in_the_stack_and_give_the_bits_of_any_split(integer_model, monkeypatch):
    """At int16 and int8 a prompt of BULK_ROWS rows or more runs in the stack too
    (products are the int8 kernels anyway; the stack's attention beats BLAS's blocks
    on one thread): so a prompt prefilled whole, or in pieces as a resumed request
    rebuilds its cache, gets the same bits."""
    calls = []
    real = type(integer_model._stack).run

    def counting(self, *args, **kwargs):
        calls.append(args[1][0].n)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(integer_model._stack), "run", counting)
    prompt = [(7 * i + 3) % 300 for i in range(BULK_ROWS + 40)]
    whole, whole_cache = _prefilled(integer_model, prompt, [])
    assert calls == [len(prompt)]
    pieces, pieces_cache = _prefilled(integer_model, prompt, [BULK_ROWS - 1, BULK_ROWS + 10])
    np.testing.assert_array_equal(whole.view(np.uint32), pieces.view(np.uint32))
    for a, b in zip(whole_cache, pieces_cache, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_long_integer_prompt_shares_its_attention_among_threads_with_the_same_bits(integer_model, monkeypatch):
    """A prompt too long for the stack goes through the Python loop with BLAS on one
    thread, its attention's blocks of rows shared by a pool of threads: the same
    calls on the same shapes as in one thread, so the same bits."""
    import concurrent.futures

    from specq.specdec import model as model_module

    monkeypatch.setattr(model_module, "_INTEGER_STACK_ROWS", BULK_ROWS)
    prompt = [(11 * i + 5) % 300 for i in range(300)]  # five blocks of 64 rows
    used = []

    class Counting(concurrent.futures.ThreadPoolExecutor):
        def map(self, fn, *iterables, **kwargs):
            used.append(1)
            return super().map(fn, *iterables, **kwargs)

    with Counting(2) as pool:
        monkeypatch.setattr(model_module, "_attention_workers", lambda: pool)
        shared, shared_cache = _prefilled(integer_model, prompt, [])
    assert len(used) == len(integer_model.weights.layers)  # once a layer
    monkeypatch.setattr(model_module, "_attention_workers", lambda: None)
    alone, alone_cache = _prefilled(integer_model, prompt, [])
    np.testing.assert_array_equal(shared.view(np.uint32), alone.view(np.uint32))
    for a, b in zip(shared_cache, alone_cache, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_integer_prompt_joins_the_rounds_stack_call_with_the_bits_of_each_alone(integer_model, monkeypatch):
    """A forward holding a prompt (below 1,024 rows) and a decode step runs both in
    one stack call, reading the weights once, and each gets its bits alone."""
    prompt = [(5 * i + 2) % 300 for i in range(BULK_ROWS + 10)]
    prefix = TOKENS[:9]

    def segments():
        step_cache = integer_model.new_cache(16)
        integer_model.forward([Segment(step_cache, prefix, 0)])
        prompt_cache = integer_model.new_cache(len(prompt))
        return [Segment(prompt_cache, prompt, 0, all_logits=False), Segment(step_cache, TOKENS[9:10], len(prefix))]

    alone = [integer_model.forward([seg])[0] for seg in segments()]
    calls = []
    real = type(integer_model._stack).run

    def counting(self, *args, **kwargs):
        calls.append([seg.n for seg in args[1]])
        return real(self, *args, **kwargs)

    round_segments = segments()
    monkeypatch.setattr(type(integer_model._stack), "run", counting)
    together = integer_model.forward(round_segments)
    assert calls == [[len(prompt), 1]]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_array_equal(a.logits.view(np.uint32), b.logits.view(np.uint32))
        np.testing.assert_array_equal(a.hidden.view(np.uint32), b.hidden.view(np.uint32))
