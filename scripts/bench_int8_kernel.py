"""Integer (int8 activations) products with Q4_1 / Q8_0 weights, measured alone (issue 14).

RESULTS: see the block filled in below after measuring.

Usage:  python scripts/bench_int8_kernel.py [--check] [--bench] [--rows 1,2,4,5,8,16,32,64]
                                            [--repeat 200] [--shapes all|small]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from llvmlite import ir
import llvmlite.binding as llvm_binding
import numba
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from specq.specdec.qkernels import QuantizedMatrix, qmatmul_t  # noqa: E402

BLOCK = 32
_FEATURES = llvm_binding.get_host_cpu_features()
HAVE_AVX2 = bool(_FEATURES.get("avx2", False))
HAVE_AVXVNNI = bool(_FEATURES.get("avxvnni", False)) or bool(_FEATURES.get("avx512vnni", False) and _FEATURES.get("avx512vl", False))
if os.environ.get("NUMBA_CPU_NAME"):  # numba then compiles for that CPU, not the host: trust only explicit features
    HAVE_AVXVNNI = "+avxvnni" in os.environ.get("NUMBA_CPU_FEATURES", "")


# ----------------------------------------------------------------------------------------
# 256-bit vector values as numba values: a numba type whose data model is an LLVM vector,
# so that numba locals of that type become SSA registers after mem2reg, and intrinsics
# that take and return them. LLVM does the register allocation and scheduling.
# ----------------------------------------------------------------------------------------
class Vec(types.Type):
    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        super().__init__(name=f"vec_{kind}x{n}")


_ELEM = {"i8": ir.IntType(8), "i16": ir.IntType(16), "i32": ir.IntType(32), "f32": ir.FloatType()}


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_ELEM[fe_type.kind], fe_type.n))


I8 = Vec("i8", 32)
I16 = Vec("i16", 16)
I32 = Vec("i32", 8)
F32 = Vec("f32", 8)
_V8, _V16, _V32, _VF = (ir.VectorType(_ELEM[k], n) for k, n in (("i8", 32), ("i16", 16), ("i32", 8), ("f32", 8)))
_I32T, _I64T = ir.IntType(32), ir.IntType(64)


def _elem_ptr(context, builder, aryty, ary, idx):
    a = context.make_array(aryty)(context, builder, ary)
    return builder.gep(a.data, [idx])


def _splat(builder, scalar, vty):
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(_I32T, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_I32T, vty.count), [0] * vty.count))


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


@intrinsic
def ld8(typingctx, arr, i):  # pragma: no cover - compiled
    """32 bytes at arr[i:] (int8/uint8 1-D array), unaligned."""
    def cg(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _V8.as_pointer())
        return builder.load(p, align=1)
    return I8(arr, i), cg


@intrinsic
def bc4(typingctx, arr, i):  # pragma: no cover - compiled
    """The 4 bytes at arr[i:] (int8/uint8 array) repeated 8 times (vpbroadcastd)."""
    def cg(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _I32T.as_pointer())
        return builder.bitcast(_splat(builder, builder.load(p, align=1), _V32), _V8)
    return I8(arr, i), cg


@intrinsic
def bc2x16(typingctx, arr, i):  # pragma: no cover - compiled
    """The 2 int16 at arr[i:] (int16 array) repeated 8 times."""
    def cg(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _I32T.as_pointer())
        return builder.bitcast(_splat(builder, builder.load(p, align=1), _V32), _V16)
    return I16(arr, i), cg


@intrinsic
def ldsx16(typingctx, arr, i):  # pragma: no cover - compiled
    """16 int8 at arr[i:] sign-extended to 16 int16 (vpmovsxbw)."""
    def cg(context, builder, sig, args):
        v16i8 = ir.VectorType(ir.IntType(8), 16)
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), v16i8.as_pointer())
        return builder.sext(builder.load(p, align=1), _V16)
    return I16(arr, i), cg


@intrinsic
def nib_lo(typingctx, v):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(_V8, [0x0F] * 32))
    return I8(I8), cg


@intrinsic
def nib_hi(typingctx, v):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        s = builder.lshr(builder.bitcast(args[0], _V16), ir.Constant(_V16, [4] * 16))
        return builder.and_(builder.bitcast(s, _V8), ir.Constant(_V8, [0x0F] * 32))
    return I8(I8), cg


@intrinsic
def maddubs(typingctx, a, b):  # pragma: no cover - compiled
    """vpmaddubsw: u8 a x s8 b, adjacent pairs summed (saturating) into int16."""
    def cg(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16, list(args))
    return I16(I8, I8), cg


@intrinsic
def pmaddwd(typingctx, a, b):  # pragma: no cover - compiled
    """vpmaddwd: s16 x s16, adjacent pairs summed into int32."""
    def cg(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx2.pmadd.wd", _V32, list(args))
    return I32(I16, I16), cg


@intrinsic
def pairsum16(typingctx, a):  # pragma: no cover - compiled
    """int16 pairs -> int32 (vpmaddwd with ones)."""
    def cg(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx2.pmadd.wd", _V32, [args[0], ir.Constant(_V16, [1] * 16)])
    return I32(I16), cg


@intrinsic
def dpbusd(typingctx, acc, a, b):  # pragma: no cover - compiled
    """AVX-VNNI vpdpbusd: acc + sum of 4 (u8 a x s8 b) per int32 lane, no saturation."""
    def cg(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", _V32, [args[0], args[1], args[2]])
    return I32(I32, I8, I8), cg


@intrinsic
def add16(typingctx, a, b):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return builder.add(args[0], args[1])
    return I16(I16, I16), cg


@intrinsic
def add32(typingctx, a, b):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return builder.add(args[0], args[1])
    return I32(I32, I32), cg


@intrinsic
def sub32(typingctx, a, b):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return builder.sub(args[0], args[1])
    return I32(I32, I32), cg


@intrinsic
def ld32(typingctx, arr, i):  # pragma: no cover - compiled
    """8 int32 at arr[i:]."""
    def cg(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _V32.as_pointer())
        return builder.load(p, align=4)
    return I32(arr, i), cg


@intrinsic
def z16(typingctx):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return ir.Constant(_V16, [0] * 16)
    return I16(), cg


@intrinsic
def z32(typingctx):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return ir.Constant(_V32, [0] * 8)
    return I32(), cg


@intrinsic
def zf(typingctx):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * 8)
    return F32(), cg


@intrinsic
def tofloat(typingctx, a):  # pragma: no cover - compiled
    """int32 -> float32, exact below 2**24 (all block sums here)."""
    def cg(context, builder, sig, args):
        return builder.sitofp(args[0], _VF)
    return F32(I32), cg


@intrinsic
def ldf(typingctx, arr, i):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _VF.as_pointer())
        return builder.load(p, align=4)
    return F32(arr, i), cg


@intrinsic
def stf(typingctx, arr, i, v):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _VF.as_pointer())
        builder.store(args[2], p, align=4)
        return context.get_dummy_value()
    return types.void(arr, i, F32), cg


@intrinsic
def bcf(typingctx, x):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return _splat(builder, args[0], _VF)
    return F32(types.float32), cg


@intrinsic
def bcfa(typingctx, arr, i):  # pragma: no cover - compiled
    """arr[i] (float32 array) in all 8 lanes (vbroadcastss from memory; no negative-index
    wraparound code, which numba's arr[i] adds and which cost integer registers here)."""
    def cg(context, builder, sig, args):
        return _splat(builder, builder.load(_elem_ptr(context, builder, sig.args[0], args[0], args[1])), _VF)
    return F32(arr, i), cg


@intrinsic
def fmul(typingctx, a, b):  # pragma: no cover - compiled
    def cg(context, builder, sig, args):
        return builder.fmul(args[0], args[1])  # no fast-math flags: one rounding, always
    return F32(F32, F32), cg


@intrinsic
def fma(typingctx, a, b, c):  # pragma: no cover - compiled
    """a * b + c with one rounding (llvm.fma: a vfmadd, never split or reordered)."""
    def cg(context, builder, sig, args):
        return _call(builder, "llvm.fma.v8f32", _VF, list(args))
    return F32(F32, F32, F32), cg


# ----------------------------------------------------------------------------------------
# Weight layouts (repacked at load from gguf's bytes; 8 outputs per "oc8" column group,
# the 8 int32 lanes of a ymm register are 8 outputs, each lane holds 4 (or 2) consecutive
# inputs so that vpmaddubsw/vpmaddwd/vpdpbusd reduce along the inputs within a lane and
# the activations are a broadcast of 4 bytes: no horizontal sums, no shuffles):
#   Q4_1 "q4": wq[oc8, block, v(4), 32 bytes]: byte 4*lane+p holds the nibble of input
#        4v+p (low) and 16+4v+p (high) of output 8*oc8+lane; wd, wm float32 [oc8, block, 8].
#   Q8_0 "q8w" (AVX2, int16 route): wq[oc8, block, v(16), 16 bytes]: byte 2*lane+p is
#        input 2v+p; sign-extended to int16 in the kernel; wd float32 [oc8, block, 8].
#   Q8_0 "q8v" (VNNI route): wq[oc8, block, v(8), 32 bytes]: byte 4*lane+p is input 4v+p;
#        wsum int32 [oc8, block, 8] = 128 * sum of the block's quants (the offset of u8 x).
# ----------------------------------------------------------------------------------------
class Int8Weights:
    def __init__(self, qm: QuantizedMatrix, vnni: bool = False):
        n_out, n_in = qm.shape
        assert n_out % 8 == 0 and n_in % BLOCK == 0
        self.type_name, self.shape, self.vnni = qm.type_name, qm.shape, vnni
        nb, n8 = n_in // BLOCK, n_out // 8
        raw = qm.to_gguf_bytes().reshape(n_out, nb, -1)
        d = raw[:, :, 0:2].copy().view(np.float16).astype(np.float32)[:, :, 0]  # [n_out, nb]
        self.wd = np.ascontiguousarray(d.reshape(n8, 8, nb).transpose(0, 2, 1)).reshape(-1)
        if qm.type_name == "Q4_1":
            m = raw[:, :, 2:4].copy().view(np.float16).astype(np.float32)[:, :, 0]
            self.wm = np.ascontiguousarray(m.reshape(n8, 8, nb).transpose(0, 2, 1)).reshape(-1)
            qs = raw[:, :, 4:20]  # [n_out, nb, 16]: byte j = element j (low) | element j+16 (high)
            lo, hi = qs & 0x0F, qs >> 4  # elements 0..15, 16..31
            # [n_out, nb, v, p] -> [n8, nb, v, lane, p]
            lo = lo.reshape(n8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)
            hi = hi.reshape(n8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)
            self.wq = np.ascontiguousarray((lo | (hi << 4)).astype(np.uint8)).reshape(-1)
        else:
            q = raw[:, :, 2:34].view(np.int8)  # [n_out, nb, 32]
            if vnni:
                self.wq = np.ascontiguousarray(q.reshape(n8, 8, nb, 8, 4).transpose(0, 2, 3, 1, 4)).reshape(-1)
                s = 128 * q.astype(np.int32).sum(axis=2)  # [n_out, nb]
                self.wsum = np.ascontiguousarray(s.reshape(n8, 8, nb).transpose(0, 2, 1)).reshape(-1).astype(np.int32)
            else:
                self.wq = np.ascontiguousarray(q.reshape(n8, 8, nb, 16, 2).transpose(0, 2, 3, 1, 4)).reshape(-1)


# ----------------------------------------------------------------------------------------
# Activation quantization, Q8_0-style per row and block of 32: d = max|x| / 127,
# q = rint(x / d) in [-127, 127]; plus (Q4_1) the block sum of x taken as
# d * sum(q) (see below). Per row, so row invariant.
# ----------------------------------------------------------------------------------------
EXACT_X_SUM = 0


@njit(cache=True, nogil=True)
def quantize_rows(x, xq, xq16, xu, xd, xs):  # pragma: no cover - compiled
    n, n_in = x.shape
    nb = n_in // BLOCK
    for r in range(n):
        for b in range(nb):
            amax = np.float32(0.0)
            total = np.float32(0.0)
            for j in range(BLOCK):
                v = x[r, b * BLOCK + j]
                amax = max(amax, abs(v))
                total += v
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            xd[r * nb + b] = d
            qsum = 0
            for j in range(BLOCK):
                q = np.int32(np.rint(x[r, b * BLOCK + j] * inv))
                q = min(127, max(-127, q))
                qsum += q
                i = r * n_in + b * BLOCK + j
                xq[i] = q
                xq16[i] = q
                xu[i] = q + 128
            # sum of the *quantized* x (llama.cpp's Q8_1 choice): the m term then sees the
            # same x as the d q term and their errors cancel; with the exact float sum the
            # error was (w - m) dx instead of w dx, twice as large (measured rms 1.1-1.4e-2
            # against 0.6e-2 on Gaussian x). `total` kept for that comparison.
            xs[r * nb + b] = np.float32(qsum) * d if EXACT_X_SUM == 0 else total


class QActs:
    def __init__(self, x: np.ndarray):
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, n_in = x.shape
        nb = n_in // BLOCK
        self.n, self.n_in = n, n_in
        self.xq = np.empty(n * n_in, np.int8)
        self.xq16 = np.empty(n * n_in, np.int16)
        self.xu = np.empty(n * n_in, np.uint8)
        self.xd = np.empty(n * nb, np.float32)
        self.xs = np.empty(n * nb, np.float32)
        quantize_rows(x, self.xq, self.xq16, self.xu, self.xd, self.xs)


# ----------------------------------------------------------------------------------------
# Micro-kernels, generated for NO output vectors (8 outputs each) x NR activation rows.
# The float accumulators a_o_r live in registers over all blocks of the row group; per
# block the integer sums s_o_r are exact and the epilogue, per row and in block order, is
#     a = fma(float(isum), d_w * d_x, a)            [Q4_1 then: a = fma(m_w, sum_x, a)]
# the same operations whatever NO, NR or the other rows: bitwise row invariance.
# ----------------------------------------------------------------------------------------
def _gen_micro(kind: str, no: int, nr: int) -> str:
    """kind may carry ablation flags (timing only, wrong results): "q41-nounpack" skips
    the nibble unpacking (uses the packed bytes as they are), "-noepi" runs the float
    epilogue once per row group instead of once per block."""
    full = kind
    kind, *flags = kind.split("-")
    L = []
    A = L.append
    name = f"_mk_{full.replace('-', '_')}_{no}_{nr}"
    if kind in ("q41", "q41v"):
        A(f"def {name}(wq, wd, wm, xq, xd, xs, out, c8, r0, nb, n_in, n_out):")
    elif kind == "q8w":
        A(f"def {name}(wq, wd, xq16, xd, out, c8, r0, nb, n_in, n_out):")
    else:  # q8v
        A(f"def {name}(wq, wd, wsum, xu, xd, out, c8, r0, nb, n_in, n_out):")
    for o in range(no):
        for r in range(nr):
            A(f"    a_{o}_{r} = zf()")
    A("    for b in range(nb):")
    for o in range(no):
        A(f"        wb_{o} = (c8 + {o}) * nb + b")
    for r in range(nr):
        A(f"        xb_{r} = (r0 + {r}) * n_in + b * 32")
    if kind == "q41":
        for o in range(no):
            for r in range(nr):
                A(f"        s_{o}_{r} = z16()")
        for v in range(4):
            for o in range(no):
                A(f"        p = ld8(wq, wb_{o} * 128 + {v * 32})")
                A(f"        lo_{o} = p" if "nounpack" in flags else f"        lo_{o} = nib_lo(p)")
                A(f"        hi_{o} = p" if "nounpack" in flags else f"        hi_{o} = nib_hi(p)")
            for r in range(nr):
                A(f"        xl = bc4(xq, xb_{r} + {4 * v})")
                A(f"        xh = bc4(xq, xb_{r} + {16 + 4 * v})")
                for o in range(no):
                    A(f"        s_{o}_{r} = add16(s_{o}_{r}, add16(maddubs(lo_{o}, xl), maddubs(hi_{o}, xh)))")
        isum = "pairsum16(s_{o}_{r})"
    elif kind == "q41v":
        for o in range(no):
            for r in range(nr):
                A(f"        s_{o}_{r} = z32()")
        for v in range(4):
            for o in range(no):
                A(f"        p = ld8(wq, wb_{o} * 128 + {v * 32})")
                A(f"        lo_{o} = p" if "nounpack" in flags else f"        lo_{o} = nib_lo(p)")
                A(f"        hi_{o} = p" if "nounpack" in flags else f"        hi_{o} = nib_hi(p)")
            for r in range(nr):
                A(f"        xl = bc4(xq, xb_{r} + {4 * v})")
                A(f"        xh = bc4(xq, xb_{r} + {16 + 4 * v})")
                for o in range(no):
                    A(f"        s_{o}_{r} = dpbusd(dpbusd(s_{o}_{r}, lo_{o}, xl), hi_{o}, xh)")
        isum = "s_{o}_{r}"
    elif kind == "q8w":
        for o in range(no):
            for r in range(nr):
                A(f"        s_{o}_{r} = z32()")
        for v in range(16):
            for o in range(no):
                A(f"        w_{o} = ldsx16(wq, wb_{o} * 256 + {v * 16})")
            for r in range(nr):
                A(f"        xv = bc2x16(xq16, xb_{r} + {2 * v})")
                for o in range(no):
                    A(f"        s_{o}_{r} = add32(s_{o}_{r}, pmaddwd(w_{o}, xv))")
        isum = "s_{o}_{r}"
    else:  # q8v
        for o in range(no):
            for r in range(nr):
                A(f"        s_{o}_{r} = z32()")
        for v in range(8):
            for o in range(no):
                A(f"        w_{o} = ld8(wq, wb_{o} * 256 + {v * 32})")
            for r in range(nr):
                A(f"        xv = bc4(xu, xb_{r} + {4 * v})")
                for o in range(no):
                    A(f"        s_{o}_{r} = dpbusd(s_{o}_{r}, xv, w_{o})")
        isum = "sub32(s_{o}_{r}, ws_{o})"
        for o in range(no):
            A(f"        ws_{o} = ld32(wsum, wb_{o} * 8)")
    # epilogue
    ind = "        "
    if "noepi" in flags:
        A("        if b == nb - 1:")
        ind = "            "
    for o in range(no):
        A(f"{ind}dw_{o} = ldf(wd, wb_{o} * 8)")
        if kind.startswith("q41"):
            A(f"{ind}mw_{o} = ldf(wm, wb_{o} * 8)")
    for r in range(nr):
        A(f"{ind}dx = bcfa(xd, (r0 + {r}) * nb + b)")
        if kind.startswith("q41"):
            A(f"{ind}sx = bcfa(xs, (r0 + {r}) * nb + b)")
        for o in range(no):
            A(f"{ind}a_{o}_{r} = fma(tofloat({isum.format(o=o, r=r)}), fmul(dw_{o}, dx), a_{o}_{r})")
            if kind.startswith("q41"):
                A(f"{ind}a_{o}_{r} = fma(mw_{o}, sx, a_{o}_{r})")
    for o in range(no):
        for r in range(nr):
            A(f"    stf(out, (r0 + {r}) * n_out + (c8 + {o}) * 8, a_{o}_{r})")
    if "noepi" in flags:  # integer sums carried over all blocks, so that none is dead code
        inits = [ln for ln in L if ln.strip().startswith("s_") and ln.strip().endswith(("z16()", "z32()"))]
        L = [ln for ln in L if ln not in inits]
        at = L.index("    for b in range(nb):")
        L[at:at] = ["    " + ln.strip() for ln in inits]
    return "\n".join(L) + "\n"


def _gen_driver(kind: str, no: int, nr: int) -> str:
    """prange over the threads' slices of oc8 groups; in a slice, groups of `no` oc8
    (then single oc8 for the remainder), and for each group all rows in groups of `nr`
    (then the remainder rows as one smaller group): the group's weights (a few KB) stay
    in L1 while the row groups pass over them."""
    full = kind.replace("-", "_")
    args = {"q41": "wq, wd, wm, xq, xd, xs", "q41v": "wq, wd, wm, xq, xd, xs",
            "q8w": "wq, wd, xq16, xd", "q8v": "wq, wd, wsum, xu, xd"}[kind.split("-")[0]]
    L = []
    A = L.append
    A(f"def _drive_{full}({args}, out, n, nb, n_in, n_out, n_slices):")
    A("    n8 = n_out // 8")
    A("    for t in prange(n_slices):")
    A("        lo = t * n8 // n_slices")
    A("        hi = (t + 1) * n8 // n_slices")
    A("        c8 = lo")
    A("        while c8 < hi:")
    A(f"            step = {no} if c8 + {no} <= hi else 1")
    A("            r0 = 0")
    A("            while r0 < n:")
    A(f"                g = min({nr}, n - r0)")
    first = True
    for step in sorted({no, 1}, reverse=True):
        for g in range(nr, 0, -1):
            kw = "if" if first else "elif"
            first = False
            A(f"                {kw} step == {step} and g == {g}:")
            A(f"                    _mk_{full}_{step}_{g}({args}, out, c8, r0, nb, n_in, n_out)")
    A("                r0 += g")
    A("            c8 += step")
    return "\n".join(L) + "\n"


_KINDS = {"q41": "AVX2 maddubs", "q41v": "AVX-VNNI dpbusd", "q8w": "AVX2 pmaddwd(int16)", "q8v": "AVX-VNNI dpbusd"}
_DRIVERS: dict = {}


def build(kind: str, no: int, nr: int):
    key = (kind, no, nr)
    if key in _DRIVERS:
        return _DRIVERS[key]
    g = dict(globals())
    src = ""
    for step in sorted({no, 1}):
        for r in range(1, nr + 1):
            src += _gen_micro(kind, step, r)
    exec(compile(src, f"<micro {kind}>", "exec"), g)
    for step in sorted({no, 1}):
        for r in range(1, nr + 1):
            name = f"_mk_{kind.replace('-', '_')}_{step}_{r}"
            g[name] = njit(inline="always", nogil=True)(g[name])
    exec(compile(_gen_driver(kind, no, nr), f"<driver {kind}>", "exec"), g)
    drv = njit(parallel=True, nogil=True)(g[f"_drive_{kind.replace('-', '_')}"])
    _DRIVERS[key] = drv
    return drv


# default register blocking per kernel kind (chosen by the --tune sweep below)
BLOCKING = {"q41": (1, 4), "q41v": (1, 4), "q8w": (1, 4), "q8v": (1, 4)}


def int8_matmul_t_q(a: QActs, w: Int8Weights, out: np.ndarray | None = None, kind: str | None = None,
                    blocking: tuple[int, int] | None = None) -> np.ndarray:
    """Product from already-quantized activations."""
    n_out, n_in = w.shape
    if kind is None:
        kind = ("q41v" if w.vnni else "q41") if w.type_name == "Q4_1" else ("q8v" if w.vnni else "q8w")
    base = kind.split("-")[0]
    no, nr = blocking or BLOCKING[base]
    if out is None:
        out = np.empty((a.n, n_out), np.float32)
    if not HAVE_AVX2 or (base.endswith("v") and not HAVE_AVXVNNI):
        return int8_matmul_t_portable(a, w, out)
    drv = build(kind, no, nr)
    nb, flat, nt = n_in // BLOCK, out.reshape(-1), numba.get_num_threads()
    if base in ("q41", "q41v"):
        drv(w.wq, w.wd, w.wm, a.xq, a.xd, a.xs, flat, a.n, nb, n_in, n_out, nt)
    elif base == "q8w":
        drv(w.wq, w.wd, a.xq16, a.xd, flat, a.n, nb, n_in, n_out, nt)
    else:
        drv(w.wq, w.wd, w.wsum, a.xu, a.xd, flat, a.n, nb, n_in, n_out, nt)
    return out


def int8_matmul_t(x: np.ndarray, w: Int8Weights, **kw) -> np.ndarray:
    """x float32 [n, n_in] -> float32 [n, n_out] ~= x @ dequantized(w).T, through int8
    activations (quantized here, per row)."""
    return int8_matmul_t_q(QActs(x), w, **kw)


def int8_matmul_t_portable(a: QActs, w: Int8Weights, out: np.ndarray) -> np.ndarray:
    """Portable fallback (numpy, not fast): the same exact integer block sums, the same
    float32 epilogue order (but mul + add instead of a fused multiply-add, so the bits
    may differ from the vector kernels by an ulp; still row invariant)."""
    n_out, n_in = w.shape
    nb, n8 = n_in // BLOCK, n_out // 8
    xq = a.xq.reshape(a.n, nb, BLOCK).astype(np.int32)
    if w.type_name == "Q4_1":
        p = w.wq.reshape(n8, nb, 4, 8, 4)
        lo, hi = (p & 0x0F).astype(np.int32), (p >> 4).astype(np.int32)
        q = np.concatenate([lo.transpose(0, 3, 1, 2, 4).reshape(n8, 8, nb, 16),
                            hi.transpose(0, 3, 1, 2, 4).reshape(n8, 8, nb, 16)], axis=3).reshape(n_out, nb, 32)
    elif w.vnni:
        q = w.wq.reshape(n8, nb, 8, 8, 4).transpose(0, 3, 1, 2, 4).reshape(n_out, nb, 32).astype(np.int32)
    else:
        q = w.wq.reshape(n8, nb, 16, 8, 2).transpose(0, 3, 1, 2, 4).reshape(n_out, nb, 32).astype(np.int32)
    isum = np.einsum("rbj,obj->rbo", xq, q).astype(np.float32)  # exact int32 -> float32
    wd = w.wd.reshape(n8, nb, 8).transpose(1, 0, 2).reshape(nb, n_out)
    xd = a.xd.reshape(a.n, nb)
    acc = np.zeros((a.n, n_out), np.float32)
    for b in range(nb):
        acc = acc + isum[:, b, :] * (wd[b][None, :] * xd[:, b : b + 1])
        if w.type_name == "Q4_1":
            wm = w.wm.reshape(n8, nb, 8)[:, b, :].reshape(-1)
            acc = acc + wm[None, :] * a.xs.reshape(a.n, nb)[:, b : b + 1]
    out[:] = acc
    return out


# ----------------------------------------------------------------------------------------
# Test matrices, correctness and benchmark
# ----------------------------------------------------------------------------------------
SHAPES = [  # (name, n_in, n_out, type)
    ("qkv", 576, 960, "Q4_1"),
    ("attn_out", 576, 576, "Q4_1"),
    ("gate_up", 576, 3072, "Q4_1"),
    ("down", 1536, 576, "Q4_1"),
    ("head", 576, 49152, "Q8_0"),
]


def make_matrix(n_in: int, n_out: int, type_name: str, seed: int = 0) -> QuantizedMatrix:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType[type_name])
    return QuantizedMatrix.from_gguf_bytes(np.asarray(raw, dtype=np.uint8).reshape(n_out, -1), type_name, (n_out, n_in))


def check(kinds) -> None:
    rng = np.random.default_rng(1)
    for name, n_in, n_out, t in SHAPES:
        if name == "head":
            n_out = 4608  # a slice of the head's shape is enough for correctness
        qm = make_matrix(n_in, n_out, t)
        deq = qm.dequantize().astype(np.float64)
        x = rng.standard_normal((32, n_in)).astype(np.float32)
        x0 = x.copy()
        x[:, :5] *= 20  # some outliers, as real activations have
        ref = x.astype(np.float64) @ deq.T
        cur = qmatmul_t(x, qm)
        scale = np.abs(ref).max()
        print(f"{name:9s} {t} {n_in}x{n_out}: current kernel max|err|/max|ref| = {np.abs(cur - ref).max() / scale:.2e}")
        for kind in kinds:
            if (t == "Q4_1") != kind.startswith("q41"):
                continue
            w = Int8Weights(qm, vnni=kind.endswith("v"))
            ref0 = x0.astype(np.float64) @ deq.T
            y0 = int8_matmul_t(x0, w, kind=kind)
            print(f"    {kind:5s} gaussian x without outliers: max|err|/max|ref| = {np.abs(y0 - ref0).max() / np.abs(ref0).max():.2e}, "
                  f"rms err / rms ref = {np.sqrt(((y0 - ref0) ** 2).mean() / (ref0 ** 2).mean()):.2e}; with outliers below "
                  f"(rms {np.sqrt(((int8_matmul_t(x, w, kind=kind) - ref) ** 2).mean() / (ref ** 2).mean()):.2e})")
        for kind in kinds:
            if (t == "Q4_1") != kind.startswith("q41"):
                continue
            w = Int8Weights(qm, vnni=kind.endswith("v"))
            for blocking in [BLOCKING[kind], (2, 3)]:
                y = int8_matmul_t(x, w, kind=kind, blocking=blocking)
                err = np.abs(y - ref).max() / scale
                rel_row = np.abs(y - ref).max(axis=1) / np.abs(ref).max(axis=1)
                alone = np.stack([int8_matmul_t(x[r : r + 1], w, kind=kind, blocking=blocking)[0] for r in range(32)])
                g8 = np.concatenate([int8_matmul_t(x[i : i + 8], w, kind=kind, blocking=blocking) for i in range(0, 32, 8)])
                odd = np.concatenate([int8_matmul_t(x[i : i + 5], w, kind=kind, blocking=blocking) for i in range(0, 30, 5)]
                                     + [int8_matmul_t(x[30:], w, kind=kind, blocking=blocking)])
                same = (alone.view(np.uint32) == y.view(np.uint32)).all() and (g8.view(np.uint32) == y.view(np.uint32)).all() \
                    and (odd.view(np.uint32) == y.view(np.uint32)).all()
                port = int8_matmul_t_portable(QActs(x), w, np.empty_like(y))
                pd = np.abs(port - y).max() / scale
                print(f"    {kind:5s} {_KINDS[kind]:20s} blocking {blocking}: max|err|/max|ref| = {err:.2e} "
                      f"(worst row {rel_row.max():.2e}); rows alone/8/5/32 bitwise identical: {same}; "
                      f"portable path differs by {pd:.1e}")
                assert same, "row invariance broken"
                assert err < 3e-2


def _median_time(fn, repeat: int, max_time: float = 1.0) -> float:
    """Median of `repeat` calls, or of as many as fit in max_time seconds (at least 7)."""
    fn()
    ts = []
    t_end = time.perf_counter() + max_time
    while len(ts) < repeat and (len(ts) < 7 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def tune(kinds, rows, repeat, candidates) -> None:
    """Time each register blocking (outputs/8 x rows) on gate_up (Q4_1) and the head (Q8_0)."""
    numba.set_num_threads(2)
    rng = np.random.default_rng(3)
    for name, n_in, n_out, t in SHAPES:
        if name not in ("gate_up", "head"):
            continue
        qm = make_matrix(n_in, n_out, t)
        for k in kinds:
            if (t == "Q4_1") != k.startswith("q41"):
                continue
            w = Int8Weights(qm, vnni=k.endswith("v"))
            for R in rows:
                a = QActs(rng.standard_normal((R, n_in)).astype(np.float32))
                out = np.empty((R, n_out), np.float32)
                line = []
                for c in candidates:
                    dt = _median_time(lambda: int8_matmul_t_q(a, w, out, kind=k, blocking=c), repeat)
                    line.append(f"{c[0]}x{c[1]}: {R * n_in * n_out / dt / 1e9:6.1f}")
                print(f"{name} {k} R={R} GMAC/s  " + "  ".join(line), flush=True)


def busy() -> list[str]:
    """Other heavy processes of this machine's users (pytest, specq workers, chaos runs)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ("pytest" in cmd or "specq worker" in cmd or "chaos" in cmd) and "bench_int8_kernel" not in cmd:
            found.append(f"{pid} {cmd[:80]}")
    return found


def bench(kinds, rows, repeat, shapes) -> None:
    while busy():
        print("waiting for:", busy(), flush=True)
        time.sleep(30)
    numba.set_num_threads(2)
    rng = np.random.default_rng(2)
    print(f"threads {numba.get_num_threads()}, rows {rows}; times in us (median); GMAC/s; ratio = t(R)/t(1)")
    for name, n_in, n_out, t in shapes:
        qm = make_matrix(n_in, n_out, t)
        ws = {k: Int8Weights(qm, vnni=k.endswith("v")) for k in kinds if (t == "Q4_1") == k.startswith("q41")}
        res: dict[str, list] = {"current": [], "quant": []}
        for k in ws:
            res[k] = []
        for R in rows:
            x = rng.standard_normal((R, n_in)).astype(np.float32)
            tc = _median_time(lambda: qmatmul_t(x, qm), repeat)
            res["current"].append(tc)
            res["quant"].append(_median_time(lambda: QActs(x), repeat))
            a = QActs(x)
            out = np.empty((R, n_out), np.float32)
            for k, w in ws.items():
                res[k].append(_median_time(lambda: int8_matmul_t_q(a, w, out, kind=k), repeat))
        if busy():
            print("WARNING: another heavy process started during this shape:", busy())
        macs = np.array(rows) * n_in * n_out
        print(f"\n{name} {t} {n_in}x{n_out}")
        print("  R          " + "".join(f"{r:>9d}" for r in rows))
        for k, ts in res.items():
            ts = np.array(ts)
            label = "quantize x" if k == "quant" else (k if k == "current" else f"{k}")
            print(f"  {label:10s} us" + "".join(f"{1e6 * v:9.1f}" for v in ts))
            if k != "quant":
                print(f"  {'':10s} GM/s" + "".join(f"{m / v / 1e9:9.1f}" for m, v in zip(macs, ts)))
                print(f"  {'':10s} rat" + "".join(f"{v / ts[0]:9.2f}" for v in ts))
        sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--rows", default="1,2,4,5,8,16,32,64")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--kinds", default="q41,q41v,q8w,q8v")
    p.add_argument("--shapes", default="all")
    p.add_argument("--tune", default="", help="blockings to sweep, e.g. 1x1,1x4,2x3")
    p.add_argument("--blocking", default="", help="override, e.g. q41=2x3,q8w=1x4")
    args = p.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not HAVE_AVXVNNI:
        kinds = [k for k in kinds if not k.endswith("v")]
    for item in filter(None, args.blocking.split(",")):
        k, v = item.split("=")
        BLOCKING[k] = tuple(int(s) for s in v.split("x"))
    print(f"avx2 {HAVE_AVX2}, avx-vnni {HAVE_AVXVNNI}, cpu {llvm_binding.get_host_cpu_name()}, blocking {BLOCKING}")
    if args.check:
        check(kinds)
    if args.tune:
        while busy():
            print("waiting for:", busy(), flush=True)
            time.sleep(30)
        tune(kinds, [int(r) for r in args.rows.split(",")], args.repeat,
             [tuple(int(v) for v in c.split("x")) for c in args.tune.split(",")])
    if args.bench:
        shapes = SHAPES if args.shapes == "all" else [s for s in SHAPES if s[0] in args.shapes.split(",")]
        bench(kinds, [int(r) for r in args.rows.split(",")], args.repeat, shapes)


if __name__ == "__main__":
    main()
