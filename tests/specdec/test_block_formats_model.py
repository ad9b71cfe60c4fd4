"""Models whose files use the other block types (Q4_0, Q5_0, Q5_1, Q4_K, Q6_K, and a
Q4_K_M-style mix of types from layer to layer) at the integer precisions: every
matrix kept in blocks and computed by the int8 kernels (no float32 copy), the
compiled block loop built and giving the Python loop's bits, logits close to the
f32 precision's (which test_model checks against a float64 reference), a row's
bits independent of its companions, and speculative greedy equal to plain greedy."""

from __future__ import annotations

import numpy as np
import pytest
from model_helpers import assert_stack_equals_python_loop

from specq.specdec import int8, int8_stack
from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import KVCache, LlamaModel, Segment
from specq.specdec.proposers import NgramProposer, NoProposer
from specq.specdec.state import GenerationRequest

pytestmark = pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 kernels need AVX2")

TOKENS = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306, 0, 75, 76, 77]
MATRICES = ("w_qkv", "w_out", "w_gate_up", "w_down")
K_SHAPE = dict(n_layers=2, d_model=256, d_ffn=512)  # K-quant rows hold whole blocks of 256
# As llama.cpp's Q4_K_M writes a model: Q4_K, with Q6_K for half the layers' attn_v
# and ffn_down (and for the embedding), so that layers differ in format, and the q,
# k and v matrices of one layer differ in type.
MIX = {
    "blk.0.attn_v.weight": "Q6_K",
    "blk.1.ffn_down.weight": "Q6_K",
    "blk.0.attn_q.weight": "Q5_0",  # layer 0's q|k|v: Q5_0, Q4_K and Q6_K, stacked as Q8_H
    "blk.1.attn_q.weight": "Q5_0",  # layer 1's: Q5_0 and Q4_K, stacked as Q8_M
}
CASES = {
    "q4_0": (dict(seed=20, tensor_type="Q4_0", embedding_type="Q8_0"), {"Q4_1"}),
    "q5_0": (dict(seed=21, tensor_type="Q5_0", embedding_type="Q8_0"), {"Q8_0"}),
    "q5_1": (dict(seed=22, tensor_type="Q5_1", embedding_type="Q8_0"), {"Q8_M"}),
    "q6_k": (dict(seed=23, tensor_type="Q6_K", **K_SHAPE), {"Q8_H"}),
    # Q4_1 matrices with the file's float16 scales beside ones unpacked from Q4_K,
    # whose scales are float32: one loop takes both (int8_stack._laid_end_to_end).
    "q4_1_q4_k": (
        dict(seed=29, tensor_type="Q4_1", tensor_types={"blk.1.ffn_down.weight": "Q4_K"}, **K_SHAPE),
        {"Q4_1"},
    ),
    "q4_k_m_mix": (
        dict(seed=24, tensor_type="Q4_K", embedding_type="Q6_K", tensor_types=MIX, **K_SHAPE),
        {"Q4_1", "Q8_H", "Q8_M"},
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(toy_model_file, request):
    kwargs, formats = CASES[request.param]
    path = toy_model_file(**kwargs)
    f32, tokenizer = load_model_and_tokenizer(path)
    return f32, f32.at_precision("int16"), formats, tokenizer


def test_every_matrix_stays_in_blocks_on_the_int8_kernels(case):
    f32, model, formats, _ = case
    assert model._stack is not None  # the compiled block loop
    seen = set()
    for lw in model.weights.layers:
        for k in MATRICES:
            w = getattr(lw, k)
            assert isinstance(w, int8.Int8Matrix) and w.split, k
            seen.add(w.type_name)
    assert seen == formats
    assert isinstance(model.weights.w_output, int8.Int8Matrix)
    assert model.n_parameters == f32.n_parameters
    # The products alone: a float16 cache (int16's own values are 8-bit, an error of their own).
    got = model.forward([Segment(KVCache(model.config, 256, np.float16), TOKENS, 0)])[0].logits
    want = f32.forward([Segment(f32.new_cache(), TOKENS, 0)])[0].logits
    assert not np.array_equal(got, want)  # integer activations: another computation
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_scales_of_two_widths_share_the_mixed_loop_as_float32(toy_model_file):
    model = LlamaModel.load(toy_model_file(**CASES["q4_1_q4_k"][0]), "int16")
    assert model._stack.compiled[0] is int8_stack._run_mixed  # the Q4_1 loop is for float16 scales only
    # One dtype a kind: layer 1's ffn_down is Q4_K's, so every ffn_down has float32 scales.
    dtypes = {k: {getattr(lw, k).d.dtype for lw in model.weights.layers} for k in MATRICES}
    assert dtypes == {
        "w_qkv": {np.dtype(np.uint16)},
        "w_out": {np.dtype(np.uint16)},
        "w_gate_up": {np.dtype(np.uint16)},
        "w_down": {np.dtype(np.float32)},
    }
    plain = LlamaModel.load(toy_model_file(**CASES["q4_0"][0]), "int16")  # Q4_0's d and -8 d: float16
    assert plain._stack.compiled[0] is int8_stack._run
    assert {getattr(lw, k).d.dtype for lw in plain.weights.layers for k in MATRICES} == {np.dtype(np.uint16)}


def test_the_compiled_block_loop_gives_the_python_loops_bits(case):
    assert_stack_equals_python_loop(case[1], TOKENS)


def test_a_rows_bits_do_not_depend_on_its_companions(case):
    _, model, _, _ = case
    caches = [model.new_cache() for _ in range(3)]
    for i, c in enumerate(caches):
        model.forward([Segment(c, TOKENS[i : i + 9], 0)])
    together = model.forward([Segment(c, [5 + i, 9], 9) for i, c in enumerate(caches)])
    for i in range(3):
        alone_cache = model.new_cache()
        model.forward([Segment(alone_cache, TOKENS[i : i + 9], 0)])
        alone = model.forward([Segment(alone_cache, [5 + i, 9], 9)])[0]
        np.testing.assert_array_equal(together[i].logits.view(np.uint32), alone.logits.view(np.uint32))


def test_speculative_greedy_equals_plain_greedy(case):
    _, model, _, tokenizer = case
    engine = Engine(model, tokenizer, NgramProposer())
    ids = tokenizer.encode_chat([{"role": "user", "content": "the cat sat on the mat and the cat"}])
    state = engine.run(GenerationRequest(prompt_ids=tuple(ids), max_tokens=30, k=3, adaptive=False))
    plain = Engine(model, tokenizer, NoProposer()).run(
        GenerationRequest(prompt_ids=tuple(ids), max_tokens=30, k=3, adaptive=False)
    )
    assert plain.metrics.drafted == 0
    assert list(state.output_ids) == list(plain.output_ids)
    assert state.metrics.drafted > 0


def test_a_model_cache_file_keeps_the_mixed_stack(case, tmp_path):
    """The pickled model (model_cache) names the mixed loop's functions and maps
    the same arrays: a loaded copy computes the same bits."""
    from specq.specdec import model_cache

    _, model, _, _ = case
    built = model_cache.load_or_build(str(tmp_path), "f" * 64, "int16", lambda: model)
    again = model_cache.load_or_build(str(tmp_path), "f" * 64, "int16", lambda: pytest.fail("rebuilt"))
    assert again is not built and again._stack is not None
    want = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0].logits
    got = again.forward([Segment(again.new_cache(), TOKENS, 0)])[0].logits
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_q4_0_file_at_f32_computes_from_its_blocks(toy_model_file):
    """Q4_0 is exactly Q4_1 with m = -8 d, and Q5_0 exactly Q8_0: the f32
    precision's kernels and compiled loop take them as such."""
    from specq.specdec.qkernels import QuantizedMatrix

    for kwargs, type_name in ((CASES["q4_0"][0], "Q4_1"), (CASES["q5_0"][0], "Q8_0")):
        model = LlamaModel.load(toy_model_file(**kwargs))
        for lw in model.weights.layers:
            for k in MATRICES:
                w = getattr(lw, k)
                assert isinstance(w, QuantizedMatrix) and w.type_name == type_name
        assert (model._stack is not None) == (type_name == "Q4_1")  # the f32 compiled loop is Q4_1's
