"""Intel AMX tiles for numba code: the integer products' many-row path (int8_amx.py).

Why. The int8 kernels' vpdpbusd does 64 multiply-adds an instruction; an AMX tile
product (tdpbssd) does 16 x 16 x 32 of them, for 16 rows by 16 outputs by one block
of 32 inputs, in a unit beside the vector ones. With many rows a round is bound by
those multiply-adds (issue 14), so on CPUs that have AMX (Xeon since Sapphire Rapids)
the Q8_0 products of many rows run on tiles, and only the float epilogue, the same
instructions in the same order as int8_codegen's, stays on vectors (int8_amx.py; it
also says why the Q4_1 products do not).

A tile register is named by a constant in the instruction, so each function below
is made for fixed tile numbers (`load(t)`, `dot_ss(c, a, b)`) rather than taking
them as arguments. The tiles' shapes come from a 64-byte configuration that a thread
loads (`configure`, `load_config`) before it uses them; Linux hands a process the
tiles' state only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM), which `AVAILABLE`
does once, at import: without that the first tile instruction is SIGILL.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from specq.specdec import vec

_I8, _I64 = ir.IntType(8), ir.IntType(64)
_VOID = ir.VoidType()
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


def _granted() -> bool:
    """Whether Linux lets this process use the tiles' state (asked once)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


# The integer tiles need AVX-512 besides (the epilogue runs on 512-bit vectors, 16
# lanes, one per tile column).
AVAILABLE = (
    {"amx-tile", "amx-int8", "avx512f", "avx512bw", "avx512vl"} <= vec.cpu_features() and vec.has_avx2() and _granted()
)

ROWS = 16  # a tile's most rows (of at most 64 bytes each)


def _call(builder, name, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VOID, [a.type for a in args]), name)
    builder.call(fn, args)


def _address(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), _I8.as_pointer())


@intrinsic
def load_config(typingctx, config):  # pragma: no cover - compiled
    """ldtilecfg from a 64-byte uint8 array (configure)."""

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.ldtilecfg", [_address(context, builder, sig.args[0], args[0], ir.Constant(_I64, 0))])
        return context.get_dummy_value()

    return types.none(config), codegen


@intrinsic
def release(typingctx):  # pragma: no cover - compiled
    """tilerelease: the tiles back to their initial state (a thread's last use)."""

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilerelease", [])
        return context.get_dummy_value()

    return types.none(), codegen


@functools.cache
def zero(t: int):
    @intrinsic
    def tile_zero(typingctx):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            _call(builder, "llvm.x86.tilezero", [ir.Constant(_I8, t)])
            return context.get_dummy_value()

        return types.none(), codegen

    return tile_zero


def _memory(name: str, t: int):
    @intrinsic
    def tile_memory(typingctx, array, i, stride):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            address = _address(context, builder, sig.args[0], args[0], args[1])
            _call(builder, name, [ir.Constant(_I8, t), address, args[2]])
            return context.get_dummy_value()

        return types.none(array, i, stride), codegen

    return tile_memory


@functools.cache
def load(t: int):
    """Tile t from array[i:] (i in elements), its rows `stride` bytes apart."""
    return _memory("llvm.x86.tileloadd64", t)


@functools.cache
def store(t: int):
    """Tile t into array[i:] (i in elements), its rows `stride` bytes apart."""
    return _memory("llvm.x86.tilestored64", t)


@functools.cache
def _dot(kind: str, c: int, a: int, b: int):
    @intrinsic
    def tile_dot(typingctx):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            _call(builder, f"llvm.x86.tdpb{kind}d", [ir.Constant(_I8, t) for t in (c, a, b)])
            return context.get_dummy_value()

        return types.none(), codegen

    return tile_dot


def dot_ss(c: int, a: int, b: int):
    """C[t c] += A[t a] . B[t b], both signed bytes: per row i and column j, the int32
    sum over k of A[i, k] B[k / 4, 4 j + k % 4] (B in VNNI layout: 4 inputs of a
    column side by side, as the int8 kernels' 16-lane weights are laid out)."""
    return _dot("ss", c, a, b)


@njit(inline="always")
def configure(config, shapes):  # pragma: no cover - compiled
    """config (64 bytes) for palette 1 and tiles 0.. of shapes [(rows, bytes a row)]."""
    config[:] = 0
    config[0] = 1
    for t in range(len(shapes)):
        rows, width = shapes[t]
        config[16 + 2 * t] = width & 0xFF
        config[17 + 2 * t] = width >> 8
        config[48 + t] = rows
