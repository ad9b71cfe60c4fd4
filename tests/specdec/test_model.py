"""The LLaMA forward: against an independent reference written here, and invariance
of the KV-cache paths (incremental, rollback, ragged batches, growth) against one
full forward."""

from __future__ import annotations

import llama_cpp_record
import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize
from llama_cpp_record import ROWS

from specq.errors import ModelFileError, ParameterError
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.matmul import BULK_ROWS
from specq.specdec.model import LlamaModel, Segment
from specq.testing import toy_gguf

TOKENS = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306, 0, 75, 76, 77]


# --- an independent reference: slow, obvious, float64 ------------------------------


def _reference_weights(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    reader = GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    weights = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF ne -> numpy order
        weights[t.name] = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float64)
    return meta, weights


def reference_forward(path: str, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(logits [T, vocab], final-normed hidden [T, d]) of the whole sequence from
    position 0, without a cache, one head and one position at a time."""
    meta, w = _reference_weights(path)
    arch = meta["general.architecture"]
    d = meta[f"{arch}.embedding_length"]
    n_heads = meta[f"{arch}.attention.head_count"]
    n_kv = meta[f"{arch}.attention.head_count_kv"]
    hd = meta.get(f"{arch}.attention.key_length", d // n_heads)
    base = meta[f"{arch}.rope.freq_base"]
    eps = meta[f"{arch}.attention.layer_norm_rms_epsilon"]
    n_tok = len(token_ids)
    factors = w.get("rope_freqs.weight", np.ones(hd // 2))  # Llama 3.1's frequency factors
    linear = meta.get(f"{arch}.rope.scaling.factor", 1.0) if meta.get(f"{arch}.rope.scaling.type") == "linear" else 1.0
    neox = arch in ("qwen2", "qwen3", "gemma", "gemma2", "gemma3")  # these files rotate halves
    gemma = arch in ("gemma", "gemma2", "gemma3")
    post_norms = arch in ("gemma2", "gemma3")
    attn_cap = meta.get(f"{arch}.attn_logit_softcapping", 0.0) if arch == "gemma2" else 0.0
    final_cap = meta.get(f"{arch}.final_logit_softcapping", 0.0) if arch == "gemma2" else 0.0

    def rms_norm(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    def rope(vec, pos, base):
        # GGUF llama (llama.cpp permuted Q/K): rotate adjacent pairs (x[2i], x[2i+1]);
        # qwen2: the two halves (x[i], x[i + hd/2]).
        out = vec.copy()
        for i in range(hd // 2):
            a, b = (i, i + hd // 2) if neox else (2 * i, 2 * i + 1)
            angle = pos / linear * base ** (-2 * i / hd) / factors[i]
            c, s = np.cos(angle), np.sin(angle)
            out[a] = vec[a] * c - vec[b] * s
            out[b] = vec[a] * s + vec[b] * c
        return out

    def silu(x):
        return x / (1 + np.exp(-x))

    def gelu(x):  # the tanh form, Gemma's
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    x = w["token_embd.weight"][token_ids]  # [T, d]
    if gemma:
        x = x * np.sqrt(d)
    for layer in range(meta[f"{arch}.block_count"]):
        p = f"blk.{layer}."
        # Local layers: gemma3's all but every sixth (with their own RoPE base), gemma2's even ones.
        local = (arch == "gemma3" and layer % 6 < 5) or (arch == "gemma2" and layer % 2 == 0)
        layer_base = 10000.0 if local and arch == "gemma3" else base
        window = meta.get(f"{arch}.attention.sliding_window", n_tok) if local else n_tok
        h = rms_norm(x, w[p + "attn_norm.weight"])
        q = h @ w[p + "attn_q.weight"].T + w.get(p + "attn_q.bias", 0.0)  # [T, Hq * hd]
        k = h @ w[p + "attn_k.weight"].T + w.get(p + "attn_k.bias", 0.0)  # [T, Hkv * hd]
        v = h @ w[p + "attn_v.weight"].T + w.get(p + "attn_v.bias", 0.0)
        attn = np.zeros((n_tok, n_heads * hd))
        for head in range(n_heads):
            kv_head = head // (n_heads // n_kv)
            q_norm = w.get(p + "attn_q_norm.weight")  # qwen3: each head's q and k RMS-normed first
            k_norm = w.get(p + "attn_k_norm.weight")
            qs = [q[t, head * hd : (head + 1) * hd] for t in range(n_tok)]
            ks = [k[t, kv_head * hd : (kv_head + 1) * hd] for t in range(n_tok)]
            if q_norm is not None:
                qs, ks = [rms_norm(x, q_norm) for x in qs], [rms_norm(x, k_norm) for x in ks]
            qs = [rope(qs[t], t, layer_base) for t in range(n_tok)]
            ks = [rope(ks[t], t, layer_base) for t in range(n_tok)]
            vs = [v[t, kv_head * hd : (kv_head + 1) * hd] for t in range(n_tok)]
            for t in range(n_tok):
                seen = range(max(0, t - window + 1), t + 1)
                scores = np.array([qs[t] @ ks[s] / np.sqrt(hd) for s in seen])
                if attn_cap:
                    scores = attn_cap * np.tanh(scores / attn_cap)
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                attn[t, head * hd : (head + 1) * hd] = sum(p * vs[s] for p, s in zip(probs, seen))
        y = attn @ w[p + "attn_output.weight"].T
        x = x + (rms_norm(y, w[p + "post_attention_norm.weight"]) if post_norms else y)
        h = rms_norm(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        up = h @ w[p + "ffn_up.weight"].T
        y = ((gelu(gate) if gemma else silu(gate)) * up) @ w[p + "ffn_down.weight"].T
        x = x + (rms_norm(y, w[p + "post_ffw_norm.weight"]) if post_norms else y)
    hidden = rms_norm(x, w["output_norm.weight"])
    head = w.get("output.weight", w["token_embd.weight"])  # tied when absent
    logits = hidden @ head.T
    return (final_cap * np.tanh(logits / final_cap) if final_cap else logits), hidden


# --- helpers --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(toy_model_path) -> LlamaModel:
    return LlamaModel.load(toy_model_path)


def full_logits(model: LlamaModel, tokens: list[int]) -> np.ndarray:
    return model.forward([Segment(model.new_cache(), tokens, 0)])[0].logits


def chunked_logits(model: LlamaModel, tokens: list[int], sizes: list[int], capacity: int = 256) -> np.ndarray:
    """Feed `tokens` in chunks of the given sizes (the last size repeats) through one cache."""
    cache = model.new_cache(capacity)
    rows, pos, i = [], 0, 0
    while pos < len(tokens):
        n = sizes[min(i, len(sizes) - 1)]
        rows.append(model.forward([Segment(cache, tokens[pos : pos + n], pos)])[0].logits)
        pos, i = pos + n, i + 1
    return np.concatenate(rows)


def greedy(model: LlamaModel, prompt: list[int], n_new: int) -> list[int]:
    cache = model.new_cache()
    logits = model.forward([Segment(cache, prompt, 0, all_logits=False)])[0].logits
    out = list(prompt)
    for _ in range(n_new):
        out.append(int(np.argmax(logits[-1])))
        logits = model.forward([Segment(cache, out[-1:], len(out) - 1)])[0].logits
    return out[len(prompt) :]


# --- (a), (g), (h): the forward against the reference ---------------------------------

REFERENCE_CASES = {
    "f32_gqa_tied": dict(),
    "f32_mqa_untied_3_layers": dict(seed=1, n_layers=3, n_kv_heads=1, tied=False, rope_base=500.0),
    "f32_mha": dict(seed=2, n_heads=2, n_kv_heads=2, d_model=32, d_ffn=96),
    "f16": dict(seed=4, tensor_type="F16"),
    "q8_0": dict(seed=5, tensor_type="Q8_0"),
    "q4_1_with_q8_0_embedding": dict(seed=6, tensor_type="Q4_1", embedding_type="Q8_0"),
    "q4_k_q6_k": dict(seed=7, n_layers=1, d_model=256, d_ffn=512, tensor_type="Q4_K", embedding_type="Q6_K"),
    "q4_0": dict(seed=20, tensor_type="Q4_0", embedding_type="Q8_0"),
    "q5_0": dict(seed=21, tensor_type="Q5_0", embedding_type="Q8_0"),
    "q5_1": dict(seed=22, tensor_type="Q5_1", embedding_type="Q8_0"),
    "q4_k_m_mix": dict(
        seed=24,
        n_layers=2,
        d_model=256,
        d_ffn=512,
        tensor_type="Q4_K",
        embedding_type="Q6_K",
        tensor_types={
            "blk.0.attn_v.weight": "Q6_K",
            "blk.1.ffn_down.weight": "Q6_K",
            "blk.0.attn_q.weight": "Q5_0",
            "blk.1.attn_q.weight": "Q5_0",
        },
    ),
    "qwen2_f32": dict(seed=8, architecture="qwen2", rope_base=1000.0),
    "qwen2_q4_1": dict(seed=9, architecture="qwen2", tensor_type="Q4_1", embedding_type="Q8_0"),
    "qwen2_q4_k": dict(seed=10, architecture="qwen2", n_layers=1, d_model=256, d_ffn=512, tensor_type="Q4_K"),
    "qwen3_f32_wide_heads": dict(seed=12, architecture="qwen3", head_dim=32),
    "llama3_rope_factors": dict(seed=15, rope_factors=True, rope_base=500000.0),
    "linear_rope_scaling": dict(seed=16, rope_linear=4.0, tensor_type="Q4_1"),
    "qwen3_q8_0": dict(seed=13, architecture="qwen3", tensor_type="Q8_0"),
    # 7 layers: layer 5 global (RoPE base 1e6), the others local (10000); wide heads.
    "gemma3_f32": dict(seed=17, architecture="gemma3", n_layers=7, head_dim=32, rope_base=1e6, sliding_window=64),
    "gemma3_q4_1": dict(seed=18, architecture="gemma3", head_dim=32, tensor_type="Q4_1", sliding_window=64),
    "gemma_f32": dict(seed=21, architecture="gemma", head_dim=32),
    # Heads as wide as d_model / n_heads and Q4_1 blocks: a block the compiled loop
    # would take if it did not know Gemma's GeGLU (as Gemma 1 2B's).
    "gemma_q4_1_square_heads": dict(seed=25, architecture="gemma", tensor_type="Q4_1", embedding_type="Q8_0"),
    # Soft caps small enough to bite (scores reach about 10, logits about 20).
    "gemma2_window": dict(seed=22, architecture="gemma2", n_layers=3, sliding_window=8, softcaps=(5.0, 8.0)),
    "gemma2_q8_0": dict(seed=23, architecture="gemma2", tensor_type="Q8_0", sliding_window=8),
    # A window of 8 over 24 tokens: the local layers' rows see their last 8 positions.
    "gemma3_window": dict(seed=19, architecture="gemma3", n_layers=7, head_dim=32, sliding_window=8),
    "qwen3_q4_1_wide_heads": dict(seed=14, architecture="qwen3", head_dim=32, tensor_type="Q4_1"),
}


@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_forward_matches_reference(toy_model_file, case):
    path = toy_model_file(**REFERENCE_CASES[case])
    model = LlamaModel.load(path)
    want_logits, want_hidden = reference_forward(path, TOKENS)
    out = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0]
    assert out.logits.shape == (len(TOKENS), model.config.vocab_size)
    assert out.hidden.shape == (len(TOKENS), model.config.d_model)
    np.testing.assert_allclose(out.logits, want_logits, rtol=0, atol=1e-4)
    # float32's rounding grows with the values: relative to the largest (Q4_0's
    # blocks, at f32 d q + m with m = -8 d, come within 1.1e-5 of values near 0.8).
    np.testing.assert_allclose(out.hidden, want_hidden, rtol=0, atol=1e-5 * np.abs(want_hidden).max())


def test_config_from_metadata(toy_model_file):
    path = toy_model_file(**REFERENCE_CASES["f32_mqa_untied_3_layers"])
    cfg = LlamaModel.load(path).config
    assert (cfg.n_layers, cfg.d_model, cfg.d_ffn) == (3, 64, 128)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (4, 1, 16)
    assert cfg.rope_base == 500.0
    assert cfg.rms_eps == pytest.approx(1e-5)
    assert cfg.vocab_size == toy_gguf.toy_vocab_size() == 307
    assert cfg.context_length == 512


def test_untied_head_uses_output_weight(toy_model_file):
    path = toy_model_file(**REFERENCE_CASES["f32_mqa_untied_3_layers"])
    model = LlamaModel.load(path)
    f = GGUFFile(path)
    out = model.forward([Segment(model.new_cache(), TOKENS[:6], 0)])[0]
    np.testing.assert_allclose(out.logits, out.hidden @ f.tensor("output.weight").T, atol=1e-4)
    assert np.abs(out.logits - out.hidden @ f.tensor("token_embd.weight").T).max() > 1.0


def test_logits_are_peaked(model):
    """The toy models' contract that argmax comparisons rely on: logits spread over
    several units and a clear winner almost everywhere."""
    rows = [full_logits(model, TOKENS)]
    for seed in range(3):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(3, model.config.vocab_size, size=8)]
        rows.append(full_logits(model, prompt + greedy(model, prompt, 24)))
    logits = np.concatenate(rows)
    assert logits.std(axis=1).min() >= 3.0
    top2 = np.sort(logits, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    assert np.median(gaps) > 0.3
    assert np.mean(gaps > 1e-3) >= 0.99


def test_greedy_output_repeats_enough_for_prompt_lookup(model):
    out = greedy(model, TOKENS[:8], 48)
    assert len(set(out)) >= 3  # not a single token forever
    seq = TOKENS[:8] + out
    hits = 0  # positions where the latest earlier occurrence of the preceding 2-gram predicts right
    for i in range(10, len(seq)):
        for j in range(i - 3, -1, -1):
            if seq[j : j + 2] == seq[i - 2 : i]:
                hits += seq[j + 2] == seq[i]
                break
    assert hits >= 10


# --- (b) incremental decoding ------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes", [[6, 1], [3], [1], [5, 2, 7, 1]], ids=["prefill_then_1", "chunks_of_3", "one_by_one", "mixed"]
)
def test_incremental_equals_full_forward(model, sizes):
    np.testing.assert_allclose(chunked_logits(model, TOKENS, sizes), full_logits(model, TOKENS), rtol=0, atol=1e-4)


# --- (c) rollback --------------------------------------------------------------------------


@pytest.mark.parametrize("n_replacement", [1, 3, 6])
def test_rejected_drafts_leave_no_trace(model, n_replacement):
    prefix, drafts = TOKENS[:7], [300, 301, 302, 303, 304]
    replacement = TOKENS[7 : 7 + n_replacement]
    p = len(prefix)
    cache = model.new_cache()
    model.forward([Segment(cache, prefix, 0)])
    model.forward([Segment(cache, drafts, p)])  # positions p .. p+4, then rejected
    got = model.forward([Segment(cache, replacement, p)])[0]
    after = model.forward([Segment(cache, [5], p + n_replacement)])[0]

    fresh = model.new_cache()
    model.forward([Segment(fresh, prefix, 0)])
    want = model.forward([Segment(fresh, replacement, p)])[0]
    want_after = model.forward([Segment(fresh, [5], p + n_replacement)])[0]
    np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.hidden, want.hidden, rtol=0, atol=1e-5)
    np.testing.assert_allclose(after.logits, want_after.logits, rtol=0, atol=1e-5)


def test_drafts_do_change_the_logits(model):
    # Guards the rollback test: seeing the drafts would have made a difference.
    prefix = TOKENS[:7]
    a = full_logits(model, prefix + [300, 301, 302, 303, 304, 5])[-1]
    b = full_logits(model, prefix + [5])[-1]
    assert np.abs(a - b).max() > 0.1


# --- (d) ragged batch, (e) last-row-only logits ------------------------------------------


def test_ragged_batch_equals_each_segment_alone(model):
    specs = [  # (already cached prefix, new tokens, all_logits)
        (TOKENS[:5], TOKENS[5:8], True),
        ([], TOKENS[8:15], True),
        (TOKENS[:10], TOKENS[20:21], False),
    ]

    def prepared(prefix):
        cache = model.new_cache()
        if prefix:
            model.forward([Segment(cache, prefix, 0)])
        return cache

    batch_caches = [prepared(prefix) for prefix, _, _ in specs]
    batched = model.forward(
        [Segment(c, new, len(prefix), all_logits=all_) for c, (prefix, new, all_) in zip(batch_caches, specs)]
    )
    assert len(batched) == 3
    for cache, (prefix, new, all_), out in zip(batch_caches, specs, batched):
        alone_cache = prepared(prefix)
        alone = model.forward([Segment(alone_cache, new, len(prefix), all_logits=all_)])[0]
        # Bit for bit: a row's products and attention do not depend on its company.
        assert out.logits.shape == alone.logits.shape
        np.testing.assert_array_equal(out.logits, alone.logits)
        np.testing.assert_array_equal(out.hidden, alone.hidden)
        # The batch wrote each cache as running alone would have: the next step agrees.
        end = len(prefix) + len(new)
        nxt = model.forward([Segment(cache, [9], end)])[0].logits
        nxt_alone = model.forward([Segment(alone_cache, [9], end)])[0].logits
        np.testing.assert_array_equal(nxt, nxt_alone)


def test_last_row_only(model):
    all_rows = model.forward([Segment(model.new_cache(), TOKENS[:9], 0, all_logits=True)])[0]
    last = model.forward([Segment(model.new_cache(), TOKENS[:9], 0, all_logits=False)])[0]
    assert last.logits.shape == (1, model.config.vocab_size)
    np.testing.assert_allclose(last.logits[0], all_rows.logits[-1], rtol=0, atol=1e-5)
    assert last.hidden.shape == all_rows.hidden.shape  # hidden keeps every row
    np.testing.assert_allclose(last.hidden, all_rows.hidden, rtol=0, atol=1e-5)


# --- (f) cache growth and the context limit ----------------------------------------------


@pytest.mark.parametrize("sizes", [[5, 1], [7]], ids=["decode_one_by_one", "chunks_crossing_capacity"])
def test_cache_growth_keeps_results(model, sizes):
    tokens = (TOKENS * 2)[:45]
    np.testing.assert_allclose(
        chunked_logits(model, tokens, sizes, capacity=8), full_logits(model, tokens), rtol=0, atol=1e-4
    )


def test_cache_grows_past_initial_capacity(model):
    cache = model.new_cache(8)
    assert cache.capacity == 8
    model.forward([Segment(cache, TOKENS[:9], 0)])
    assert cache.capacity >= 9


def test_context_length_is_enforced(toy_model_file):
    model = LlamaModel.load(toy_model_file(context_length=16))
    cache = model.new_cache(1000)
    assert cache.capacity == 16  # clamped to the context
    model.forward([Segment(cache, TOKENS[:16], 0)])  # exactly the context: fine
    with pytest.raises(ParameterError, match="17.*16"):
        model.forward([Segment(cache, [5], 16)])
    with pytest.raises(ParameterError, match="17.*16"):
        model.forward([Segment(model.new_cache(4), TOKENS[:17], 0)])
    # The failed calls left the cache usable.
    model.forward([Segment(cache, [5], 15)])


def test_context_limit_of_default_toy(model):
    ctx = model.config.context_length
    with pytest.raises(ParameterError):
        model.forward([Segment(model.new_cache(), [1, 2, 3], ctx - 2)])


def test_an_unsupported_rope_scaling_is_one_error_naming_it(toy_model_file):
    path = toy_model_file(seed=17, rope_linear=4.0, rope_scaling_type="yarn")
    with pytest.raises(ModelFileError, match="RoPE scaling 'yarn'"):
        LlamaModel.load(path)


def test_a_sliding_window_caps_the_context(toy_model_file):
    """Within its window, sliding-window attention is full attention: the context is
    the window, and a prompt beyond it is refused as too long."""
    model = LlamaModel.load(toy_model_file(seed=18, context_length=512, sliding_window=128))
    assert model.config.context_length == 128
    with pytest.raises(ParameterError, match="context is 128"):
        model.config.check_prompt(list(range(128)))
    assert LlamaModel.load(toy_model_file(seed=18, sliding_window=4096)).config.context_length == 512


LLAMA_CPP_CASES = ["gemma_f32", "gemma2_window", "gemma3_f32", "gemma3_window", "qwen2_f32", "qwen3_f32_wide_heads"]


@pytest.mark.parametrize("case", [*LLAMA_CPP_CASES, "f32_gqa_tied"])
def test_llama_cpp_computes_the_same_logits_on_the_same_file(toy_model_file, case):
    """An independent implementation of each architecture, where llama-cpp-python
    (the compare extra) is installed: the same float32 file, the same token ids.
    What it gives is also the record that the next test holds specq to in CI."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the compare extra) is not installed")
    path = toy_model_file(**REFERENCE_CASES[case])
    model = LlamaModel.load(path)
    ours = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0].logits
    # float32 keys and values (llama.cpp's default is float16): a float32 reference.
    f32 = 0  # GGML_TYPE_F32
    llama = llama_cpp.Llama(
        model_path=path, n_ctx=64, logits_all=True, n_threads=2, verbose=False, type_k=f32, type_v=f32
    )
    llama.eval(TOKENS)
    theirs = np.array(llama.scores[: len(TOKENS)], dtype=np.float32)
    assert np.abs(ours - theirs).max() <= 1e-3 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    if case in LLAMA_CPP_CASES:
        rows = [[round(float(v), 4) for v in theirs[r]] for r in ROWS]
        llama_cpp_record.check_or_record("logits", case, {"argmax": theirs.argmax(-1).tolist(), "rows": rows})


@pytest.mark.parametrize("case", LLAMA_CPP_CASES)
def test_the_logits_llama_cpp_gave_on_the_same_file(toy_model_file, case):
    """llama.cpp's outputs recorded on these toy files (tests/data/llama_cpp.json):
    every position's argmax, and three rows of logits within 1e-3 of the largest.
    This holds each architecture's reading (which layers are local, RoPE bases, soft
    caps, norms) to an implementation other than test_model's own reference."""
    recorded = llama_cpp_record.load()["logits"][case]
    model = LlamaModel.load(toy_model_file(**REFERENCE_CASES[case]))
    ours = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0].logits
    assert ours.argmax(-1).tolist() == recorded["argmax"]
    rows = np.array(recorded["rows"], dtype=np.float32)
    assert np.abs(ours[list(ROWS)] - rows).max() <= 1e-3 * np.abs(rows).max()


def test_a_sliding_window_holds_in_a_prompt_long_enough_for_blas(toy_model_file):
    """A prompt of matmul.BULK_ROWS rows or more attends through BLAS, which masks the
    cache before each row's window as the few-row kernel does."""
    path = toy_model_file(**REFERENCE_CASES["gemma3_window"])
    model = LlamaModel.load(path)
    tokens = (TOKENS * 3)[:60]
    assert len(tokens) >= BULK_ROWS and model.config.window == 8 and model.config.context_length > 60
    want_logits, _ = reference_forward(path, tokens)
    got = model.forward([Segment(model.new_cache(), tokens, 0)])[0].logits
    np.testing.assert_allclose(got, want_logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("case", ["f32_mqa_untied_3_layers", "qwen2_f32", "qwen3_f32_wide_heads", "gemma3_f32"])
def test_the_parameter_count_is_every_value_the_file_holds(toy_model_file, case):
    """Counted from the loaded weights (biases, q/k norms and Gemma's post norms
    included), it equals the elements of every tensor in the file."""
    from specq.specdec.gguf_file import GGUFFile

    path = toy_model_file(**REFERENCE_CASES[case])
    f = GGUFFile(path)
    in_file = sum(int(np.prod(f.tensor_info(name).shape)) for name in f._tensors)
    assert LlamaModel.load(path).n_parameters == in_file
