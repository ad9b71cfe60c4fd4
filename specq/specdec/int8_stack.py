"""layer_stack's compiled block loop with the int8 products (int8.py), for the integer
precisions. The same loop, attention and residual arithmetic as layer_stack._run; only
the products differ, so a row gets the bits that LlamaModel._blocks gives it with
the same Int8Matrix weights. Imported only where int8.AVAILABLE (its kernels need AVX2).

Two forms: one for models whose block matrices are all Q4_1 (the default model's),
each kind stacked into one array; and one for any mix of int8.FORMATS and F16/BF16
(half.py) (the files other quantizers write mix types from layer to layer, e.g.
Q4_K_M's Q4_K and Q6_K), each kind's matrices laid end to end with their offsets and
formats.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numba import njit, prange

from specq.specdec import block_ops, half, int8
from specq.specdec.half import HalfMatrix
from specq.specdec.int8 import Int8Matrix
from specq.specdec.layer_stack import (
    KINDS,
    StackedLayers,
    attention,
    beyond_llama,
    one,
)


def build(layers) -> tuple[StackedLayers, tuple] | None:
    """(the stack, the layers rebuilt as views into it), or None unless every block
    matrix is an Int8Matrix or a HalfMatrix (F16, BF16) with no padding."""
    if not layers or any(beyond_llama(lw) for lw in layers):
        return None  # the compiled loop is llama's block
    matrices = [getattr(lw, k) for lw in layers for k in KINDS]
    if not all(isinstance(w, (HalfMatrix, Int8Matrix)) and _unpadded(w) for w in matrices):
        return None
    if len({w.split for w in matrices if isinstance(w, Int8Matrix)}) > 1:
        return None
    # The Q4_1 loop runs on float16 scales, which Q4_1 and Q4_0 files have; Q4_1
    # matrices unpacked from Q4_K have float32 ones and take the mixed loop, rather
    # than a second compile of this one.
    if any(w.type_name != "Q4_1" or w.d.dtype != np.uint16 for w in matrices):
        return _build_mixed(layers)
    stacked = {
        k: tuple(np.stack([getattr(getattr(lw, k), part) for lw in layers]) for part in ("quants", "d", "m"))
        for k in KINDS
    }
    no_sums = np.empty(0, np.int32)
    split = layers[0].w_qkv.split
    stack = StackedLayers.of(layers, tuple(a for k in KINDS for a in stacked[k]), (_run, _run_one), (split,))
    views = tuple(
        replace(
            lw,
            attn_norm=stack.attn_norm[i],
            ffn_norm=stack.ffn_norm[i],
            **{
                k: Int8Matrix(
                    "Q4_1", getattr(lw, k).shape, *(a[i] for a in stacked[k]), no_sums, getattr(lw, k).lanes, split
                )
                for k in KINDS
            },
        )
        for i, lw in enumerate(layers)
    )
    return stack, views


# Format codes: int8.FORMATS's indices, then the 2-byte float types (half.TYPES).
_CODES = (*int8.FORMATS, *half.TYPES)
_NO_F32, _NO_U16, _NO_I32 = np.empty(0, np.float32), np.empty(0, np.uint16), np.empty(0, np.int32)


def _unpadded(w: Int8Matrix | HalfMatrix) -> bool:
    """Whether the product has exactly the matrix's outputs (the loop adds it as is)."""
    if isinstance(w, HalfMatrix):
        return w.lanes == half.LANES and w.shape[0] % half.LANES == 0
    return w.n_padded == w.shape[0]


def _laid_end_to_end(matrices: list[Int8Matrix | HalfMatrix]) -> tuple[np.ndarray, ...]:
    """One kind's matrices of every layer: (formats [L], offsets [L + 1, 4], quants
    (or F16/BF16 weights) as bytes, d, m, sums), matrix i's arrays from offsets[i]
    to offsets[i + 1]."""
    codes = np.array([_CODES.index(w.type_name) for w in matrices], np.int64)
    scaled = [w for w in matrices if isinstance(w, Int8Matrix)]
    # One dtype for every matrix's scales: float16 bits where all are, else float32.
    narrow = all(w.d.dtype == np.uint16 for w in scaled)

    def scales(a: np.ndarray) -> np.ndarray:
        return a if narrow else int8.widened(a)

    none = _NO_U16 if narrow else _NO_F32
    parts = [
        (w.bits.view(np.uint8).reshape(-1), none, none, _NO_I32)
        if isinstance(w, HalfMatrix)
        else (w.quants.view(np.uint8), scales(w.d), scales(w.m), w.sums)
        for w in matrices
    ]
    offsets = np.zeros((len(matrices) + 1, 4), np.int64)
    offsets[1:] = np.cumsum([[a.size for a in p] for p in parts], axis=0)
    return (codes, offsets, *(np.concatenate([p[i] for p in parts]) for i in range(4)))


def _build_mixed(layers) -> tuple[StackedLayers, tuple]:
    split = any(getattr(lw, k).split for lw in layers for k in KINDS if isinstance(getattr(lw, k), Int8Matrix))
    kinds = tuple(_laid_end_to_end([getattr(lw, k) for lw in layers]) for k in KINDS)
    stack = StackedLayers.of(layers, kinds, (_run_mixed, _run_mixed_one), (split,))

    def view(w: Int8Matrix | HalfMatrix, kind: tuple, i: int) -> Int8Matrix | HalfMatrix:
        at = kind[1]
        quants, d, m, sums = (a[at[i, j] : at[i + 1, j]] for j, a in enumerate(kind[2:]))
        if isinstance(w, HalfMatrix):
            return HalfMatrix(w.type_name, w.shape, quants.view(np.uint16).reshape(w.bits.shape), w.lanes)
        return Int8Matrix(w.type_name, w.shape, quants.view(w.quants.dtype), d, m, sums, w.lanes, split)

    views = tuple(
        replace(
            lw,
            attn_norm=stack.attn_norm[i],
            ffn_norm=stack.ffn_norm[i],
            **{k: view(getattr(lw, k), kinds[j], i) for j, k in enumerate(KINDS)},
        )
        for i, lw in enumerate(layers)
    )
    return stack, views


@njit(parallel=True, cache=True, nogil=True)
def _normed_parallel(x, weight, eps, qx, split, n_chunks):  # pragma: no cover - compiled
    n, d = x.shape
    for c in prange(n_chunks):
        lo, hi = int8.chunk_rows(c, n, n_chunks)
        int8.quantize_chunk(block_ops.rms_norm(x[lo:hi], weight, eps), qx, lo, hi, d, split)


@njit(parallel=True, cache=True, nogil=True)
def _gated_parallel(gate_up, d_ffn, qx, split, n_chunks):  # pragma: no cover - compiled
    n = gate_up.shape[0]
    for c in prange(n_chunks):
        lo, hi = int8.chunk_rows(c, n, n_chunks)
        int8.quantize_chunk(block_ops.silu_gate(gate_up[lo:hi], d_ffn), qx, lo, hi, d_ffn, split)


# RMSNorm and SwiGLU's gate run where their output is quantized for the next product,
# so that from int8.PARALLEL_ROWS rows both threads share them in one parallel loop
# (each row by the same compiled rms_norm, silu_gate and quantize_rows as alone: the
# same bits), not one thread while the other waits.
@njit(inline="always")
def _normed(x, weight, eps, split, n_threads):  # pragma: no cover - compiled
    """rms_norm(x) quantized (int8.quantize_rows' buffers)."""
    n, d = x.shape
    if n < int8.PARALLEL_ROWS or n_threads < 2:
        return int8.quantized(block_ops.rms_norm(x, weight, eps), split, 1)
    qx = int8.quantized_buffers(n, d, split)
    _normed_parallel(x, weight, eps, qx, split, n_threads)
    return qx


@njit(inline="always")
def _gated(gate_up, d_ffn, split, n_threads):  # pragma: no cover - compiled
    """silu_gate(gate_up) quantized."""
    n = gate_up.shape[0]
    if n < int8.PARALLEL_ROWS or n_threads < 2:
        return int8.quantized(block_ops.silu_gate(gate_up, d_ffn), split, 1)
    qx = int8.quantized_buffers(n, d_ffn, split)
    _gated_parallel(gate_up, d_ffn, qx, split, n_threads)
    return qx


# The two loops compile for the caches' types of their first call (float16 keys with
# 8-bit values at int16, 8-bit both at int8), not for every pair at import.
@njit(cache=True, nogil=True)
def _run(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):  # pragma: no cover - compiled
    attn_norm, ffn_norm, qkv_q, qkv_d, qkv_m, out_q, out_d, out_m, gu_q, gu_d, gu_m, down_q, down_d, down_m = weights
    cos, sin = rope
    n_heads, n_qkv, d_ffn, eps, scale, n_threads, split = sizes
    n, d = x.shape
    for layer in range(qkv_q.shape[0]):
        h = _normed(x, attn_norm[layer], eps, split, n_threads)
        qkv = int8.product_q4_1_of(h, n, d, qkv_q[layer], qkv_d[layer], qkv_m[layer], n_qkv, n_threads, split)
        attn = attention(x, qkv, positions, starts, bounds, visible, cos, sin, keys, values, layer, n_heads, scale)
        x = x + int8.product_q4_1(attn, out_q[layer], out_d[layer], out_m[layer], d, n_threads, split)
        h = _normed(x, ffn_norm[layer], eps, split, n_threads)
        gate_up = int8.product_q4_1_of(h, n, d, gu_q[layer], gu_d[layer], gu_m[layer], 2 * d_ffn, n_threads, split)
        gated = _gated(gate_up, d_ffn, split, n_threads)
        x = x + int8.product_q4_1_of(gated, n, d_ffn, down_q[layer], down_d[layer], down_m[layer], d, n_threads, split)
    return x


@njit(cache=True, nogil=True)
def _run_one(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):  # pragma: no cover - compiled
    """_run for one segment, its lists built here rather than from Python."""
    return _run(x, positions, starts, bounds, one(visible), weights, rope, one(keys), one(values), sizes)


@njit(inline="always")
def _product(x, kind, layer, n_out, n_threads, split):  # pragma: no cover - compiled
    """x @ w.T for the kind's matrix of this layer (_laid_end_to_end)."""
    codes, at, quants, d, m, sums = kind
    if codes[layer] >= len(int8.FORMATS):  # F16 or BF16
        bits = quants[at[layer, 0] : at[layer + 1, 0]].view(np.uint16)
        return half.product(x, bits, codes[layer] == len(int8.FORMATS) + 1, n_threads)
    return int8.product(
        x,
        codes[layer],
        quants[at[layer, 0] : at[layer + 1, 0]],
        d[at[layer, 1] : at[layer + 1, 1]],
        m[at[layer, 2] : at[layer + 1, 2]],
        sums[at[layer, 3] : at[layer + 1, 3]],
        n_out,
        n_threads,
        split,
    )


# Only models of other files' types reach it.
@njit(cache=True, nogil=True)
def _run_mixed(
    x, positions, starts, bounds, visible, weights, rope, keys, values, sizes
):  # pragma: no cover - compiled
    """_run with each product's format read per layer (the module docstring)."""
    attn_norm, ffn_norm, qkv_w, out_w, gu_w, down_w = weights
    cos, sin = rope
    n_heads, n_qkv, d_ffn, eps, scale, n_threads, split = sizes
    d = x.shape[1]
    for layer in range(attn_norm.shape[0]):
        h = block_ops.rms_norm(x, attn_norm[layer], eps)
        qkv = _product(h, qkv_w, layer, n_qkv, n_threads, split)
        attn = attention(x, qkv, positions, starts, bounds, visible, cos, sin, keys, values, layer, n_heads, scale)
        x = x + _product(attn, out_w, layer, d, n_threads, split)
        h = block_ops.rms_norm(x, ffn_norm[layer], eps)
        gate_up = _product(h, gu_w, layer, 2 * d_ffn, n_threads, split)
        gated = block_ops.silu_gate(gate_up, d_ffn)
        x = x + _product(gated, down_w, layer, d, n_threads, split)
    return x


@njit(cache=True, nogil=True)
def _run_mixed_one(
    x, positions, starts, bounds, visible, weights, rope, keys, values, sizes
):  # pragma: no cover - compiled
    return _run_mixed(x, positions, starts, bounds, one(visible), weights, rope, one(keys), one(values), sizes)
