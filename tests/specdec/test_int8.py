"""The int8 products (int8.py): gguf's values, the exact integer arithmetic against a
numpy reference, bitwise row invariance, the same bits on AVX2 and on VNNI, and the
int8 model's compiled block loop against its Python loop."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from block_helpers import quantized_activations as _activations
from block_helpers import quantized_matrix as _matrix
from block_helpers import random_tensor
from model_helpers import TOY_TOKENS as TOKENS
from model_helpers import assert_rounds_and_chains_equal_rows_alone, assert_stack_equals_python_loop

from specq.specdec import gguf_blocks, int8, int8_codegen
from specq.specdec.model import KVCache, LlamaModel, Segment
from specq.specdec.qkernels import QuantizedMatrix

pytestmark = pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 kernels need AVX2")


SHAPES = [("Q4_1", 96, 64), ("Q4_1", 100, 96), ("Q8_0", 40, 64), ("Q8_0", 13, 128), ("Q4_1", 960, 576)]


@pytest.mark.parametrize("type_name,n_out,n_in", SHAPES)
def test_the_layout_keeps_gguf_values(type_name, n_out, n_in):
    qm, values = _matrix(type_name, n_out, n_in)
    w = int8.Int8Matrix.from_quantized(qm)
    assert w.dequantize().view(np.uint32).tolist() == values.view(np.uint32).tolist()
    ids = [n_out - 1, 0, 3, 3]
    np.testing.assert_array_equal(w.rows(ids), values[ids])


@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
@pytest.mark.parametrize("type_name,n_out,n_in", SHAPES)
def test_products_equal_the_integer_reference_bit_for_bit(type_name, n_out, n_in, split):
    qm, values = _matrix(type_name, n_out, n_in)
    w = int8.Int8Matrix.from_quantized(qm, split=split)
    x = _activations(11, n_in)
    got = int8.int8_matmul_t(x, w)
    assert got.shape == (11, n_out)
    np.testing.assert_array_equal(got.view(np.uint32), int8.int8_matmul_t_reference(x, w).view(np.uint32))
    # And near the float product of the same weights: the rounding of x to 8 bits.
    exact = x.astype(np.float64) @ values.T.astype(np.float64)
    bound = 4e-4 if split else 3e-2  # 15-bit activations: about 128 times closer
    assert np.abs(got - exact).max() <= bound * np.abs(exact).max()
    assert np.sqrt(((got - exact) ** 2).mean() / (exact**2).mean()) <= bound / 2


@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
@pytest.mark.parametrize("type_name,n_out,n_in", [("Q4_1", 200, 96), ("Q8_0", 96, 64)])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(type_name, n_out, n_in, split):
    w = int8.Int8Matrix.from_quantized(_matrix(type_name, n_out, n_in)[0], split=split)
    x = _activations(32, n_in, seed=5)
    together = int8.int8_matmul_t(x, w).view(np.uint32)
    for group in (1, 2, 3, 4, 5, 7):
        parts = [int8.int8_matmul_t(x[i : i + group], w) for i in range(0, 32, group)]
        np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), together)


@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
def test_nibble_sums_at_their_bounds_stay_exact(split):
    """Without VNNI a block's nibble products are added as int16 (vec.nibble_dot4): at
    weights of 15 against activations at +-127 (or their split halves at their
    extremes), every lane holds its largest sum, 16 x 15 x 127 = 30,480, where one
    more pair would wrap. The reference's int64 sums say whether any did."""
    n_out, n_in = 24, 128
    ints = np.full((n_out, n_in // 32, 32), 15, np.uint8)
    ints[1::2, 1] = 0  # some blocks of zeros among the full ones
    rng = np.random.default_rng(4)
    d = rng.uniform(0.01, 0.02, (n_out, n_in // 32)).astype(np.float32)
    m = rng.uniform(-0.1, 0.1, (n_out, n_in // 32)).astype(np.float32)
    w = int8.Int8Matrix.from_blocks("Q4_1", (n_out, n_in), ints, d, m, split=split)
    x = np.ones((6, n_in), np.float32)
    x[1] = -1.0  # every q at -L
    x[2, ::2] = -1.0  # alternating signs
    x[3] = np.linspace(-1.0, 1.0, n_in, dtype=np.float32)  # every split low half, from -64 to 63
    x[4, :64] = 3.0  # a block's largest beside smaller ones
    x[5] = rng.standard_normal(n_in).astype(np.float32)
    got = int8.int8_matmul_t(x, w)
    np.testing.assert_array_equal(got.view(np.uint32), int8.int8_matmul_t_reference(x, w).view(np.uint32))
    assert got[0, 0] > 0 > got[1, 0]


@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
@pytest.mark.parametrize("lanes", sorted({8, int8.LANES}))
@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0", "Q5_1", "Q6_K", "Q4_K"])
def test_scales_held_as_float16_give_the_bits_of_float32_ones(type_name, lanes, split):
    """The files' own scales are float16 and are held so (a third of a Q4_1
    matrix's bytes saved); a K-quant's products of two scales are not and stay
    float32. Either way a product has the bits it has with every scale as float32."""
    if type_name in ("Q4_1", "Q8_0"):
        w = int8.Int8Matrix.from_quantized(_matrix(type_name, 48, 256)[0], lanes, split)
    else:
        bm = gguf_blocks.unpack(type_name, random_tensor(type_name, 48, 256), (48, 256))
        w = int8.Int8Matrix.from_blocks(bm.type_name, bm.shape, bm.ints, bm.d, bm.m, lanes, split)
    narrow = type_name in ("Q4_1", "Q8_0", "Q5_1")  # Q5_1's d and m are float16 too
    assert (w.d.dtype, w.m.dtype) == ((np.uint16,) * 2 if narrow else (np.float32,) * 2)
    wide = replace(w, d=int8.widened(w.d), m=int8.widened(w.m))
    assert wide.d.dtype == np.float32 and np.array_equal(wide.block_scales(), w.block_scales())
    if lanes != int8.LANES:
        return  # this CPU's kernels read only its own lanes' layout
    x = _activations(7, 256)
    np.testing.assert_array_equal(int8.int8_matmul_t(x, w).view(np.uint32), int8.int8_matmul_t(x, wide).view(np.uint32))
    np.testing.assert_array_equal(
        int8.int8_matmul_t(x, w).view(np.uint32), int8.int8_matmul_t_reference(x, wide).view(np.uint32)
    )


def test_selected_rows_give_the_bits_of_the_whole_product():
    w = int8.Int8Matrix.from_quantized(_matrix("Q8_0", 100, 64)[0])
    x = _activations(3, 64)
    ids = np.array([99, 5, 0, 17, 3])
    np.testing.assert_array_equal(int8.int8_matmul_t(x, w.select_rows(ids)), int8.int8_matmul_t(x, w)[:, ids])


@pytest.mark.parametrize("split", [False, True])
def test_the_vector_quantizer_equals_the_scalar_one(split):
    x = _activations(7, 256, seed=9)
    x[1, :32] = np.float32(0.5) * np.arange(32, dtype=np.float32) / 31 * 127  # values on rounding ties
    q, d, s = int8.quantize_reference(x, split)
    high, low = np.empty(x.size, np.int8), np.empty(x.size if split else 0, np.int8)
    got_d, got_s = np.empty(d.size, np.float32), np.empty(d.size, np.float32)
    int8.quantize_rows(x, high, low, got_d, got_s, split)
    whole = high.astype(np.int32) * 128 + low if split else high.astype(np.int32)
    np.testing.assert_array_equal(whole, q.reshape(-1))
    np.testing.assert_array_equal(got_d.view(np.uint32), d.reshape(-1).view(np.uint32))
    np.testing.assert_array_equal(got_s.view(np.uint32), s.reshape(-1).view(np.uint32))
    levels = int8.SPLIT_LEVELS if split else int8.LEVELS
    assert np.abs(q).max() == levels and q[0, 32:64].tolist() == [0] * 32
    if split:  # the halves fit the instructions: high in [-127, 127], low in [-64, 63]
        assert np.abs(high).max() == 127 and low.min() >= -64 and low.max() <= 63


def test_the_generated_kernels_are_what_the_generator_writes():
    with open(int8_codegen.TARGET) as f:
        assert f.read() == int8_codegen.generate(), "run: python -m specq.specdec.int8_codegen"


def test_every_micro_kernel_asks_ahead_for_each_weight_array_it_reads():
    """The products were 1.3x to 1.4x slower at 1 and 5 rows without asking for the
    weights ahead (int8_codegen.PREFETCH_GROUPS): a kernel family written without it
    would pass every bit test."""
    import re

    source = int8_codegen.generate()
    micro = re.findall(r"def (_\w+_\d_\d)\((.*?)\):.*?\n(.*?)(?=\n\n\n|\Z)", source, re.S)
    assert len(micro) > 40
    for name, args, body in micro:
        loads = "\n".join(line for line in body.splitlines() if "prefetch(" not in line)
        read = {a for a in ("wq", "wd", "wm", "ws") if f"({a}, " in loads}
        ahead = str(int8_codegen.PREFETCH_GROUPS)
        asked = set(re.findall(r"prefetch\((\w+), \(*w\d \+ " + ahead + r" \* nb \+ shift\)", body))
        assert read and read <= set(args.split(", ")), name
        assert asked == read, f"{name} reads {sorted(read)} but asks ahead for {sorted(asked)}"


def test_passes_over_a_group_share_asking_for_every_block_of_the_one_ahead():
    """With more rows than a micro-kernel's, the driver passes over the same groups
    several times (laps); each asks for a share of the group ahead's blocks. Run as
    Python, a kernel's asking lines must ask for every block exactly once over the
    laps, whatever their number: a block never asked for comes from memory when its
    group's turn comes."""
    import re

    source = int8_codegen.generate()
    assert "laps = (n + 2) // 3" in source and "r0 // 3, laps" in source  # the drivers pass them
    for name, body in re.findall(r"def (_\w+_\d_\d)\(.*?\):.*?\n(.*?)(?=\n\n\n|\Z)", source, re.S):
        lines = body.splitlines()
        at = next(i for i, line in enumerate(lines) if "visit = " in line)
        asking = "\n".join(line[8:] for line in lines[at : at + 3])  # visit, its test, the block's shift
        code = compile(asking + "\n    asked.append(b + shift)", name, "exec")
        for nb, laps in [(18, 1), (18, 2), (18, 3), (48, 11), (5, 7)]:
            asked = []
            for lap in range(laps):
                for b in range(nb):
                    exec(code, {"lap": lap, "laps": laps, "nb": nb, "b": b, "asked": asked})
            assert sorted(asked) == list(range(nb)), (name, nb, laps)


def test_asking_for_lines_past_an_array_changes_nothing_and_never_faults():
    from numba import njit

    @njit
    def ask(a, far):
        for i in range(0, far, 64):
            int8.vec.prefetch(a, i)
        return a.sum()

    a = np.arange(16, dtype=np.int64)
    assert ask(a, 1 << 26) == a.sum()  # up to 512 MB past its 128 bytes


# Bytes where vpmaddubsw's pairs would saturate (255 x 127 and 255 x -128, twice a
# lane), then random ones: every lane's sum differs, so lanes in the wrong order show.
_EXTREME_BYTES = (
    np.concatenate([np.full(8, 255), np.random.default_rng(5).integers(0, 256, 24)]).astype(np.uint8),
    np.concatenate([[127] * 4, [-128] * 4, np.random.default_rng(6).integers(-128, 128, 24)]).astype(np.int8),
    np.arange(-4, 4, dtype=np.int32) * 1000,
)


def _dot4_exact(u: np.ndarray, w: np.ndarray, acc: np.ndarray) -> np.ndarray:
    return (acc + (u.astype(np.int64) * w).reshape(8, 4).sum(axis=1)).astype(np.float32)


def test_the_widened_dot4_gives_vpdpbusd_s_integers():
    """vec._dot4_widened (dot4_wide without VNNI) compiled here, on any AVX2 CPU: the
    exact sums of four u8 x s8 products per lane, in lane order, where vpmaddubsw
    would saturate too."""
    from numba import njit
    from numba.extending import intrinsic

    @intrinsic
    def widened(typingctx, acc, unsigned, signed):
        return acc(acc, unsigned, signed), lambda context, builder, sig, args: int8.vec._dot4_widened(builder, *args)

    @njit
    def run(u, w, acc):
        out = np.empty(8, np.float32)
        v = widened(int8.vec.load_i32(acc, 0), int8.vec.load_bytes(u, 0), int8.vec.load_bytes(w, 0))
        int8.vec.store_f32(out, 0, int8.vec.to_float(v))
        return out

    want = _dot4_exact(*_EXTREME_BYTES)
    assert len(set(want.tolist())) == 8 and want[0] == 255 * 127 * 4 - 4000
    np.testing.assert_array_equal(run(*_EXTREME_BYTES), want)
    rng = np.random.default_rng(7)
    for _ in range(20):
        u, w = rng.integers(0, 256, 32).astype(np.uint8), rng.integers(-128, 128, 32).astype(np.int8)
        acc = rng.integers(-(2**20), 2**20, 8).astype(np.int32)
        np.testing.assert_array_equal(run(u, w, acc), _dot4_exact(u, w, acc))


_PRINT_PRODUCT = """
import os, sys, numpy as np
from specq.specdec import int8, vec
sys.path[:0] = [{tests!r}, os.path.dirname({tests!r})]
from test_int8 import _EXTREME_BYTES, _activations, _matrix
print("vnni" if vec.has_vnni() else "avx2", flush=True)
from numba import njit


@njit
def dot4_wide(u, w, acc):
    out = np.empty(8, np.float32)
    vec.store_f32(out, 0, vec.to_float(vec.dot4_wide(vec.load_i32(acc, 0), vec.load_bytes(u, 0), vec.load_bytes(w, 0))))
    return out


print(dot4_wide(*_EXTREME_BYTES).tobytes().hex())
for t, n_out, n_in in [("Q4_1", 96, 64), ("Q8_0", 40, 64)]:
    for split in (False, True):
        w = int8.Int8Matrix.from_quantized(_matrix(t, n_out, n_in)[0], split=split)
        print(int8.int8_matmul_t(_activations(5, n_in), w).view(np.uint32).tobytes().hex())
from specq.specdec import gguf_blocks
from block_helpers import quantized_activations as _activations
from block_helpers import quantized_matrix as _matrix
from block_helpers import random_tensor
for t in ("Q5_1", "Q6_K"):  # the Q8_M and Q8_H formats' kernels
    for split in (False, True):
        bm = gguf_blocks.unpack(t, random_tensor(t, 40, 256), (40, 256))
        w = int8.Int8Matrix.from_blocks(bm.type_name, bm.shape, bm.ints, bm.d, bm.m, split=split)
        print(int8.int8_matmul_t(_activations(5, 256), w).view(np.uint32).tobytes().hex())
from specq.specdec import half
rows = (np.random.default_rng(3).standard_normal((40, 96)) * 0.1).astype(np.float32)
bf16 = (rows.view(np.uint32) >> 16).astype(np.uint16)
for t, bits in (("F16", rows.astype(np.float16).view(np.uint16)), ("BF16", bf16)):
    w = half.HalfMatrix.from_rows(bits, t)  # 8 lanes here and 16 there: the same sums per output
    for n in (1, 6):
        print(half.half_matmul_t(_activations(n, 96), w).view(np.uint32).tobytes().hex())
from specq.specdec.model import LlamaModel, Segment
for precision in ("int8", "int16"):
    model = LlamaModel.load({model!r}, precision)
    one = model.forward([Segment(model.new_cache(), {tokens!r}, 0)])[0].logits
    caches = [model.new_cache() for _ in range(3)]
    for i, c in enumerate(caches):
        model.forward([Segment(c, {tokens!r}[i:i + 9], 0)])
    rows = model.forward([Segment(c, [5 + i], 9) for i, c in enumerate(caches)])
    print(np.concatenate([one] + [r.logits for r in rows]).view(np.uint32).tobytes().hex())
model = LlamaModel.load({model!r}, "int16")  # rows past 95 positions read frozen 8-bit keys
cache = model.new_cache(200)
assert cache.frozen
long = [(37 * i + 11) % 300 for i in range(200)]
logits = [model.forward([Segment(cache, long[:170], 0)])[0].logits]
logits += [model.forward([Segment(cache, [long[p]], p)])[0].logits for p in range(170, 200)]
print(np.concatenate(logits).view(np.uint32).tobytes().hex())
"""


@pytest.mark.slow
@pytest.mark.skipif(not int8.vec.has_vnni(), reason="this CPU has no VNNI to compare AVX2 with")
def test_avx2_and_vnni_compute_the_same_bits(tmp_path, toy_model_file):
    """A request resumed on a machine with the other instruction set continues
    exactly: the products compiled for a CPU without VNNI or AVX-512 (a fresh numba
    cache; F16/BF16 products too) give the bits this CPU's VNNI kernels give, and so do whole forwards at int8 and int16
    (the float16 KV cache's conversions included), alone and batched, and int16's
    rows that read frozen keys (block_ops._paired_sums without VNNI)."""
    features = int8.vec.cpu_features() - {f for f in int8.vec.cpu_features() if "512" in f or "vnni" in f}
    env = {
        **os.environ,
        "NUMBA_CPU_NAME": "znver3",
        "NUMBA_CACHE_DIR": str(tmp_path),
        "NUMBA_CPU_FEATURES": ",".join(f"+{f}" for f in sorted(features)),
    }
    code = _PRINT_PRODUCT.format(
        tests=os.path.dirname(os.path.abspath(__file__)),
        tokens=TOKENS,
        model=toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0"),
    )
    # Each build may compile every kernel it runs afresh: about 10 minutes beside other work.
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    assert other.returncode == 0, other.stderr[-2000:]
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    assert here.returncode == 0, here.stderr[-2000:]
    assert other.stdout.splitlines()[0] == "avx2" and here.stdout.splitlines()[0] == "vnni"
    assert here.stdout.splitlines()[1] == _dot4_exact(*_EXTREME_BYTES).tobytes().hex()
    assert other.stdout.splitlines()[1:] == here.stdout.splitlines()[1:]


@pytest.fixture(scope="module", params=["int8", "int16"])
def models(toy_model_file, request):
    f32 = LlamaModel.load(toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0"))
    return f32, f32.at_precision(request.param)


def test_the_int8_model_runs_every_product_through_the_int8_kernels(models):
    f32, model = models
    assert model.precision in ("int8", "int16") and model._stack is not None
    for lw in model.weights.layers:
        for k in ("w_qkv", "w_out", "w_gate_up", "w_down"):
            w = getattr(lw, k)
            assert isinstance(w, int8.Int8Matrix) and w.split == (model.precision == "int16")
    assert isinstance(model.weights.w_output, int8.Int8Matrix)
    assert isinstance(model.weights.token_embedding, QuantizedMatrix)  # lookups read the blocks
    assert model.n_parameters == f32.n_parameters
    want = f32.forward([Segment(f32.new_cache(), TOKENS, 0)])[0].logits
    # int16's products alone: with a float16 cache (its values' 8 bits add their own error, below).
    cache = KVCache(model.config, 256, np.float16) if model.precision == "int16" else model.new_cache()
    got = model.forward([Segment(cache, TOKENS, 0)])[0].logits
    assert not np.array_equal(got, want)
    bound = 1e-3 if model.precision == "int16" else 0.05
    assert np.abs(got - want).max() <= bound * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= (1.0 if model.precision == "int16" else 0.9)
    if model.precision == "int16":  # and with its own cache, float16 keys and 8-bit values
        got = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0].logits
        assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
        assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
def test_rows_quantized_by_both_threads_get_the_bits_they_get_alone(split):
    from numba import config

    assert config.NUMBA_NUM_THREADS >= 2, "the parallel quantizer needs two threads to be tested"
    x = _activations(int8.PARALLEL_ROWS + 9, 96, seed=8)
    for n in range(int8.PARALLEL_ROWS, len(x) + 1):
        together = int8.quantized(x[:n], split, 2)
        alone = [int8.quantized(x[r : r + 1], split, 2) for r in range(n)]
        for part, got in enumerate(together):
            want = np.concatenate([a[part] for a in alone])
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_rounds_and_chains_from_parallel_rows_up_equal_their_rows_alone(models):
    """From int8.PARALLEL_ROWS rows the stack norms, gates and quantizes in a parallel
    loop; a row's logits must stay those it gets alone (one thread, below it)."""
    model = models[1]
    n = int8.PARALLEL_ROWS + 1
    assert_rounds_and_chains_equal_rows_alone(model, [TOKENS[: 3 + i] for i in range(n)], TOKENS[: n + 3])


def test_the_compiled_block_loop_equals_the_python_loop_at_int8(models):
    assert_stack_equals_python_loop(models[1], TOKENS)


def test_a_model_without_avx2_refuses_int8_with_one_line(models, monkeypatch):
    from specq.errors import ParameterError
    from specq.specdec import precision, vec

    monkeypatch.setattr(vec, "has_avx2", lambda: False)  # what precision.integer_available reads
    with pytest.raises(ParameterError, match="AVX2"):
        models[0].at_precision("int8")
    assert precision.resolve("auto") == "f32" and precision.resolve("int16") == "int16"


def test_resolving_a_precision_compiles_no_kernel(tmp_path):
    """`specq submit --precision auto` names a precision; only workers decode. Resolving
    it must not import the kernels (about a minute on a fresh numba cache)."""
    code = (
        "import sys; from specq.specdec.precision import resolve; print(resolve('auto')); "
        "print(any(m.startswith('specq.specdec.int8') for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["int16", "False"]
