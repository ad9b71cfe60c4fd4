"""256- and 512-bit vector values and instructions for numba code (the integer
products, int8.py, and attention's register-blocked loops, block_ops.py).

numba vectorizes loops by itself, but not into the integer dot-product instructions
(vpmaddubsw, vpdpbusd) that make int8 products fast, and it keeps a loop's
accumulators in memory. Here a numba type whose data model is an LLVM vector
(<32 x i8>, <8 x i32>, <8 x float>) lets compiled code hold vector values as plain
locals, which LLVM keeps in registers, and each function below emits one or two
instructions. LLVM still allocates registers and schedules. Most exist for both
widths (`_width`): `load_bytes` is 256 bits, `load_bytes_w` 512.

The CPU decides one thing here at compile time (block_ops._PAIRED and _WIDE are
others): how
four u8 x s8 products are added into an int32 lane (`dot4`, `dot4_wide`). With
AVX-VNNI (or AVX-512 VNNI) it is one vpdpbusd; on plain AVX2, vpmaddubsw then
vpmaddwd (dot4_wide: the bytes widened first, for units up to 255). Both are exact for the values int8.py feeds
them, so every CPU computes the same integers and, with the same float epilogue,
the same bits: a request resumed on another machine continues exactly.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic, models, register_model


@functools.cache
def cpu_features() -> frozenset[str]:
    """The features numba compiles for: NUMBA_CPU_FEATURES when set (a build for
    another CPU), else the host's. Read once a process: asking LLVM took 0.35 ms, and
    every product of a prefill asked (through int8.require), 17% of a 200-token
    prefill's time, and the output head once a decode step."""
    if config.CPU_FEATURES:
        return frozenset(f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+"))
    return frozenset(name for name, on in llvm_binding.get_host_cpu_features().items() if on)


def has_avx2() -> bool:
    """AVX2 with FMA, and F16C (the float16 KV cache's conversions), which every CPU
    with both has."""
    return {"avx2", "fma", "f16c"} <= cpu_features()


def has_vnni() -> bool:
    features = cpu_features()
    return "avxvnni" in features or {"avx512vnni", "avx512vl"} <= features


def has_avx512_vnni() -> bool:
    """512-bit vectors with their byte and integer dot-product instructions (what the
    512-bit kernels and attention's wide loops use)."""
    return {"avx512f", "avx512bw", "avx512vl", "avx512vnni"} <= cpu_features()


class Vec(types.Type):
    def __init__(self, kind: str, n: int) -> None:
        self.kind, self.n = kind, n
        super().__init__(name=f"vec_{kind}x{n}")


_ELEMENT = {
    "i8": ir.IntType(8),
    "i16": ir.IntType(16),
    "i32": ir.IntType(32),
    "f32": ir.FloatType(),
    "f64": ir.DoubleType(),
}


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:
        super().__init__(dmm, fe_type, ir.VectorType(_ELEMENT[fe_type.kind], fe_type.n))


I8, I32, F32 = Vec("i8", 32), Vec("i32", 8), Vec("f32", 8)
_V8, _V16, _V32, _VF = (ir.VectorType(_ELEMENT[k], n) for k, n in (("i8", 32), ("i16", 16), ("i32", 8), ("f32", 8)))
_I32 = ir.IntType(32)


def _pointer(context, builder, array_type, array, index, vector_type):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), vector_type.as_pointer())


def _splat(builder, scalar, vector_type):
    v = builder.insert_element(ir.Constant(vector_type, ir.Undefined), scalar, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(v, ir.Constant(vector_type, ir.Undefined), mask)


def _call(builder, name, result_type, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(result_type, [a.type for a in args]), name)
    return builder.call(fn, args)


def _dot4(builder, acc, unsigned, signed):
    """acc + the sum of 4 (u8 x s8) products per int32 lane. Exact whenever a pair of
    products fits in int16 (vpmaddubsw saturates there): true for 4-bit weights, and
    for int8 weights taken as |w| against sign(w) x (int8.py). 512-bit vectors are
    used only with VNNI (int8.py)."""
    lanes = acc.type.count
    if has_vnni():
        return _call(builder, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", acc.type, [acc, unsigned, signed])
    assert lanes == 8, "512-bit vectors without VNNI"
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16, [unsigned, signed])
    quads = _call(builder, "llvm.x86.avx2.pmadd.wd", _V32, [pairs, ir.Constant(_V16, [1] * 16)])
    return builder.add(acc, quads)


def _dot4_widened(builder, acc, unsigned, signed):
    """acc + the sum of 4 (u8 x s8) products per int32 lane for any bytes, on plain
    AVX2 (8 lanes): each half's bytes widened to int16, vpmaddwd's exact pair sums in
    int32, then each pair added to its neighbour. vpdpbusd's integers, so the same
    bits as with VNNI."""
    assert acc.type.count == 8, "the widened sums are 256-bit"
    pairs = []
    for half in range(2):
        mask = ir.Constant(ir.VectorType(_I32, 16), list(range(16 * half, 16 * half + 16)))
        u = builder.zext(builder.shuffle_vector(unsigned, unsigned, mask), _V16)
        s = builder.sext(builder.shuffle_vector(signed, signed, mask), _V16)
        pairs.append(_call(builder, "llvm.x86.avx2.pmadd.wd", _V32, [u, s]))
    even = builder.shuffle_vector(pairs[0], pairs[1], ir.Constant(ir.VectorType(_I32, 8), list(range(0, 16, 2))))
    odd = builder.shuffle_vector(pairs[0], pairs[1], ir.Constant(ir.VectorType(_I32, 8), list(range(1, 16, 2))))
    return builder.add(acc, builder.add(even, odd))


def _width(lanes: int) -> dict:
    """The intrinsics on vectors of `lanes` int32 or float32 (8: 256 bits, AVX2; 16:
    512 bits, AVX-512) by name: vec.load_bytes etc. are the 256-bit ones,
    vec.load_bytes_w etc. the 512-bit ones. Each emits one or two instructions."""
    bytes_t, words_t = ir.VectorType(ir.IntType(8), 4 * lanes), ir.VectorType(ir.IntType(16), 2 * lanes)
    ints_t, floats_t = ir.VectorType(_I32, lanes), ir.VectorType(ir.FloatType(), lanes)
    B, I, F = Vec("i8", 4 * lanes), Vec("i32", lanes), Vec("f32", lanes)

    @intrinsic
    def load_bytes(typingctx, array, i):  # pragma: no cover - compiled
        """The 4 x lanes bytes at array[i:] (a 1-D int8 or uint8 array)."""

        def codegen(context, builder, sig, args):
            return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], bytes_t), align=1)

        return B(array, i), codegen

    @intrinsic
    def broadcast4(typingctx, array, i):  # pragma: no cover - compiled
        """The 4 bytes at array[i:] in each int32 lane (vpbroadcastd)."""

        def codegen(context, builder, sig, args):
            word = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], _I32), align=1)
            return builder.bitcast(_splat(builder, word, ints_t), bytes_t)

        return B(array, i), codegen

    @intrinsic
    def low_nibbles(typingctx, v):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return builder.and_(args[0], ir.Constant(bytes_t, [0x0F] * (4 * lanes)))

        return B(B), codegen

    @intrinsic
    def high_nibbles(typingctx, v):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            shifted = builder.lshr(builder.bitcast(args[0], words_t), ir.Constant(words_t, [4] * (2 * lanes)))
            return builder.and_(builder.bitcast(shifted, bytes_t), ir.Constant(bytes_t, [0x0F] * (4 * lanes)))

        return B(B), codegen

    @intrinsic
    def dot4(typingctx, acc, unsigned, signed):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return _dot4(builder, *args)

        return I(I, B, B), codegen

    # A block's sum against nibble weights (Q4_1's 0..15). Without VNNI, dot4 is three
    # instructions (vpmaddubsw, vpmaddwd by ones, an add). Against nibbles a vpmaddubsw
    # pair is at most 2 x 15 x 127 = 3,810, so a whole block (8 pairs to an int16
    # lane) stays below 2**15: the pairs are added as int16 and widened once a block,
    # the same integers for a third fewer instructions (the int16 precision's Q4_1
    # products 1.15x to 1.2x faster on an AMD EPYC without VNNI). With VNNI the sum is
    # vpdpbusd's int32, as dot4. Exact only for weights below 16 and activations
    # within +-127.
    nibble_vnni = has_vnni() or lanes == 16  # 512-bit kernels run only with VNNI (int8.py)
    S = I if nibble_vnni else Vec("i16", 2 * lanes)

    @intrinsic
    def nibble_zeros(typingctx):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return ir.Constant(ints_t if nibble_vnni else words_t, [0] * (lanes if nibble_vnni else 2 * lanes))

        return S(), codegen

    @intrinsic
    def nibble_dot4(typingctx, acc, nibbles, signed):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            if nibble_vnni:
                return _dot4(builder, *args)
            pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16, [args[1], args[2]])
            return builder.add(args[0], pairs)

        return S(S, B, B), codegen

    @intrinsic
    def nibble_total(typingctx, acc):  # pragma: no cover - compiled
        """The block's int32 sums, one per lane."""

        def codegen(context, builder, sig, args):
            if nibble_vnni:
                return args[0]
            return _call(builder, "llvm.x86.avx2.pmadd.wd", _V32, [args[0], ir.Constant(_V16, [1] * 16)])

        return I(S), codegen

    @intrinsic
    def nibble_split_total(typingctx, high, low):  # pragma: no cover - compiled
        """128 x high's sums + low's (combine7 of the two totals), with the scaling
        folded into the widening where there is one: exact, |128 x 30,480 x 2| < 2**31."""

        def codegen(context, builder, sig, args):
            if nibble_vnni:
                return builder.add(builder.shl(args[0], ir.Constant(ints_t, [7] * lanes)), args[1])
            widen = "llvm.x86.avx2.pmadd.wd"
            scaled = _call(builder, widen, _V32, [args[0], ir.Constant(_V16, [128] * 16)])
            return builder.add(scaled, _call(builder, widen, _V32, [args[1], ir.Constant(_V16, [1] * 16)]))

        return I(S, S), codegen

    @intrinsic
    def flip_sign_bits(typingctx, v):  # pragma: no cover - compiled
        """x + 128 as unsigned bytes, for signed bytes x (an xor of the top bit)."""

        def codegen(context, builder, sig, args):
            return builder.xor(args[0], ir.Constant(bytes_t, [0x80] * (4 * lanes)))

        return B(B), codegen

    @intrinsic
    def load_i32(typingctx, array, i):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], ints_t), align=4)

        return I(array, i), codegen

    @intrinsic
    def sub_i32(typingctx, a, b):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return builder.sub(args[0], args[1])

        return I(I, I), codegen

    @intrinsic
    def combine7(typingctx, high, low):  # pragma: no cover - compiled
        """high * 128 + low per lane: the two halves of a split activation's sum."""

        def codegen(context, builder, sig, args):
            return builder.add(builder.shl(args[0], ir.Constant(ints_t, [7] * lanes)), args[1])

        return I(I, I), codegen

    @intrinsic
    def zeros_i32(typingctx):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return ir.Constant(ints_t, [0] * lanes)

        return I(), codegen

    @intrinsic
    def zeros_f32(typingctx):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return ir.Constant(floats_t, [0.0] * lanes)

        return F(), codegen

    @intrinsic
    def to_float(typingctx, v):  # pragma: no cover - compiled
        """int32 -> float32 lanes; exact for block sums (below 2**24)."""

        def codegen(context, builder, sig, args):
            return builder.sitofp(args[0], floats_t)

        return F(I), codegen

    @intrinsic
    def load_f32(typingctx, array, i):  # pragma: no cover - compiled
        """float32 lanes from array[i:]: a float32 array, a float16 one held as its
        uint16 bits (a KV cache at the integer precisions; vcvtph2ps, exact), or an
        int8 one (an 8-bit KV cache's quantized values; exact)."""

        def codegen(context, builder, sig, args):
            if sig.args[0].dtype == types.int8:
                narrow = ir.VectorType(ir.IntType(8), lanes)
                values = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], narrow), align=1)
                return builder.sitofp(values, floats_t)
            if sig.args[0].dtype == types.uint16:
                halves_t = ir.VectorType(ir.IntType(16), lanes)
                bits = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], halves_t), align=2)
                return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), lanes)), floats_t)
            return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], floats_t), align=4)

        return F(array, i), codegen

    @intrinsic
    def load_bf16(typingctx, array, i):  # pragma: no cover - compiled
        """float32 lanes from the bfloat16 bits at array[i:] (uint16): each is the top
        half of a float32, so the conversion is a shift, and exact."""

        def codegen(context, builder, sig, args):
            halves_t = ir.VectorType(ir.IntType(16), lanes)
            bits = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], halves_t), align=2)
            return builder.bitcast(builder.shl(builder.zext(bits, ints_t), ir.Constant(ints_t, [16] * lanes)), floats_t)

        return F(array, i), codegen

    @intrinsic
    def store_f32(typingctx, array, i, v):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], floats_t), align=4)
            return context.get_dummy_value()

        return types.void(array, i, F), codegen

    @intrinsic
    def broadcast_f32(typingctx, array, i):  # pragma: no cover - compiled
        """array[i] in every lane (vbroadcastss; no negative-index code, which numba's
        array[i] adds and which costs registers in a micro-kernel)."""

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return _splat(builder, builder.load(builder.gep(data, [args[1]])), floats_t)

        return F(array, i), codegen

    @intrinsic
    def mul(typingctx, a, b):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return builder.fmul(args[0], args[1])  # no fast-math flags: one rounding, always

        return F(F, F), codegen

    @intrinsic
    def fma(typingctx, a, b, c):  # pragma: no cover - compiled
        """a * b + c with one rounding (llvm.fma: never split, never reordered)."""

        def codegen(context, builder, sig, args):
            return _call(builder, f"llvm.fma.v{lanes}f32", floats_t, list(args))

        return F(F, F, F), codegen

    return {name: value for name, value in locals().items() if name in _PER_WIDTH}


_PER_WIDTH = (
    "load_bytes",
    "broadcast4",
    "low_nibbles",
    "high_nibbles",
    "dot4",
    "flip_sign_bits",
    "nibble_zeros",
    "nibble_dot4",
    "nibble_total",
    "nibble_split_total",
    "load_i32",
    "sub_i32",
    "combine7",
    "zeros_i32",
    "zeros_f32",
    "to_float",
    "load_f32",
    "load_bf16",
    "store_f32",
    "broadcast_f32",
    "mul",
    "fma",
)


_NARROW, _WIDE = _width(8), _width(16)
(
    load_bytes,
    broadcast4,
    low_nibbles,
    high_nibbles,
    dot4,
    flip_sign_bits,
    nibble_zeros,
    nibble_dot4,
    nibble_total,
    nibble_split_total,
    load_i32,
    sub_i32,
    combine7,
    zeros_i32,
    zeros_f32,
    to_float,
    load_f32,
    load_bf16,
    store_f32,
    broadcast_f32,
    mul,
    fma,
) = (_NARROW[k] for k in _PER_WIDTH)
(
    load_bytes_w,
    broadcast4_w,
    low_nibbles_w,
    high_nibbles_w,
    dot4_w,
    flip_sign_bits_w,
    nibble_zeros_w,
    nibble_dot4_w,
    nibble_total_w,
    nibble_split_total_w,
    load_i32_w,
    sub_i32_w,
    combine7_w,
    zeros_i32_w,
    zeros_f32_w,
    to_float_w,
    load_f32_w,
    load_bf16_w,
    store_f32_w,
    broadcast_f32_w,
    mul_w,
    fma_w,
) = (_WIDE[k] for k in _PER_WIDTH)

_BYTES, _INTS = Vec("i8", 32), Vec("i32", 8)


@intrinsic
def dot4_wide(typingctx, acc, unsigned, signed):  # pragma: no cover - compiled
    """dot4, exact for any bytes: a frozen key's units reach 255, where a pair of
    vpmaddubsw's products can pass int16. vpdpbusd with VNNI, else
    _dot4_widened: the same integers on every CPU (256 bits)."""

    def codegen(context, builder, sig, args):
        if has_vnni():
            return _dot4(builder, *args)
        return _dot4_widened(builder, *args)

    return _INTS(_INTS, _BYTES, _BYTES), codegen


@intrinsic
def magnitudes(typingctx, w):  # pragma: no cover - compiled
    """|w| per byte (vpabsb); with `signs_of` below, a signed product through dot4:
    |w| x (x with w's sign) = w x, llama.cpp's way onto the unsigned-by-signed
    instruction. Exact for w, x in [-127, 127]."""

    def codegen(context, builder, sig, args):
        negative = builder.icmp_signed("<", args[0], ir.Constant(_V8, [0] * 32))
        return builder.select(negative, builder.neg(args[0]), args[0])

    return I8(I8), codegen


@intrinsic
def signs_of(typingctx, x, w):  # pragma: no cover - compiled
    """x with w's sign per byte, 0 where w is 0 (vpsignb)."""

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx2.psign.b", _V8, [args[0], args[1]])

    return I8(I8, I8), codegen


# 15-bit activations against 8-bit weights without VNNI (int8.py's Q8_0, Q8_M and
# Q8_H at int16):
# vpmaddwd multiplies int16 pairs into int32 exactly, 16 products an instruction with
# no sign trick and no second widening, where the split halves take two vpmaddubsw,
# two vpsignb and two vpmaddwd for 32. Each 32-bit lane holds two inputs of one output.
I16 = Vec("i16", 16)


@intrinsic
def widen_bytes(typingctx, array, i):  # pragma: no cover - compiled
    """The 16 int8 at array[i:] as int16 (vpmovsxbw): in Q8_0's layout 4 outputs x 4
    inputs, so each 32-bit lane holds 2 inputs of one output."""

    def codegen(context, builder, sig, args):
        narrow = ir.VectorType(ir.IntType(8), 16)
        packed = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], narrow), align=1)
        return builder.sext(packed, _V16)

    return I16(array, i), codegen


@intrinsic
def widen_units(typingctx, array, i):  # pragma: no cover - compiled
    """The 16 uint8 at array[i:] as int16 (vpmovzxbw): 4 positions' units of 4
    channels in a frozen block, so each 32-bit lane holds 2 channels of a position."""

    def codegen(context, builder, sig, args):
        narrow = ir.VectorType(ir.IntType(8), 16)
        packed = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], narrow), align=1)
        return builder.zext(packed, _V16)

    return I16(array, i), codegen


@intrinsic
def store_i16(typingctx, array, i, v):  # pragma: no cover - compiled
    """The 8 int32 lanes of v, truncated to int16, at array[i:] (an int16 array)."""

    def codegen(context, builder, sig, args):
        narrow = ir.VectorType(ir.IntType(16), 8)
        builder.store(
            builder.trunc(args[2], narrow), _pointer(context, builder, sig.args[0], args[0], args[1], narrow), align=2
        )
        return context.get_dummy_value()

    return types.void(array, i, I32), codegen


@intrinsic
def broadcast_pairs(typingctx, array, i):  # pragma: no cover - compiled
    """The 4 int16 at array[i:] in every 64-bit lane (vpbroadcastq): inputs i, i+1
    against a lane's first two weights, i+2, i+3 against the next lane's."""

    def codegen(context, builder, sig, args):
        word = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], ir.IntType(64)), align=2)
        return builder.bitcast(_splat(builder, word, ir.VectorType(ir.IntType(64), 4)), _V16)

    return I16(array, i), codegen


@intrinsic
def madd16(typingctx, acc, a, b):  # pragma: no cover - compiled
    """acc + the sum of each 32-bit lane's two int16 products (vpmaddwd): exact while
    no lane holds two products of -32768 x -32768."""

    def codegen(context, builder, sig, args):
        return builder.add(args[0], _call(builder, "llvm.x86.avx2.pmadd.wd", _V32, [args[1], args[2]]))

    return I32(I32, I16, I16), codegen


@intrinsic
def pair_totals(typingctx, first, second):  # pragma: no cover - compiled
    """Outputs 0..7's sums from two accumulators that hold each output's sum in two
    lanes (outputs 0-3 in `first`, 4-7 in `second`, as widen_bytes lays them out):
    vphaddd, then the halves' middle quarters swapped back into output order."""

    def codegen(context, builder, sig, args):
        pairs = _call(builder, "llvm.x86.avx2.phadd.d", _V32, [args[0], args[1]])  # 0 1 4 5 | 2 3 6 7
        order = ir.Constant(ir.VectorType(_I32, 8), [0, 1, 4, 5, 2, 3, 6, 7])
        return builder.shuffle_vector(pairs, ir.Constant(_V32, ir.Undefined), order)

    return I32(I32, I32), codegen


@intrinsic
def splat_f32(typingctx, x):  # pragma: no cover - compiled
    def codegen(context, builder, sig, args):
        return _splat(builder, args[0], _VF)

    return F32(types.float32), codegen


@intrinsic
def splat_f32_w(typingctx, x):  # pragma: no cover - compiled
    """x in each of 16 float32 lanes (512 bits)."""

    def codegen(context, builder, sig, args):
        return _splat(builder, args[0], ir.VectorType(ir.FloatType(), 16))

    return Vec("f32", 16)(types.float32), codegen


@intrinsic
def fma1(typingctx, a, b, c):  # pragma: no cover - compiled
    """a * b + c for float32 scalars, one rounding (the vector fma's lane, alone)."""

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.f32", ir.FloatType(), list(args))

    return types.float32(types.float32, types.float32, types.float32), codegen


F64 = Vec("f64", 4)
_VD = ir.VectorType(ir.DoubleType(), 4)


@intrinsic
def max_f32(typingctx, a, b):  # pragma: no cover - compiled
    """The larger of a and b lane by lane (vmaxps). A maximum is the same whatever
    order its values come in, so it may be taken lane-wise."""

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx.max.ps.256", _VF, list(args))

    return F32(F32, F32), codegen


@intrinsic
def zeros_f64(typingctx):  # pragma: no cover - compiled
    def codegen(context, builder, sig, args):
        return ir.Constant(_VD, [0.0] * 4)

    return F64(), codegen


def _add_widened(first: int):
    @intrinsic
    def add(typingctx, acc, v):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            half = builder.shuffle_vector(
                args[1],
                ir.Constant(_VF, ir.Undefined),
                ir.Constant(ir.VectorType(_I32, 4), list(range(first, first + 4))),
            )
            return builder.fadd(args[0], builder.fpext(half, _VD))

        return F64(F64, F32), codegen

    return add


# acc + the low (add_low) or high (add_high) four float32 lanes of v, widened to
# float64 (exact), lane by lane: the low sums' lane j holds position lanes j, the high
# sums' lanes j + 4, so eight positions cost two float64 vector adds.
add_low, add_high = _add_widened(0), _add_widened(4)


@intrinsic
def total_f64(typingctx, low, high):  # pragma: no cover - compiled
    """((l0 + h0) + (l1 + h1)) + ((l2 + h2) + (l3 + h3)): the sums add_low and add_high keep,
    in one fixed order (test_block_ops's reference spells it out)."""

    def codegen(context, builder, sig, args):
        pairs = builder.fadd(args[0], args[1])
        lane = [builder.extract_element(pairs, ir.Constant(_I32, j)) for j in range(4)]
        return builder.fadd(builder.fadd(lane[0], lane[1]), builder.fadd(lane[2], lane[3]))

    return types.float64(F64, F64), codegen


@intrinsic
def as_f32(typingctx, x):  # pragma: no cover - compiled
    """A cache element as float32: itself, the float16 that uint16 bits hold, or an
    8-bit cache's quantized value (all exact)."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, sig, args: args[0]
    if x == types.int8:
        return types.float32(x), lambda context, builder, sig, args: builder.sitofp(args[0], ir.FloatType())
    if x != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def as_element(typingctx, array, x):  # pragma: no cover - compiled
    """The float32 x as an element of `array`: itself for a float32 array; for a
    float16 array held as uint16, its bits rounded to nearest even (vcvtps2ph), as
    numpy's float32 -> float16 cast rounds, so numba and numpy write the same bits.
    For an int8 array (an 8-bit cache), x already divided by its scale is rounded to
    the nearest integer, ties to even (np.rint's rule); |x| <= 127.5 there."""
    if array.dtype == types.float32:
        return types.float32(array, x), lambda context, builder, sig, args: args[1]
    if array.dtype == types.int8:

        def to_int8(context, builder, sig, args):
            nearest = _call(builder, "llvm.rint.f32", ir.FloatType(), [args[1]])
            return builder.fptosi(nearest, ir.IntType(8))

        return types.int8(array, x), to_int8
    if array.dtype != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[1], ir.HalfType()), ir.IntType(16))

    return types.uint16(array, x), codegen


@intrinsic
def scaled(typingctx, array):  # pragma: no cover - compiled
    """Whether `array` is an 8-bit KV cache (int8 values with float32 scales beside
    them, model.KVCache): a constant, so that LLVM drops the branch a float cache
    never takes."""
    constant = array.dtype == types.int8
    return types.boolean(array), lambda context, builder, sig, args: ir.Constant(ir.IntType(1), constant)


@intrinsic
def is_half(typingctx, array):  # pragma: no cover - compiled
    """Whether `array` holds float16 as its uint16 bits (a KV cache's keys at int16): a
    constant, as `scaled`."""
    constant = array.dtype == types.uint16
    return types.boolean(array), lambda context, builder, sig, args: ir.Constant(ir.IntType(1), constant)


@intrinsic
def load_u8_f32(typingctx, array, i):  # pragma: no cover - compiled
    """The 8 bytes at array[i:] (an int8 or uint8 array) as integers 0..255, in float32
    lanes (vpmovzxbd, vcvtdq2ps; exact): a KV cache's frozen 8-bit keys."""

    def codegen(context, builder, sig, args):
        narrow = ir.VectorType(ir.IntType(8), 8)
        packed = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], narrow), align=1)
        return builder.uitofp(packed, _VF)

    return F32(array, i), codegen


@intrinsic
def load_half(typingctx, array, i):  # pragma: no cover - compiled
    """The float16 in the two bytes at array[i:] (an int8 or uint8 array), as float32
    (exact)."""

    def codegen(context, builder, sig, args):
        bits = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], ir.HalfType()), align=1)
        return builder.fpext(bits, ir.FloatType())

    return types.float32(array, i), codegen


@intrinsic
def load_halves(typingctx, array, i):  # pragma: no cover - compiled
    """The eight float16 at bytes array[i:] (an int8 or uint8 array) as float32 lanes
    (vcvtph2ps; exact): a frozen block's parameters."""

    def codegen(context, builder, sig, args):
        eight = ir.VectorType(ir.HalfType(), 8)
        halves = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], eight), align=1)
        return builder.fpext(halves, _VF)

    return F32(array, i), codegen


@intrinsic
def store_half(typingctx, array, i, x):  # pragma: no cover - compiled
    """The float32 x rounded to float16 (to nearest even, as numpy's cast) into the
    two bytes at array[i:] (an int8 or uint8 array)."""

    def codegen(context, builder, sig, args):
        half = builder.fptrunc(args[2], ir.HalfType())
        builder.store(half, _pointer(context, builder, sig.args[0], args[0], args[1], ir.HalfType()), align=1)
        return context.get_dummy_value()

    return types.void(array, i, types.float32), codegen


def _load_unaligned(result_type, llvm_type):
    """An intrinsic loading `llvm_type` from the bytes at array[i:], on no alignment."""

    @intrinsic
    def load(typingctx, array, i):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], llvm_type), align=1)

        return result_type(array, i), codegen

    return load


# The float32 stored in the four bytes at array[i:] (an 8-bit cache's scale, kept among
# its int8 keys; see model.KVCache), and eight of them in the 32 bytes there.
load_scale = _load_unaligned(types.float32, ir.FloatType())
load_scales = _load_unaligned(F32, _VF)


@intrinsic
def store_scale(typingctx, array, i, x):  # pragma: no cover - compiled
    """load_scale's inverse: the float32 x into the four bytes at array[i:]."""

    def codegen(context, builder, sig, args):
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], ir.FloatType()), align=1)
        return context.get_dummy_value()

    return types.void(array, i, types.float32), codegen


@intrinsic
def max_abs(typingctx, a, b):  # pragma: no cover - compiled
    """max(a, |b|) lane by lane."""

    def codegen(context, builder, sig, args):
        as_int = ir.VectorType(_I32, 8)
        magnitude = builder.and_(builder.bitcast(args[1], as_int), ir.Constant(as_int, [0x7FFFFFFF] * 8))
        return _call(builder, "llvm.x86.avx.max.ps.256", _VF, [args[0], builder.bitcast(magnitude, _VF)])

    return F32(F32, F32), codegen


@intrinsic
def largest_lane(typingctx, a):  # pragma: no cover - compiled
    """The largest of the 8 lanes (none NaN). As a tree of three maxima of halves: a
    chain of seven compares, one after another, was most of the latency of
    quantizing a block of activations (the largest of a set is the same in any
    order)."""

    def codegen(context, builder, sig, args):
        return builder.extract_element(_tree(builder, args[0], lambda x, y: _larger(builder, x, y)), _ZERO)

    return types.float32(F32), codegen


def _larger(builder, x, y):
    return builder.select(builder.fcmp_ordered(">", x, y), x, y)


_ZERO = ir.Constant(_I32, 0)


def _tree(builder, v, combine):
    """Lane 0 of v combined with all its other lanes, pairwise by halves: 4, 2, 1."""
    undefined = ir.Constant(v.type, ir.Undefined)
    width = v.type.count // 2
    while width:
        upper = ir.Constant(ir.VectorType(_I32, v.type.count), [width + k for k in range(v.type.count)])
        v = combine(v, builder.shuffle_vector(v, undefined, upper))
        width //= 2
    return v


@intrinsic
def round_scaled(typingctx, a, scale):  # pragma: no cover - compiled
    """rint(a * scale) as int32 (vcvtps2dq rounds half to even, as np.rint does)."""

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx.cvt.ps2dq.256", _V32, [builder.fmul(args[0], args[1])])

    return I32(F32, F32), codegen


@intrinsic
def high7(typingctx, q):  # pragma: no cover - compiled
    """(q + 64) >> 7 per lane (arithmetic shift): q / 128 rounded, for |q| <= 16256."""

    def codegen(context, builder, sig, args):
        return builder.ashr(builder.add(args[0], ir.Constant(_V32, [64] * 8)), ir.Constant(_V32, [7] * 8))

    return I32(I32), codegen


@intrinsic
def low7(typingctx, q, high):  # pragma: no cover - compiled
    """q - high * 128 per lane: in [-64, 63] for high = high7(q)."""

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], builder.shl(args[1], ir.Constant(_V32, [7] * 8)))

    return I32(I32, I32), codegen


@intrinsic
def store_i8(typingctx, array, i, v):  # pragma: no cover - compiled
    """The 8 int32 lanes of v, truncated to bytes, at array[i:] (an int8 array)."""

    def codegen(context, builder, sig, args):
        narrow = ir.VectorType(ir.IntType(8), 8)
        builder.store(
            builder.trunc(args[2], narrow), _pointer(context, builder, sig.args[0], args[0], args[1], narrow), align=1
        )
        return context.get_dummy_value()

    return types.void(array, i, I32), codegen


@intrinsic
def lane_sum(typingctx, a, b, c, d):  # pragma: no cover - compiled
    """The sum of all lanes of four int32 vectors (exact)."""

    def codegen(context, builder, sig, args):
        v = builder.add(builder.add(args[0], args[1]), builder.add(args[2], args[3]))
        return builder.extract_element(_tree(builder, v, builder.add), _ZERO)

    return types.int32(I32, I32, I32, I32), codegen


@intrinsic
def touch(typingctx, array, i):  # pragma: no cover - compiled
    """Reads the cache line holding array[i] and nothing else: one load, kept by an
    empty asm statement that takes its byte (a value nothing uses would be dropped).
    A loop of these asks for all of a region's lines at once, which attention's own
    loops, a load among multiply-adds that wait on each other, never had in flight
    (block_ops._warm)."""

    def codegen(context, builder, sig, args):
        byte_t = ir.IntType(8)
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        value = builder.load(builder.bitcast(builder.gep(data, [args[1]]), byte_t.as_pointer()), align=1)
        builder.asm(ir.FunctionType(ir.VoidType(), [byte_t]), "", "r", [value], side_effect=True)
        return context.get_dummy_value()

    return types.void(array, i), codegen


@intrinsic
def prefetch(typingctx, array, i):  # pragma: no cover - compiled
    """Asks for the cache line holding array[i] without waiting for it (prefetcht1,
    into L2): never faults, so an index past the end is harmless. The products ran
    on the weights of their current output group alone, the memory idle while
    they multiplied and the multipliers idle while a group's first lines arrived:
    from memory they took the time from cache plus the time of the weights' bytes,
    at every number of rows (1.6 to 1.9 ms for a step's layers at 1, 5 and 32
    rows). The CPU's own prefetchers did not run ahead across the groups."""

    def codegen(context, builder, sig, args):
        byte_p = ir.IntType(8).as_pointer()
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_p)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", [byte_p], ir.FunctionType(ir.VoidType(), [byte_p, _I32, _I32, _I32])
        )
        # read (0), locality 2 (into L2: at one row 1.2x to 1.35x faster than into
        # L1, three groups ahead), the data cache (1)
        builder.call(fn, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 2), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.void(array, i), codegen


@intrinsic
def silu_gated(typingctx, g, e, u):  # pragma: no cover - compiled
    """(g u) / (1 + e) per lane, each step rounded once, as block_ops.silu_gate's
    scalar remainder computes it (a true division, not a reciprocal's estimate).
    numba left that loop scalar (one vdivss an element): 42 of the 56 us of a
    32-row SwiGLU."""

    def codegen(context, builder, sig, args):
        one = ir.Constant(_VF, [1.0] * 8)
        return builder.fdiv(builder.fmul(args[0], args[2]), builder.fadd(one, args[1]))

    return F32(F32, F32, F32), codegen


@intrinsic
def swap_pairs(typingctx, v):  # pragma: no cover - compiled
    """Lanes (1, 0, 3, 2, ...): each pair's two values swapped (RoPE's partner)."""

    def codegen(context, builder, sig, args):
        mask = ir.Constant(ir.VectorType(_I32, 8), [k ^ 1 for k in range(8)])
        return builder.shuffle_vector(args[0], ir.Constant(_VF, ir.Undefined), mask)

    return F32(F32), codegen


@intrinsic
def evens_odds(typingctx, evens, odds):  # pragma: no cover - compiled
    """The even lanes of `evens` and the odd lanes of `odds`."""

    def codegen(context, builder, sig, args):
        mask = ir.Constant(ir.VectorType(_I32, 8), [k if k % 2 == 0 else 8 + k for k in range(8)])
        return builder.shuffle_vector(args[0], args[1], mask)

    return F32(F32, F32), codegen
