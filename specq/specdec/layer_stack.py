"""All the transformer blocks of a forward in one compiled call.

`LlamaModel.forward`'s layer loop (`_blocks`) makes about 20 Python-level calls a
block (norms, products, RoPE, cache writes, attention, residual adds), 600 a step
for the default model's 30 blocks, plus a few per segment and block in a batched
round, each paying numpy's or numba's dispatch. Here the same loop runs inside
numba and calls the very same compiled functions (block_ops.*, qkernels' Q4_1 product),
so a row gets exactly the bits the Python loop gives it, and plain decoding,
verification and batched rounds still agree bit for bit. Measured in one process on
the 2-core AMD EPYC at context 200: a 1-row step 1.2x to 1.25x faster, a decode
round of 8 requests 1.18x.

It serves llama blocks (not qwen's or Gemma's: beyond_llama, and the model) whose
four block matrices are all Q4_1 (the default model's; the output head and embedding
may be anything), stacked here into one array per kind, and forwards whose segments
are all shorter than matmul.BULK_ROWS (a prompt that long takes BLAS, in the Python
loop). int8_stack serves the integer precisions the same way.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields, replace

import numpy as np
from numba import config, njit, types
from numba.typed import List

from specq.specdec import block_ops
from specq.specdec.qkernels import LANES, QuantizedMatrix, q4_1_product

KINDS = ("w_qkv", "w_out", "w_gate_up", "w_down")


def beyond_llama(lw) -> bool:
    """A block the compiled loop does not compute: biases (qwen2), q/k norms (qwen3,
    gemma3), or heads whose width is not d_model / n_heads. (Gemma's blocks are kept
    out by the model, which knows their architecture.)"""
    return lw.b_qkv is not None or lw.q_norm is not None or lw.w_out.shape[0] != lw.w_out.shape[1]


@dataclass(frozen=True)
class StackedLayers:
    """Every block's weights of one kind in one array, layer first, and the compiled
    functions that run the blocks on them (this module's, or int8_stack's)."""

    attn_norm: np.ndarray  # [L, d] float32
    ffn_norm: np.ndarray  # [L, d] float32
    arrays: tuple[np.ndarray, ...]  # per kind, the arrays its product reads, [L, ...] each
    n_out: tuple[int, ...]  # per kind: the matrix's rows
    compiled: tuple  # (for several segments, for one): _run and _run_one, or int8_stack's
    extra: tuple = ()  # arguments after the sizes (int8_stack: whether activations are split)

    def __reduce__(self) -> tuple:
        """Pickled (model_cache) with its compiled functions named, not serialized:
        they are code of this process, not data."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["compiled"] = tuple((fn.py_func.__module__, fn.py_func.__name__) for fn in self.compiled)
        return (_rebuild, (state,))

    @classmethod
    def build(cls, layers) -> tuple[StackedLayers, tuple] | None:
        """(the stack, the layers rebuilt as views into it), or None when some block
        matrix is not Q4_1. The views keep a single copy of the weights in memory."""
        if not layers or any(beyond_llama(lw) for lw in layers):
            return None  # the compiled loop is llama's block: others run one call at a time
        if not all(
            isinstance(getattr(lw, k), QuantizedMatrix) and getattr(lw, k).type_name == "Q4_1"
            for lw in layers
            for k in KINDS
        ):
            return None
        quants = tuple(np.stack([getattr(lw, k).quants for lw in layers]) for k in KINDS)
        scales = tuple(np.stack([getattr(lw, k).scales for lw in layers]) for k in KINDS)
        stack = cls.of(layers, tuple(a for pair in zip(quants, scales) for a in pair), (_run, _run_one))
        views = tuple(
            replace(
                lw,
                attn_norm=stack.attn_norm[i],
                ffn_norm=stack.ffn_norm[i],
                **{
                    k: QuantizedMatrix("Q4_1", getattr(lw, k).shape, quants[j][i], scales[j][i])
                    for j, k in enumerate(KINDS)
                },
            )
            for i, lw in enumerate(layers)
        )
        return stack, views

    @classmethod
    def of(cls, layers, arrays: tuple, compiled: tuple, extra: tuple = ()) -> StackedLayers:
        return cls(
            attn_norm=np.stack([lw.attn_norm for lw in layers]).astype(np.float32),
            ffn_norm=np.stack([lw.ffn_norm for lw in layers]).astype(np.float32),
            arrays=arrays,
            n_out=tuple(getattr(layers[0], k).shape[0] for k in KINDS),
            compiled=compiled,
            extra=extra,
        )

    def run(
        self,
        x: np.ndarray,
        segments,
        positions: np.ndarray,
        rope_cos: np.ndarray,
        rope_sin: np.ndarray,
        n_heads: int,
        d_ffn: int,
        eps: float,
    ) -> np.ndarray:
        """x [rows, d]: the embeddings of the segments' rows (model.Segment, each
        shorter than matmul.BULK_ROWS, its own cache), at `positions` -> the last
        block's output [rows, d]. Writes each segment's keys and values into its
        cache. The products take every segment's rows together, attention runs
        segment by segment."""
        starts = np.array([seg.start for seg in segments], dtype=np.int64)
        bounds = np.cumsum([0] + [seg.n for seg in segments]).astype(np.int64)
        hd = segments[0].cache.kernel_values.shape[3]
        # The weights, RoPE's tables and the sizes go in as three tuples, so that the
        # compiled functions' signatures name three structures, not twenty values.
        weights = (self.attn_norm, self.ffn_norm, *self.arrays)
        sizes = (
            n_heads,
            self.n_out[0],
            d_ffn,
            float(eps),
            np.float32(1.0 / np.sqrt(hd)),
            config.NUMBA_NUM_THREADS,
            *self.extra,
        )
        run_many, run_one = self.compiled
        rope = (rope_cos, rope_sin)
        if len(segments) == 1:
            # A typed list built from Python costs tens of microseconds an element
            # (measured 190 us for the three of a step, 2% of it); a single
            # sequence's are built inside numba instead.
            seg = segments[0]
            keys, values = seg.cache.kernel_keys, seg.cache.kernel_values
            return run_one(x, positions, starts, bounds, seg.visible(), weights, rope, keys, values, sizes)
        first = segments[0].cache
        keys = List.empty_list(CACHE_TYPES[first.kernel_keys.dtype.name])
        values = List.empty_list(CACHE_TYPES[first.kernel_values.dtype.name])
        visible = List.empty_list(VISIBLE)
        for seg in segments:
            keys.append(seg.cache.kernel_keys)
            values.append(seg.cache.kernel_values)
            visible.append(seg.visible())
        return run_many(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes)


@njit(inline="always")
def _product(x, quants, scales, n_out, n_threads):  # pragma: no cover - compiled
    """qkernels.qmatmul_t for a Q4_1 matrix, from inside numba."""
    out = np.empty((x.shape[0], quants.shape[0] * LANES), dtype=np.float32)
    q4_1_product(x, quants, scales, out, n_threads)
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


CACHE = types.float32[:, :, :, ::1]  # KVCache.kernel_keys / kernel_values
HALF_CACHE = types.uint16[:, :, :, ::1]  # the same, float16 bits (the integer precisions)
INT8_CACHE = types.int8[:, :, :, ::1]  # the same, 8-bit (int8 values and their scales)
CACHE_TYPES = {"float32": CACHE, "uint16": HALF_CACHE, "int8": INT8_CACHE}  # by the kernel arrays' dtype


def _rebuild(state: dict) -> StackedLayers:
    """A pickled stack (see StackedLayers.__reduce__), its functions found by name
    in specq's own modules."""
    compiled = []
    for module, name in state["compiled"]:
        if not module.startswith("specq.specdec."):
            raise ValueError(f"a layer stack names {module}.{name}, not one of specq's compiled functions")
        compiled.append(getattr(importlib.import_module(module), name))
    return StackedLayers(**{**state, "compiled": tuple(compiled)})


VISIBLE = types.boolean[:, ::1]
# The loops (_run, _run_one, and int8_stack's) take x [rows, d] float32; positions,
# starts and bounds int64; the segments' visible masks and caches (typed lists, or
# one of each); weights: the norms [L, d], then each kind's quants and scales; rope:
# (cos, sin); sizes: n_heads, the q|k|v product's width, d_ffn, the RMSNorm epsilon
# (float64), attention's scale (float32), the threads, then the stack's extras. They
# compile for the types of their first call, not for every cache at import: a
# precision uses one cache type (docs/operations.md).


@njit(inline="always")
def attention(
    x, qkv, positions, starts, bounds, visible, cos, sin, keys, values, layer, n_heads, scale
):  # pragma: no cover - compiled
    """The attention of one block, from its q|k|v product [rows, *]: RoPE, the keys and
    values written into each segment's cache, then every segment's attention in one
    parallel loop (block_ops.attend_many's docstring). [rows, n_heads * hd]."""
    n_kv, hd = values[0].shape[1], values[0].shape[3]
    v_first = (n_heads + n_kv) * hd
    q = block_ops.rope(_heads(qkv, 0, n_heads, hd), cos, sin, positions)
    k = block_ops.rope(_heads(qkv, n_heads * hd, n_kv, hd), cos, sin, positions)
    for s in range(starts.shape[0]):
        lo, hi, start = bounds[s], bounds[s + 1], starts[s]
        cache_k, cache_v = keys[s][layer], values[s][layer]
        for r in range(lo, hi):
            for kv in range(n_kv):
                v = qkv[r, v_first + kv * hd : v_first + (kv + 1) * hd]
                block_ops.store_position(cache_k, cache_v, kv, start + r - lo, k[r, kv], v)
        block_ops.freeze_stored(cache_k, cache_v, start, hi - lo, hd)
    return block_ops.attend_many(q, starts, bounds, visible, keys, values, layer, scale)


@njit(inline="always")
def one(item):  # pragma: no cover - compiled
    """A typed list of one item, built inside numba."""
    items = List()
    items.append(item)
    return items


# No fastmath: the only arithmetic of its own is the residual additions, which must
# round as numpy's do in the Python loop.
@njit(cache=True, nogil=True)
def _run(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):  # pragma: no cover - compiled
    attn_norm, ffn_norm, qkv_q, qkv_s, out_q, out_s, gu_q, gu_s, down_q, down_s = weights
    cos, sin = rope
    n_heads, n_qkv, d_ffn, eps, scale, n_threads = sizes
    d = x.shape[1]
    for layer in range(qkv_q.shape[0]):
        h = block_ops.rms_norm(x, attn_norm[layer], eps)
        qkv = _product(h, qkv_q[layer], qkv_s[layer], n_qkv, n_threads)
        attn = attention(x, qkv, positions, starts, bounds, visible, cos, sin, keys, values, layer, n_heads, scale)
        y = _product(attn, out_q[layer], out_s[layer], d, n_threads)
        x = x + y
        h = block_ops.rms_norm(x, ffn_norm[layer], eps)
        gate_up = _product(h, gu_q[layer], gu_s[layer], 2 * d_ffn, n_threads)
        y = _product(block_ops.silu_gate(gate_up, d_ffn), down_q[layer], down_s[layer], d, n_threads)
        x = x + y
    return x


@njit(cache=True, nogil=True)
def _run_one(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):  # pragma: no cover - compiled
    """_run for one segment, its lists built here rather than from Python."""
    return _run(x, positions, starts, bounds, one(visible), weights, rope, one(keys), one(values), sizes)
