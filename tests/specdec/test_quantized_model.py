"""The model computing from Q4_1/Q8_0 blocks (qkernels) instead of float32 copies:
which matrices stay quantized, closeness to float32 products of the same values,
bitwise row invariance in batched forwards, and speculative greedy equal to plain
greedy through the quantized products (output head and Medusa heads included)."""

from __future__ import annotations

import numpy as np
import pytest

from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.matmul import BULK_ROWS
from specq.specdec.model import LlamaModel, Segment
from specq.specdec.proposers import MedusaHeads, MedusaProposer, NgramProposer
from specq.specdec.proposers.base import ProposeContext
from specq.specdec.qkernels import QuantizedMatrix
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import GenerationRequest

QUANTIZED = dict(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")
TOKENS = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306, 0, 75, 76, 77]
MATRICES = ("w_qkv", "w_out", "w_gate_up", "w_down")


@pytest.fixture(scope="module")
def quantized(toy_model_file):
    return load_model_and_tokenizer(toy_model_file(**QUANTIZED))


@pytest.fixture(scope="module", params=["f32", "int16", "int8"])
def at_precision(quantized, request):
    """The quantized model at each precision: the bit-level properties hold at both."""
    model, tokenizer = quantized
    return model.at_precision(request.param), tokenizer


def test_q4_1_and_q8_0_matrices_stay_quantized(quantized, toy_model_file):
    model, _ = quantized
    w = model.weights
    for lw in w.layers:
        for name in MATRICES:
            m = getattr(lw, name)
            assert isinstance(m, QuantizedMatrix) and m.type_name == "Q4_1", name
    assert isinstance(w.token_embedding, QuantizedMatrix) and w.token_embedding.type_name == "Q8_0"
    assert w.w_output is w.token_embedding  # tied: the head reads the embedding's blocks
    flt = model.dequantized().weights
    assert flt.w_output is flt.token_embedding
    assert all(isinstance(getattr(lw, n), np.ndarray) for lw in flt.layers for n in MATRICES)
    # Types without a block form at f32 are dequantized at load (K-quants: their
    # scales are not fp16s, which qkernels reads).
    k_quant = LlamaModel.load(toy_model_file(seed=7, n_layers=1, d_model=256, d_ffn=512, tensor_type="Q4_K")).weights
    assert all(getattr(lw, n).dtype == np.float32 for lw in k_quant.layers for n in MATRICES)


def test_parameter_count_does_not_depend_on_the_representation(quantized):
    model, _ = quantized
    cfg = model.config
    d, hd = cfg.d_model, cfg.head_dim
    per_layer = 2 * d + (cfg.n_heads + 2 * cfg.n_kv_heads) * hd * d + d * cfg.n_heads * hd + 3 * cfg.d_ffn * d
    assert model.n_parameters == cfg.vocab_size * d + cfg.n_layers * per_layer + d
    assert model.dequantized().n_parameters == model.n_parameters


def test_quantized_products_are_close_to_float32_products_of_the_same_values(quantized):
    model, _ = quantized
    got = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0]
    want = model.dequantized().forward([Segment(model.new_cache(), TOKENS, 0)])[0]
    diff = np.abs(got.logits - want.logits).max()
    assert diff <= 1e-4 * np.abs(want.logits).max()
    assert diff > 0  # another computation ran: d * sum(q x) + m * sum(x), not float32 weights
    assert (got.logits.argmax(-1) == want.logits.argmax(-1)).all()


def test_a_fused_product_of_mixed_types_is_stacked_in_float32(toy_model_file):
    path = toy_model_file(**QUANTIZED, tensor_types={"blk.0.attn_v.weight": "Q8_0"})
    model = LlamaModel.load(path)
    lw0, lw1 = model.weights.layers[0], model.weights.layers[1]
    assert isinstance(lw0.w_qkv, np.ndarray) and lw0.w_qkv.dtype == np.float32
    assert isinstance(lw0.w_gate_up, QuantizedMatrix) and isinstance(lw1.w_qkv, QuantizedMatrix)
    got = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0].logits
    want = model.dequantized().forward([Segment(model.new_cache(), TOKENS, 0)])[0].logits
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def _verify_beside_a_prompt(model: LlamaModel, prompt_rows: int) -> tuple[list, list]:
    """A 5-row verification segment alone, and in one forward after a prompt."""
    prefix, verify = TOKENS[:7], TOKENS[7:12]

    def cache_with_prefix():
        cache = model.new_cache()
        model.forward([Segment(cache, prefix, 0)])
        return cache

    alone = model.forward([Segment(cache_with_prefix(), verify, len(prefix))])[0]
    prompt = Segment(model.new_cache(), (TOKENS * 5)[:prompt_rows], 0, all_logits=False)
    together = model.forward([prompt, Segment(cache_with_prefix(), verify, len(prefix))])[1]
    return [alone.logits, alone.hidden], [together.logits, together.hidden]


@pytest.mark.parametrize("prompt_rows", [40, BULK_ROWS + 20])
def test_a_row_gets_the_same_bits_beside_a_prompt(at_precision, prompt_rows):
    """A prompt joining a batched round does not change the other requests' bits:
    the quantized kernel is row-invariant at any row count (40 + 5 rows), and a long
    prompt goes through BLAS on its own (matmul.RowPlan). Had the verification rows
    gone through BLAS with it, their bits would differ (see the next test)."""
    alone, together = _verify_beside_a_prompt(at_precision[0], prompt_rows)
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(a, b)


def test_a_long_prompt_by_blas_agrees_with_the_quantized_kernel(quantized):
    model, _ = quantized
    tokens = (TOKENS * 5)[: BULK_ROWS + 20]
    whole = model.forward([Segment(model.new_cache(), tokens, 0)])[0].logits  # BLAS on dequantized values
    cache, parts = model.new_cache(), []
    for start in range(0, len(tokens), 8):  # 8 rows at a time: every product by the kernel
        parts.append(model.forward([Segment(cache, tokens[start : start + 8], start)])[0].logits)
    chunked = np.concatenate(parts)
    np.testing.assert_allclose(whole, chunked, rtol=0, atol=1e-4 * np.abs(chunked).max())
    assert not np.array_equal(whole, chunked)  # the two paths did run


def _plain_greedy(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    cache = model.new_cache()
    logits = model.forward([Segment(cache, prompt, 0, all_logits=False)])[0].logits[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.forward([Segment(cache, out[-1:], len(prompt) + len(out) - 1)])[0].logits[-1]
    return out


def _heads(model: LlamaModel) -> MedusaHeads:
    rng = np.random.default_rng(0)
    d = model.config.d_model
    return MedusaHeads(
        weights=(rng.normal(size=(4, d, d)) * 0.05).astype(np.float32),
        biases=(rng.normal(size=(4, d)) * 0.05).astype(np.float32),
        target_fingerprint=model.fingerprint,
        metadata={},
    )


@pytest.mark.parametrize("proposer", ["ngram", "medusa"])
def test_speculative_greedy_equals_plain_greedy_on_a_quantized_model(at_precision, proposer):
    model, tokenizer = at_precision
    chosen = NgramProposer() if proposer == "ngram" else MedusaProposer(model, _heads(model))
    engine = Engine(model, tokenizer, chosen)
    drafted = 0
    for prompt in ("the cat sat on the mat and the cat", "Hello, world! 12345"):
        ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
        state = engine.run(GenerationRequest(prompt_ids=tuple(ids), max_tokens=30, k=3, adaptive=False))
        assert list(state.output_ids) == _plain_greedy(model, ids, len(state.output_ids))
        drafted += state.metrics.drafted
    assert drafted > 0


def test_medusa_drafts_come_from_the_quantized_output_head(quantized):
    model, _ = quantized
    heads = _heads(model)
    hidden = model.forward([Segment(model.new_cache(), TOKENS[:9], 0)])[0].hidden[-1]
    ctx = ProposeContext(
        tokens=TOKENS[:9],
        n_output=0,
        last_hidden=hidden,
        params=SamplingParams(temperature=1.0),
        stochastic=False,
        want_p_draft=True,
    )  # p_draft: the softmax of the head's logits
    draft = MedusaProposer(model, heads).propose(ctx, 3)
    head_rows = heads.hidden(hidden)[:3]  # [3, d]
    head_matrix = model.weights.w_output.dequantize().astype(np.float64)  # [V, d]
    want = head_rows.astype(np.float64) @ head_matrix.T  # [3, V]
    assert draft.tokens == tuple(int(t) for t in want.argmax(axis=1))
    # Softmax of the quantized product's logits: within float rounding of float64 ones.
    z = np.exp(want - want.max(axis=1, keepdims=True))
    np.testing.assert_allclose(draft.p_draft, z / z.sum(axis=1, keepdims=True), rtol=0, atol=1e-5)
