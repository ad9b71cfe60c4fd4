"""All the transformer blocks of one forward in one compiled call, for one sequence.

A decode step or a verification through `LlamaModel.forward`'s layer loop is about
20 Python-level calls a block (norms, products, RoPE, cache writes, attention,
residual adds), 600 a step for the default model's 30 blocks, each paying numpy's
or numba's dispatch: about 1.5 ms of a 9 ms step on the 2-core AMD EPYC. Here the
same loop runs inside numba and calls the very same compiled functions (fused.*,
qkernels' Q4_1 product), so a row gets exactly the bits the Python loop gives it:
plain decoding, a verification and a batched round (which keeps the Python loop,
one segment per cache) still agree bit for bit.

It serves models whose four block matrices are all Q4_1 (the default model's; the
output head and embedding may be anything), stacked here into one array per kind,
and segments shorter than products.BULK_ROWS (prompts take BLAS).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import config, njit

from specq.specdec import fused
from specq.specdec.qkernels import LANES, QuantizedMatrix, _q4_1_product

_KINDS = ("w_qkv", "w_out", "w_gate_up", "w_down")


@dataclass(frozen=True)
class StackedLayers:
    """Every block's weights of one kind in one array, layer first."""

    attn_norm: np.ndarray  # [L, d] float32
    ffn_norm: np.ndarray  # [L, d] float32
    quants: tuple[np.ndarray, ...]  # per kind [L, chunks, blocks, 16, LANES] uint8
    scales: tuple[np.ndarray, ...]  # per kind [L, chunks, blocks, 2, LANES] uint16
    n_out: tuple[int, ...]  # per kind: the matrix's rows (the last chunk may be padded)

    @classmethod
    def build(cls, layers) -> tuple["StackedLayers", tuple] | None:
        """(the stack, the layers rebuilt as views into it), or None when some block
        matrix is not Q4_1. The views keep a single copy of the weights in memory."""
        if not layers or not all(
            isinstance(getattr(lw, k), QuantizedMatrix) and getattr(lw, k).type_name == "Q4_1"
            for lw in layers for k in _KINDS
        ):
            return None
        quants = tuple(np.stack([getattr(lw, k).quants for lw in layers]) for k in _KINDS)
        scales = tuple(np.stack([getattr(lw, k).scales for lw in layers]) for k in _KINDS)
        stack = cls(
            attn_norm=np.stack([lw.attn_norm for lw in layers]).astype(np.float32),
            ffn_norm=np.stack([lw.ffn_norm for lw in layers]).astype(np.float32),
            quants=quants,
            scales=scales,
            n_out=tuple(getattr(layers[0], k).shape[0] for k in _KINDS),
        )
        views = tuple(
            replace(lw, attn_norm=stack.attn_norm[i], ffn_norm=stack.ffn_norm[i], **{
                k: QuantizedMatrix("Q4_1", getattr(lw, k).shape, quants[j][i], scales[j][i])
                for j, k in enumerate(_KINDS)
            })
            for i, lw in enumerate(layers)
        )
        return stack, views

    def run(self, x: np.ndarray, positions: np.ndarray, start: int, visible: np.ndarray, cache,
            rope_cos: np.ndarray, rope_sin: np.ndarray, n_heads: int, d_ffn: int, eps: float) -> np.ndarray:
        """x [n, d] embeddings of one segment at `positions` (its rows' slots are
        start..start+n-1) -> the last block's output [n, d]; writes the segment's keys
        and values into `cache` (a model.KVCache)."""
        hd = cache.all_keys.shape[2]
        return _run(x, positions, start, visible, self.attn_norm, self.ffn_norm,
                    *(a for pair in zip(self.quants, self.scales) for a in pair),
                    rope_cos, rope_sin, cache.all_keys, cache.all_values,
                    n_heads, self.n_out[0], d_ffn, float(eps), np.float32(1.0 / np.sqrt(hd)),
                    config.NUMBA_NUM_THREADS)


@njit(inline="always")
def _product(x, quants, scales, n_out, n_threads):  # pragma: no cover - compiled
    """qkernels.qmatmul_t for a Q4_1 matrix, from inside numba."""
    out = np.empty((x.shape[0], quants.shape[0] * LANES), dtype=np.float32)
    _q4_1_product(x, quants, scales, out, n_threads)
    if out.shape[1] == n_out:
        return out
    return np.ascontiguousarray(out[:, :n_out])


@njit(inline="always")
def _heads(qkv, first, n_heads, hd):  # pragma: no cover - compiled
    """Columns first.. of qkv [n, *] as [n, n_heads, hd], contiguous."""
    n = qkv.shape[0]
    out = np.empty((n, n_heads, hd), dtype=np.float32)
    for r in range(n):
        for h in range(n_heads):
            for i in range(hd):
                out[r, h, i] = qkv[r, first + h * hd + i]
    return out


_Q = "uint8[:, :, :, :, ::1], uint16[:, :, :, :, ::1]"
_SIG = ("float32[:, ::1](float32[:, ::1], int64[::1], int64, boolean[:, ::1], float32[:, ::1], float32[:, ::1], "
        f"{_Q}, {_Q}, {_Q}, {_Q}, float32[:, ::1], float32[:, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], "
        "int64, int64, int64, float64, float32, int64)")


# No fastmath: the only arithmetic of its own is the residual additions, which must
# round as numpy's do in the Python loop.
@njit(_SIG, cache=True, nogil=True)
def _run(x, positions, start, visible, attn_norm, ffn_norm, qkv_q, qkv_s, out_q, out_s, gu_q, gu_s,
         down_q, down_s, cos, sin, keys, values, n_heads, n_qkv, d_ffn, eps, scale,
         n_threads):  # pragma: no cover - compiled
    n, d = x.shape
    n_kv, hd = keys.shape[1], keys.shape[2]
    for layer in range(qkv_q.shape[0]):
        h = fused.rms_norm(x, attn_norm[layer], eps)
        qkv = _product(h, qkv_q[layer], qkv_s[layer], n_qkv, n_threads)
        q = fused.rope(_heads(qkv, 0, n_heads, hd), cos, sin, positions)
        k = fused.rope(_heads(qkv, n_heads * hd, n_kv, hd), cos, sin, positions)
        v_first = (n_heads + n_kv) * hd
        for r in range(n):
            for kv in range(n_kv):
                for i in range(hd):
                    keys[layer, kv, i, start + r] = k[r, kv, i]
                    values[layer, kv, start + r, i] = qkv[r, v_first + kv * hd + i]
        attn = fused.attend(q, keys[layer], values[layer], start, visible, scale)
        y = _product(attn, out_q[layer], out_s[layer], d, n_threads)
        x = x + y
        h = fused.rms_norm(x, ffn_norm[layer], eps)
        gate_up = _product(h, gu_q[layer], gu_s[layer], 2 * d_ffn, n_threads)
        y = _product(fused.silu_gate(gate_up, d_ffn), down_q[layer], down_s[layer], d, n_threads)
        x = x + y
    return x
