"""A LLaMA-architecture transformer in numpy, loaded from a GGUF file.

The forward takes *segments*: each is one sequence's new tokens with its own KV
cache. Rows of all segments share the dense matrix products (the batched
verification pass); attention runs per segment against that segment's cache.
The cache is written by position, so rolling back rejected draft tokens costs
nothing: the next forward simply overwrites those slots.

Weight matrices stay in the file's types where a kernel reads them: Q4_1 and Q8_0
(the default model's) as qkernels.QuantizedMatrix at the f32 precision, every type
with integer blocks as int8.Int8Matrix at int16 and int8 (unpacked without loss by
gguf_blocks), F16 and BF16 as half.HalfMatrix: a decode step is bound by streaming
the weights, and these are 2 to 6 times fewer bytes than float32. The rest (F32,
Q2_K, and the K-quants and Q5_1 at f32) are float32. specq.specdec.matmul picks the
kernel for each product and row.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from specq.errors import ModelFileError, ParameterError
from specq.specdec import block_ops, gguf_blocks
from specq.specdec.gguf_blocks import BlockMatrix
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.half import TYPES as HALF_TYPES
from specq.specdec.half import HalfMatrix
from specq.specdec.head_screen import SCREEN_ROWS, HeadChoice, ScreenedHead
from specq.specdec.layer_stack import StackedLayers
from specq.specdec.matmul import BULK_ROWS, RowPlan, Weight, dequantized, embed, linear, n_values
from specq.specdec.model_config import GEMMA3_LOCAL_BASE, LlamaConfig
from specq.specdec.precision import INTEGER, PRECISIONS
from specq.specdec.qkernels import TYPES as QUANTIZED_TYPES
from specq.specdec.qkernels import QuantizedMatrix

# Query rows per block of a prompt's attention: 32 to 256 measured, 64 the fastest
# from 100 to 2,000 rows on the 2-core AMD EPYC.
_ATTENTION_BLOCK = 64
# At the integer precisions a segment shorter than this runs in the compiled stack,
# prompts too: their products are the int8 kernels either way, and the stack's
# attention on numba's threads beat BLAS's blocks on one thread from 50 to 2,000
# rows (a prefill 1.06x to 1.18x faster from 100 to 1,000 tokens). From about 1,000
# rows BLAS's blocks shared by two threads (_attention_workers) are as fast or
# faster, so longer prompts take those.
_INTEGER_STACK_ROWS = 1024
# Where pieces of a prompt give the bits of the whole (the integer precisions' stack),
# the engine prefills in pieces of at most this many rows, a round's worth. On a
# 2-core AMD EPYC (Zen 4), int16, 31 requests decoding while a 2,000-token prompt
# joined (scripts/bench_stall.py): the longest round 463 ms in pieces of 256 against
# 3,082 ms whole, 264 ms at 128 and 861 ms at 512, with about the same work done a
# second (the prompt's time to first token 2.96 s, 3.25 s at 128). A prompt alone
# prefilled about as fast in pieces as whole, 0.85x to 1.27x over runs from 400 to
# 4,000 tokens (scripts/bench_prefill.py --pieces); 256 keeps most prompts whole.
PREFILL_PIECE_ROWS = 256
# The KV cache each precision keeps (KVCache), as (keys, values): f32's is float32
# (HuggingFace parity); the integer precisions' smaller ones, whose quality and speed
# docs/performance.md measures. int16's values are 8-bit and its keys float16: a
# decode round of 32 or 64 sequences reads its cache at the memory's rate, and 8-bit
# values made it 1.05x (context 200) to 1.08x (500) faster at a mean KL to f32 of
# 6e-5 nats; 8-bit keys cost far more quality (98.2% to 98.5% top-1 agreement with
# f32, against 99.6% here).
KV_TYPES = {"f32": (np.float32, np.float32), "int16": (np.float16, np.int8), "int8": (np.int8, np.int8)}


def cache_types(dtype: type | tuple) -> tuple[np.dtype, np.dtype]:
    """A cache's (key, value) types from one type for both or a pair."""
    keys, values = dtype if isinstance(dtype, tuple) else (dtype, dtype)
    return np.dtype(keys), np.dtype(values)


def _kernel_type(dtype: np.dtype) -> np.dtype:
    """The type the compiled kernels see a cache array as: float16 as its uint16 bits."""
    return np.dtype(np.uint16) if dtype == np.float16 else dtype


@dataclass(frozen=True)
class LayerWeights:
    """One block's weights in GGUF's (n_out, n_in) layout: products are x @ w.T
    (specq.specdec.matmul), which suits every kernel."""

    attn_norm: np.ndarray  # [d]
    w_qkv: Weight  # [(Hq + 2 Hkv) * hd, d]: q, k, v projections fused into one product
    w_out: Weight  # [d, Hq * hd]
    ffn_norm: np.ndarray  # [d]
    w_gate_up: Weight  # [2 * ffn, d]: gate and up fused into one product
    w_down: Weight  # [d, ffn]
    b_qkv: np.ndarray | None = None  # [(Hq + 2 Hkv) * hd]: qwen2's q, k and v biases
    q_norm: np.ndarray | None = None  # [hd]: qwen3's RMSNorm of each head's q, before RoPE
    k_norm: np.ndarray | None = None  # [hd]: ... and of each head's k
    post_attn_norm: np.ndarray | None = None  # [d]: gemma2/3's RMSNorm of the attention's output
    post_ffn_norm: np.ndarray | None = None  # [d]: ... and of the feed-forward's


@dataclass(frozen=True)
class LlamaWeights:
    token_embedding: Weight  # [vocab, d]
    layers: tuple[LayerWeights, ...]
    output_norm: np.ndarray  # [d]
    w_output: Weight  # [vocab, d]; the embedding itself when tied (no copy)
    # [hd/2]: Llama 3.1's RoPE frequency factors (rope_freqs.weight), dividing each
    # pair's frequency; None without them.
    rope_factors: np.ndarray | None = None

    def dequantized(self) -> LlamaWeights:
        """The same model with every matrix in float32 (the reference for the
        quantized products; about 4 to 6 times the memory)."""
        return self.mapped(dequantized)

    def mapped(self, fn: Callable[[Weight], Weight]) -> LlamaWeights:
        """fn applied to every matrix; a tied output head stays tied."""
        embedding = fn(self.token_embedding)
        layers = tuple(
            replace(lw, **{k: fn(getattr(lw, k)) for k in ("w_qkv", "w_out", "w_gate_up", "w_down")})
            for lw in self.layers
        )
        output = embedding if self.w_output is self.token_embedding else fn(self.w_output)
        return replace(self, token_embedding=embedding, layers=layers, w_output=output)


def _as_blocks(w: QuantizedMatrix | BlockMatrix) -> BlockMatrix:
    if isinstance(w, BlockMatrix):
        return w
    return gguf_blocks.unpack(w.type_name, w.to_gguf_bytes(), w.shape)


def _blocks_weight(bm: BlockMatrix) -> QuantizedMatrix | BlockMatrix:
    """An unpacked matrix as the f32 precision's kernels can take it too, where its
    values are exactly a Q4_1 or Q8_0 tensor's (Q4_0, Q5_0); else as it is."""
    encoded = gguf_blocks.as_gguf_bytes(bm)
    if encoded is None:
        return bm
    return QuantizedMatrix.from_gguf_bytes(encoded[1], encoded[0], bm.shape)


def halves_to_pairs(n_heads: int, head_dim: int) -> np.ndarray:
    """Row order that makes RoPE over halves (x[i], x[i + hd/2]) RoPE over adjacent
    pairs (x[2i], x[2i+1]), per head: rows 0, hd/2, 1, hd/2 + 1, ... Applied to both
    q and k, it leaves every attention score unchanged (the same permutation on both
    sides of each dot product), as llama.cpp's converter does for llama files."""
    half = head_dim // 2
    within = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)  # [hd]
    return (np.arange(n_heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def load_weights(f: GGUFFile, cfg: LlamaConfig) -> LlamaWeights:
    def matrix(name: str, n_out: int, n_in: int, rows: np.ndarray | None = None) -> Weight:
        info = f.tensor_info(name)
        if info.shape != (n_out, n_in):
            raise ModelFileError(f"tensor {name!r} has shape {info.shape}, expected {(n_out, n_in)}")
        if info.type_name in QUANTIZED_TYPES or info.type_name in gguf_blocks.FORMAT_OF:
            # Kept as blocks: the products read them.
            raw = f.raw_tensor(name)
            data = raw.data if rows is None else raw.data[rows]  # rows of blocks are independent
            if info.type_name in QUANTIZED_TYPES:
                return QuantizedMatrix.from_gguf_bytes(data, raw.type_name, raw.shape)
            return _blocks_weight(gguf_blocks.unpack(info.type_name, data, (n_out, n_in)))
        if info.type_name in HALF_TYPES:  # kept in their 2 bytes
            raw = f.raw_tensor(name)
            return HalfMatrix.from_gguf_bytes(raw.data if rows is None else raw.data[rows], raw.type_name, raw.shape)
        full = f.tensor(name)  # [n_out, n_in] float32
        return np.ascontiguousarray(full if rows is None else full[rows])

    def fused(parts: list[Weight]) -> Weight:
        """Rows stacked into one matrix: one product instead of several. Quantized
        parts stay quantized, in a format that holds them all (gguf_blocks) where
        their types differ; other mixes are stacked in float32."""
        if all(isinstance(p, QuantizedMatrix) and p.type_name == parts[0].type_name for p in parts):
            return QuantizedMatrix.concat(parts)
        if all(isinstance(p, HalfMatrix) and p.type_name == parts[0].type_name for p in parts):
            return HalfMatrix.concat(parts)
        if all(isinstance(p, (QuantizedMatrix, BlockMatrix)) for p in parts):
            return _blocks_weight(BlockMatrix.concat([_as_blocks(p) for p in parts]))
        return np.concatenate([dequantized(p) for p in parts], axis=0)

    def vector(name: str, n: int, rows: np.ndarray | None = None) -> np.ndarray:
        v = f.tensor(name).reshape(-1)
        if v.shape != (n,):
            raise ModelFileError(f"tensor {name!r} has shape {v.shape}, expected {(n,)}")
        return v if rows is None else v[rows]

    d, hd = cfg.d_model, cfg.head_dim
    q_rows = halves_to_pairs(cfg.n_heads, hd) if cfg.rope_halves else None
    within = halves_to_pairs(1, hd) if cfg.rope_halves else None  # the same order inside one head
    k_rows = halves_to_pairs(cfg.n_kv_heads, hd) if cfg.rope_halves else None
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        wq = matrix(p + "attn_q.weight", cfg.n_heads * hd, d, q_rows)
        wk = matrix(p + "attn_k.weight", cfg.n_kv_heads * hd, d, k_rows)
        wv = matrix(p + "attn_v.weight", cfg.n_kv_heads * hd, d)
        b_qkv = None
        if cfg.qkv_bias:
            b_qkv = np.concatenate(
                [
                    vector(p + "attn_q.bias", cfg.n_heads * hd, q_rows),
                    vector(p + "attn_k.bias", cfg.n_kv_heads * hd, k_rows),
                    vector(p + "attn_v.bias", cfg.n_kv_heads * hd),
                ]
            )
        gate = matrix(p + "ffn_gate.weight", cfg.d_ffn, d)
        up = matrix(p + "ffn_up.weight", cfg.d_ffn, d)
        layers.append(
            LayerWeights(
                attn_norm=vector(p + "attn_norm.weight", d),
                w_qkv=fused([wq, wk, wv]),
                w_out=matrix(p + "attn_output.weight", d, cfg.n_heads * hd),
                ffn_norm=vector(p + "ffn_norm.weight", d),
                w_gate_up=fused([gate, up]),
                w_down=matrix(p + "ffn_down.weight", d, cfg.d_ffn),
                b_qkv=b_qkv,
                q_norm=vector(p + "attn_q_norm.weight", hd, within) if cfg.qk_norm else None,
                k_norm=vector(p + "attn_k_norm.weight", hd, within) if cfg.qk_norm else None,
                post_attn_norm=vector(p + "post_attention_norm.weight", d) if cfg.post_norms else None,
                post_ffn_norm=vector(p + "post_ffw_norm.weight", d) if cfg.post_norms else None,
            )
        )
    embedding = matrix("token_embd.weight", cfg.vocab_size, d)
    output = matrix("output.weight", cfg.vocab_size, d) if f.has_tensor("output.weight") else embedding
    factors = vector("rope_freqs.weight", hd // 2) if f.has_tensor("rope_freqs.weight") else None
    if factors is not None and not np.all(factors > 0):
        raise ModelFileError(f"rope_freqs.weight in {f.path} holds a factor that is not positive")
    return LlamaWeights(
        token_embedding=embedding,
        layers=tuple(layers),
        output_norm=vector("output_norm.weight", d),
        w_output=output,
        rope_factors=factors,
    )


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@functools.cache
def _attention_pool(pid: int, threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="specq-attention")


def _attention_workers() -> ThreadPoolExecutor | None:
    """Threads for a prompt's attention at the integer precisions, as many as
    numba's products use (none with one): there BLAS runs on one thread, so that
    its pool and numba's do not spin against each other, and the attention's
    blocks of rows would otherwise take one core. One pool a process: a forked
    worker gets its own."""
    from numba import config

    threads = config.NUMBA_NUM_THREADS
    return _attention_pool(os.getpid(), threads) if threads > 1 else None


def _blas_threads(n: int):
    """A context in which BLAS uses at most n threads (7 us to enter and leave)."""
    return _blas_controller().limit(limits=n, user_api="blas")


def _for_int8(weights: LlamaWeights, split: bool) -> LlamaWeights:
    """The weights with every quantized matrix in the int8 kernels' layout (split:
    their products take activations as two int8 halves, the int16 precision). The
    embedding keeps its blocks for lookups; tied to the output head, the head gets
    its own int8 copy (the one extra matrix in memory)."""
    from specq.specdec import int8

    int8.require()

    def convert(w: Weight) -> Weight:
        if isinstance(w, QuantizedMatrix) and w.type_name in int8.TYPES:
            return int8.Int8Matrix.from_quantized(w, split=split)
        if isinstance(w, BlockMatrix):
            return int8.Int8Matrix.from_blocks(w.type_name, w.shape, w.ints, w.d, w.m, split=split)
        return w

    layers = tuple(
        replace(lw, **{k: convert(getattr(lw, k)) for k in ("w_qkv", "w_out", "w_gate_up", "w_down")})
        for lw in weights.layers
    )
    return replace(weights, layers=layers, w_output=convert(weights.w_output))


def _has_blocks(weights: LlamaWeights) -> bool:
    layers = (getattr(lw, k) for lw in weights.layers for k in ("w_qkv", "w_out", "w_gate_up", "w_down"))
    return any(isinstance(w, BlockMatrix) for w in (weights.token_embedding, weights.w_output, *layers))


def _without_blocks(weights: LlamaWeights) -> LlamaWeights:
    """The weights with every unpacked K-quant (or Q5_1) matrix in float32: the f32
    precision's kernels take fp16 block scales only."""
    return weights.mapped(lambda w: w.dequantize() if isinstance(w, BlockMatrix) else w)


class KVCache:
    """Keys and values of one sequence, indexed by position; grows on demand. All
    layers live in one array each (`all_keys`, `all_values`), so the compiled layer
    stack (specq.specdec.layer_stack) takes a whole cache as two arguments; `keys`
    and `values` are per-layer views of them.

    Values are [L, Hkv, capacity, hd]. Keys are in blocks of block_ops.KEY_BLOCK (8)
    positions, [L, Hkv, capacity / 8, rows * 8]: a block holds dimension 0 of its
    eight positions, then dimension 1, ..., so that attention's scores take eight
    positions as the lanes of one vector, and storing one position touches a fraction
    of the cache lines that keys with positions last made it touch
    (block_ops.KEY_BLOCK's comment has the measurement). `stored` gives them by
    position.

    Keys and values are each float32, float16 or 8-bit (`dtype`: one type for both,
    or a (keys, values) pair; KV_TYPES): attention over many long sequences is
    bound by reading the cache (docs/performance.md), and each halves the bytes of
    the one before. Every path stores a key or value through one compiled function
    (block_ops.write_kv, store_position), so the bits of a row still never depend on
    the path. The kernels take float16 as its uint16 bits (`kernel_keys`,
    `kernel_values`): numba has no float16 arrays.

    8-bit keys or values hold each position's key or value of each kv head as int8
    with a float32 scale (the largest magnitude maps to 127). With 8-bit values a
    block of keys ends in 64 more bytes (block_ops.SCALE_BYTES): its eight
    positions' key scales (unused for float keys), then their value scales, so that
    attention reads a block's scales with one load and the scales move and grow
    with their keys.

    With float16 keys and 8-bit values (int16's cache) and a head width a multiple
    of block_ops.FROZEN_WIDTH, each kv head's values have more rows after its
    `capacity` positions: block_ops.frozen_block_rows(hd) for each FROZEN_BLOCK
    positions, the frozen keys and a copy of their value scales
    (block_ops.freeze_block; 18 hd / 16 bytes a position at hd 64), which long rows
    read in place of the float16 keys and the scales among them
    (block_ops.frozen_area)."""

    def __init__(self, cfg: LlamaConfig, capacity: int = 256, dtype: type | tuple = np.float32) -> None:
        self._cfg = cfg
        self.key_dtype, self.value_dtype = cache_types(dtype)
        self.capacity = 0
        self._rows = self.rows_per_block(cfg.head_dim, self.key_dtype, self.value_dtype)
        self.frozen = self.keeps_frozen(cfg.head_dim, self.key_dtype, self.value_dtype)
        self._set(*self._arrays(0), 0)
        self.reserve(min(capacity, cfg.context_length))

    @staticmethod
    def keeps_frozen(head_dim: int, key_dtype: np.dtype, value_dtype: np.dtype) -> bool:
        """Whether a cache keeps frozen 8-bit keys beside its float16 ones: float16
        keys, 8-bit values and a head width a multiple of FROZEN_WIDTH. Never the CPU:
        a request resumed on another machine must read the same keys (the integer
        sums are exact with VNNI or without, block_ops._PAIRED)."""
        return key_dtype == np.float16 and value_dtype == np.int8 and head_dim % block_ops.FROZEN_WIDTH == 0

    @property
    def scaled(self) -> bool:
        """Whether the cache keeps scales (its values are 8-bit)."""
        return self.value_dtype == np.int8

    @staticmethod
    def rows_per_block(head_dim: int, key_dtype: np.dtype, value_dtype: np.dtype) -> int:
        """A block of keys' rows of KEY_BLOCK elements: the head dimension's, and with
        8-bit values the scales' bytes."""
        if key_dtype == np.int8 and value_dtype != np.int8:
            raise ValueError("8-bit keys need 8-bit values (their scales share the block)")
        scales = block_ops.SCALE_BYTES // (block_ops.KEY_BLOCK * key_dtype.itemsize) if value_dtype == np.int8 else 0
        return head_dim + scales

    @staticmethod
    def capacity_for(n_positions: int) -> int:
        """The capacity a cache takes to hold n_positions: whole blocks of keys."""
        return -(-n_positions // block_ops.KEY_BLOCK) * block_ops.KEY_BLOCK

    @staticmethod
    def bytes_per_position(cfg: LlamaConfig, dtype: type | tuple) -> int:
        """What one position of a sequence's cache of `dtype` takes, every layer's."""
        keys, values = cache_types(dtype)
        key_rows = KVCache.rows_per_block(cfg.head_dim, keys, values)
        per_head = key_rows * keys.itemsize + cfg.head_dim * values.itemsize
        if KVCache.keeps_frozen(cfg.head_dim, keys, values):
            per_head += -(-cfg.head_dim * block_ops.frozen_block_rows(cfg.head_dim) // block_ops.FROZEN_BLOCK)
        return cfg.n_layers * cfg.n_kv_heads * per_head

    def _arrays(self, capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """Zeroed keys and values for `capacity` positions (a multiple of KEY_BLOCK),
        with room for the frozen keys where the cache keeps them."""
        cfg, block = self._cfg, block_ops.KEY_BLOCK
        rows = capacity + (block_ops.frozen_rows(capacity, cfg.head_dim) if self.frozen else 0)
        return (
            np.zeros((cfg.n_layers, cfg.n_kv_heads, capacity // block, self._rows * block), dtype=self.key_dtype),
            np.zeros((cfg.n_layers, cfg.n_kv_heads, rows, cfg.head_dim), dtype=self.value_dtype),
        )

    def _set(self, keys: np.ndarray, values: np.ndarray, capacity: int) -> None:
        self.all_keys, self.all_values, self.capacity = keys, values, capacity
        self.keys: list[np.ndarray] = list(keys)  # per layer [Hkv, capacity / 8, rows * 8]
        self.values: list[np.ndarray] = list(values)  # per layer [Hkv, capacity (+ frozen rows), hd]
        self.kernel_keys, self.kernel_values = (
            keys.view(_kernel_type(keys.dtype)),
            values.view(_kernel_type(values.dtype)),
        )

    def _blocks(self, keys: np.ndarray | None = None) -> np.ndarray:
        """`keys` (all_keys by default) as [..., blocks, rows, 8]: a view."""
        keys = self.all_keys if keys is None else keys
        return keys.reshape(*keys.shape[:-1], self._rows, block_ops.KEY_BLOCK)

    def _scales(self, keys: np.ndarray | None = None) -> np.ndarray:
        """The scales of 8-bit values (and keys) as [L, Hkv, blocks, 2, 8] float32
        (key scales at [..., 0, j], value scales at [..., 1, j] for a block's
        position j): a view."""
        keys = self.all_keys if keys is None else keys
        at = self._cfg.head_dim * block_ops.KEY_BLOCK
        tail = keys[..., at : at + block_ops.SCALE_BYTES // keys.itemsize]
        return tail.view(np.float32).reshape(*keys.shape[:-1], 2, block_ops.KEY_BLOCK)

    def stored(self, end: int) -> tuple[np.ndarray, ...]:
        """What is stored for positions below `end`, by position: keys [L, Hkv, hd,
        end] and values [L, Hkv, end, hd] (the kernels' dtype), with 8-bit values the
        scales [L, Hkv, 2, end] (keys', then values'), and where it keeps frozen keys
        those of the whole blocks below `end` as bytes [L, Hkv, blocks, bytes]."""
        hd = self._cfg.head_dim
        blocks = self._blocks(self.kernel_keys)[..., :hd, :]  # [L, Hkv, blocks, hd, 8]
        keys = np.moveaxis(blocks, -2, -3).reshape(*blocks.shape[:2], hd, -1)[..., :end]
        parts = [keys, self.kernel_values[:, :, :end]]
        if self.scaled:
            parts.append(np.moveaxis(self._scales(), -2, -3).reshape(*blocks.shape[:2], 2, -1)[..., :end])
        if self.frozen:
            parts.append(frozen_shares(self.kernel_values, self.capacity)[:, :, : end // block_ops.FROZEN_BLOCK])
        return tuple(parts)

    def floats(self, layer: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer `layer`'s keys [Hkv, hd, end] and values [Hkv, end, hd] of positions
        below `end` as float32 (for BLAS): exact for float16, each int8 key or value
        times its scale."""
        hd, n_blocks = self._cfg.head_dim, -(-end // block_ops.KEY_BLOCK)
        blocks = self._blocks(self.keys[layer])[:, :n_blocks, :hd, :]  # [Hkv, blocks, hd, 8]
        # One copy: the cast makes the transposed blocks contiguous, so the reshape is a view.
        keys = blocks.transpose(0, 2, 1, 3).astype(np.float32).reshape(blocks.shape[0], hd, -1)[:, :, :end]
        values = self.values[layer][:, :end].astype(np.float32, copy=False)
        if not self.scaled:
            return keys, values
        scales = self._scales(self.keys[layer])[:, :n_blocks].transpose(0, 2, 1, 3).reshape(blocks.shape[0], 2, -1)
        if self.key_dtype == np.int8:
            keys = keys * scales[:, None, 0, :end]
        return keys, values * scales[:, 1, :end, None]

    def reserve(self, n_positions: int) -> None:
        if n_positions > self._cfg.context_length:
            raise ParameterError(
                f"sequence of {n_positions} tokens exceeds the model's context of {self._cfg.context_length}"
            )
        if n_positions <= self.capacity:
            return
        new_cap = self.capacity_for(min(max(n_positions, 2 * self.capacity), self._cfg.context_length))
        old = self.capacity
        keys, values = self._arrays(new_cap)
        keys[:, :, : old // block_ops.KEY_BLOCK] = self.all_keys
        values[:, :, :old] = self.all_values[:, :, :old]
        if self.frozen:  # the frozen blocks follow the positions
            hd = self._cfg.head_dim
            values[:, :, new_cap : new_cap + block_ops.frozen_rows(old, hd)] = self.all_values[:, :, old:]
        self._set(keys, values, new_cap)

    def move(self, sources: Sequence[int], targets: Sequence[int]) -> None:
        """Copy the keys and values at slots `sources` to slots `targets` (an accepted
        path of a verified tree, to the consecutive slots of its positions). Each
        target must be below every later source, so no copy reads a moved slot."""
        src, dst = np.asarray(sources), np.asarray(targets)
        block, hd = block_ops.KEY_BLOCK, self._cfg.head_dim
        keys = self._blocks()
        keys[:, :, dst // block, :hd, dst % block] = keys[:, :, src // block, :hd, src % block]
        self.all_values[:, :, dst] = self.all_values[:, :, src]
        if self.scaled:
            scales = self._scales()
            scales[:, :, dst // block, :, dst % block] = scales[:, :, src // block, :, src % block]
        if self.frozen:  # a block whose last slot moved is whole now (block_ops.freeze_stored)
            frozen = block_ops.FROZEN_BLOCK
            ends = dst[dst % frozen == frozen - 1]
            if len(ends):
                firsts = (ends - (frozen - 1)).astype(np.int64)
                block_ops.freeze_blocks(self.kernel_keys, self.kernel_values, firsts, hd)

    def frozen_floats(self, layer: int, end: int) -> np.ndarray:
        """Layer `layer`'s frozen keys of the whole blocks below `end` as float32 [Hkv,
        hd, positions] (minimum + units x step, for BLAS)."""
        shares = frozen_shares(self.values[layer], self.capacity)[:, : end // block_ops.FROZEN_BLOCK]
        units, lows, steps = frozen_parts(shares, self._cfg.head_dim)
        return lows + units * steps


def frozen_shares(values: np.ndarray, capacity: int) -> np.ndarray:
    """The frozen blocks' bytes of a cache's values [..., rows, hd] holding
    `capacity` positions, as [..., frozen blocks, bytes] (block_ops.frozen_area): a
    view."""
    rows = values[..., capacity:, :]
    block_rows = block_ops.frozen_block_rows(rows.shape[-1])
    return rows.view(np.uint8).reshape(*rows.shape[:-2], rows.shape[-2] // block_rows, block_rows * rows.shape[-1])


def frozen_parts(shares: np.ndarray, hd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The frozen keys' units, minima and steps [Hkv, hd, positions] as float32, from
    one layer's frozen bytes [Hkv, frozen blocks, bytes] (frozen_shares; a block:
    the units of each group of 4 channels, position by position, then the channels'
    float16 steps, then their float16 minima, then the value scales' copy)."""
    n_kv, n_blocks = shares.shape[:2]
    frozen = block_ops.FROZEN_BLOCK
    units = shares[..., : frozen * hd].reshape(n_kv, n_blocks, hd // 4, frozen, 4).transpose(0, 1, 2, 4, 3)
    units = units.reshape(n_kv, n_blocks, hd, frozen).astype(np.float32)
    params = shares[..., frozen * hd : (frozen + block_ops.FROZEN_PARAMS) * hd]
    params = np.ascontiguousarray(params).view(np.float16).astype(np.float32)
    params = params.reshape(n_kv, n_blocks, 2, hd, 1)  # steps, then minima
    steps, lows = (np.broadcast_to(params[:, :, k], units.shape) for k in (0, 1))

    def by_position(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(n_kv, hd, -1))

    return by_position(units), by_position(lows), by_position(steps)


@dataclass
class Segment:
    """New tokens of one sequence: token i sits at position start + i, in cache slot
    start + i. A tree segment (`parents` given) holds alternatives: row i's parent is
    row parents[i] (row 0, the root, has -1), it sits at position start + its depth,
    and it attends to the cache before `start` and to its own ancestors only."""

    cache: KVCache
    token_ids: Sequence[int]
    start: int
    all_logits: bool = True  # False: only the last row's logits (prefill)
    parents: Sequence[int] | None = None
    # Only each row's largest logit matters (a greedy request): the head may give
    # -inf for outputs that cannot be it (head_screen.py).
    argmax_only: bool = False

    def positions(self) -> np.ndarray:
        if self.parents is None:
            return np.arange(self.start, self.start + self.n)
        return self.start + tree_depths(self.parents)

    def visible(self) -> np.ndarray:
        """[n, n]: may row i see row j of this segment (causal, or ancestor-or-self)."""
        if self.parents is None:
            return np.tri(self.n, dtype=bool)
        seen = np.eye(self.n, dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                seen[i] |= seen[parent]
        return seen

    @property
    def n(self) -> int:
        return len(self.token_ids)


def tree_depths(parents: Sequence[int]) -> np.ndarray:
    """Depth of every row of a tree given as parent indices (each parent earlier)."""
    depths = np.zeros(len(parents), dtype=np.int64)
    for i, parent in enumerate(parents):
        assert (i == 0) == (parent < 0) and parent < i, "row 0 is the only root; parents come first"
        depths[i] = depths[parent] + 1 if parent >= 0 else 0
    return depths


@dataclass
class SegmentOutput:
    # [n, vocab], or [1, vocab] when only the last row was asked for; a segment that
    # is argmax_only may get -inf at outputs that cannot be its rows' largest.
    logits: np.ndarray
    hidden: np.ndarray  # [n, d]: final-normed hidden states, the input of the output head
    seconds: float = 0.0  # the wall time of the forward that computed it (shared with its group)


@dataclass
class _Rope:
    cos: np.ndarray  # [context, hd/2]
    sin: np.ndarray  # [context, hd/2]

    @classmethod
    def build(cls, cfg: LlamaConfig, factors: np.ndarray | None = None) -> _Rope:
        """Frequencies base^(-2i/hd), each divided by its factor (Llama 3.1), at
        positions divided by the linear scaling factor."""
        inv_freq = cfg.rope_base ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
        if factors is not None:
            inv_freq = inv_freq / factors.astype(np.float64)
        positions = np.arange(cfg.context_length, dtype=np.float64) / cfg.rope_linear
        angles = np.outer(positions, inv_freq)
        return cls(cos=np.cos(angles).astype(np.float32), sin=np.sin(angles).astype(np.float32))

    def apply(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate adjacent pairs (x[2i], x[2i+1]): llama.cpp's converter permutes the
        Q and K rows so that this, not HF's rotate-half, is right for GGUF weights."""
        return block_ops.rope(x, self.cos, self.sin, positions)


class LlamaModel:
    def __init__(
        self,
        config: LlamaConfig,
        weights: LlamaWeights,
        *,
        path: str = "",
        fingerprint: str = "",
        precision: str = "f32",
    ) -> None:
        if precision not in PRECISIONS:
            raise ParameterError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        self.config = config
        self.path = path
        self.fingerprint = fingerprint  # sha256 of the GGUF file
        self.precision = precision
        self._rope = _Rope.build(config, weights.rope_factors)
        # gemma3's local layers rotate with a base of their own.
        local = replace(config, rope_base=GEMMA3_LOCAL_BASE)
        gemma3 = config.architecture == "gemma3"
        self._rope_local = _Rope.build(local, weights.rope_factors) if gemma3 else self._rope
        self._tied = weights.w_output is weights.token_embedding
        # What at_precision starts from, where this precision's weights lose the
        # blocks another precision needs (f32 keeps no unpacked K-quant blocks).
        self._unpacked: LlamaWeights | None = None
        if precision in INTEGER:
            weights = _for_int8(weights, split=precision == "int16")
        elif _has_blocks(weights):
            self._unpacked = weights
            weights = _without_blocks(weights)
        self.weights = weights
        # One compiled call for all the blocks of a forward, where the block matrices
        # allow it (layer_stack); the layers then view its arrays.
        self._stack: StackedLayers | None = None
        self._screen: ScreenedHead | bool | None = None  # built on first use; False: none fits
        self.head_choice = HeadChoice()  # screen or whole head, for rows a screen may take
        if config.gemma:
            # The compiled loops compute llama's block (SiLU, no extra norms, windows
            # or caps); Gemma's weights can look like llama's (Gemma 1's do).
            built = None
        elif precision in INTEGER:
            from specq.specdec import int8_stack  # its kernels compile only where int8 runs

            built = int8_stack.build(weights.layers)
        else:
            built = StackedLayers.build(weights.layers)
        if built is not None:
            self._stack, layers = built
            self.weights = replace(weights, layers=layers)

    @classmethod
    def load(cls, path: str, precision: str = "f32") -> LlamaModel:
        return cls.from_gguf(GGUFFile(path), precision)

    @classmethod
    def from_gguf(cls, f: GGUFFile, precision: str = "f32") -> LlamaModel:
        cfg = LlamaConfig.from_gguf(f)
        return cls(cfg, load_weights(f, cfg), path=f.path, fingerprint=f.sha256(), precision=precision)

    @property
    def n_parameters(self) -> int:
        w = self.weights
        layers = sum(
            n_values(x)
            for lw in w.layers
            for x in (lw.attn_norm, lw.w_qkv, lw.w_out, lw.ffn_norm, lw.w_gate_up, lw.w_down)
        ) + sum(
            x.size
            for lw in w.layers
            for x in (lw.b_qkv, lw.q_norm, lw.k_norm, lw.post_attn_norm, lw.post_ffn_norm)
            if x is not None
        )
        head = 0 if self._tied else n_values(w.w_output)
        return n_values(w.token_embedding) + layers + w.output_norm.size + head

    def dequantized(self) -> LlamaModel:
        """This model computing in float32 from the same values (for comparisons)."""
        return LlamaModel(self.config, self.weights.dequantized(), path=self.path, fingerprint=self.fingerprint)

    def at_precision(self, precision: str) -> LlamaModel:
        """The same weights computing at another precision (the int8 layout is built
        from the quantized blocks, so this model must be at f32)."""
        if precision == self.precision:
            return self
        if self.precision != "f32":
            raise ParameterError("a model is converted from the f32 precision only")
        weights = self._unpacked or self.weights
        return LlamaModel(self.config, weights, path=self.path, fingerprint=self.fingerprint, precision=precision)

    @property
    def kv_bytes_per_position(self) -> int:
        """What one position of a sequence's KV cache takes (new_cache's dtype)."""
        return KVCache.bytes_per_position(self.config, KV_TYPES[self.precision])

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.config, capacity, KV_TYPES[self.precision])

    def forward(self, segments: Sequence[Segment]) -> list[SegmentOutput]:
        """Run the new tokens of every segment through the model, writing their keys
        and values into each segment's cache at their positions.

        Returns one output per segment; logits row i is the distribution of the
        token after token i of that segment. A row's bits never depend on the other
        segments, so callers may group segments as they like.

        Segments too long for the compiled stack (prompts of BULK_ROWS rows or more;
        at int16 and int8, of _INTEGER_STACK_ROWS) get a forward of their own, before
        the others: their products or attention are BLAS's, the other rows' numba's,
        and within one forward the two thread pools would take turns 120 times (once
        a product), each turn costing a spin against the other on two cores. Apart,
        they take turns twice. A shorter prompt joins the others' stack call, which
        reads the weights once for all of them.
        """
        bulk = [i for i, seg in enumerate(segments) if seg.n >= self._stack_rows]
        if not bulk or len(bulk) == len(segments):
            return self._forward(segments)
        outputs: list = [None] * len(segments)
        for group in (bulk, [i for i in range(len(segments)) if i not in bulk]):
            for i, out in zip(group, self._forward([segments[i] for i in group])):
                outputs[i] = out
        return outputs

    @property
    def prompt_piece_rows(self) -> int | None:
        """The rows of a prompt piece that a prefill may take in one forward and
        still get the whole prompt's bits (the stack's rows depend on no split), or
        None where only the whole prompt in one forward gives them (f32's prompts
        are BLAS's, and so is every long prompt without a stack)."""
        if self._stack is None or self.precision not in INTEGER:
            return None
        return min(PREFILL_PIECE_ROWS, _INTEGER_STACK_ROWS - 1)

    @property
    def _stack_rows(self) -> int:
        """Segments shorter than this run in the compiled stack, where there is one."""
        return _INTEGER_STACK_ROWS if self._stack is not None and self.precision in INTEGER else BULK_ROWS

    def head_logits(self, hidden: np.ndarray, plan: RowPlan | None = None) -> np.ndarray:
        """[rows, vocab]: the output head on final-normed rows, by default through the
        few-row kernels, whose row's bits never depend on the rows beside it: the
        logits a decode step gives that row. `plan` lets a forward send long segments
        to BLAS instead."""
        logits = (plan.linear if plan else linear)(hidden, self.weights.w_output)
        if self.config.final_softcap:  # gemma2: cap * tanh(logit / cap), as llama.cpp
            cap = np.float32(self.config.final_softcap)
            logits = np.tanh(logits * (np.float32(1.0) / cap)) * cap
        return logits

    def _greedy_logits(self, segments: Sequence[Segment], rows: np.ndarray, plan: RowPlan) -> np.ndarray | None:
        """Where every segment wants only its rows' largest logits and there are enough
        rows for the screen to pay: the head's logits by head_screen or whole, as
        head_choice says, and the time it took told to head_choice. Else None."""
        if len(rows) < SCREEN_ROWS or self.config.final_softcap or not all(s.argmax_only for s in segments):
            return None
        if self._screen is None:
            self._screen = ScreenedHead.of(self.weights.w_output) or False
        if not self._screen:
            return None
        screened = self.head_choice.screen(len(rows))
        started = time.perf_counter()
        logits = self._screen.argmax_logits(rows) if screened else self.head_logits(rows, plan)
        self.head_choice.record(len(rows), screened, time.perf_counter() - started)
        return logits

    def rebuild_cache(self, cache: KVCache, ids: Sequence[int], n_prompt: int) -> np.ndarray:
        """Write the keys and values of `ids` (a prompt of n_prompt tokens, then
        committed output) into `cache`, with the bits the decode that committed them
        wrote; returns the last row's final hidden state.

        Those bits came from a prefill of the prompt and then rounds of short
        segments, whose rows get the same bits in any segment shorter than BULK_ROWS.
        Where any split gives the same bits (prompt_piece_rows), everything goes in
        pieces of that size. Elsewhere the prompt is prefilled whole, as it was, and
        the output follows in segments of BULK_ROWS - 1 rows: one segment over
        everything would send the output's rows through BLAS, which rounds
        differently (3e-5 apart on the default model's hidden states)."""
        piece = self.prompt_piece_rows
        if piece:
            starts = list(range(0, len(ids), piece))
        else:
            starts = [0, *range(n_prompt, len(ids), BULK_ROWS - 1)]
        ends = [*starts[1:], len(ids)]
        for start, end in zip(starts, ends):
            out = self._forward([Segment(cache, ids[start:end], start, all_logits=False)])[0]
        return out.hidden[-1]

    def _forward(self, segments: Sequence[Segment]) -> list[SegmentOutput]:
        started = time.perf_counter()
        cfg, w = self.config, self.weights
        for seg in segments:
            assert seg.n > 0, "a segment needs at least one token"
            seg.cache.reserve(seg.start + seg.n)
        ids = np.concatenate([np.asarray(s.token_ids, dtype=np.int64) for s in segments])
        positions = np.concatenate([s.positions() for s in segments])
        bounds = np.cumsum([0] + [s.n for s in segments])

        x = self._embedded(ids)
        if self._stack is not None and all(seg.n < self._stack_rows for seg in segments):
            x = self._stack.run(
                x, segments, positions, self._rope.cos, self._rope.sin, cfg.n_heads, cfg.d_ffn, cfg.rms_eps
            )
        elif self.precision in INTEGER:
            # The int8 products run on numba's threads and a prompt's attention on
            # BLAS's; two pools taking turns on two cores spin against each other
            # (an int8 prefill of 100 tokens: 363 tokens/s so, 1,500 with BLAS on one
            # thread, docs/performance.md).
            with _blas_threads(1):
                x = self._blocks(segments, x, positions, bounds, _attention_workers())
        else:
            x = self._blocks(segments, x, positions, bounds)

        hidden = block_ops.rms_norm(x, w.output_norm, cfg.rms_eps)  # [rows, d]
        # The output head's rows of all segments in one product (a prefill wants only
        # its last row), so a batched round reads the 49152-row head once, not once
        # a request.
        head_rows = [
            np.arange(bounds[i], bounds[i + 1]) if seg.all_logits else np.array([bounds[i + 1] - 1])
            for i, seg in enumerate(segments)
        ]
        head_input = hidden[np.concatenate(head_rows)]
        plan = RowPlan([len(r) for r in head_rows])
        logits = self._greedy_logits(segments, head_input, plan)
        if logits is None:
            logits = self.head_logits(head_input, plan)
        head_bounds = np.cumsum([0] + [len(r) for r in head_rows])
        seconds = time.perf_counter() - started
        return [
            SegmentOutput(
                logits=logits[head_bounds[i] : head_bounds[i + 1]],
                hidden=hidden[bounds[i] : bounds[i + 1]],
                seconds=seconds,
            )
            for i in range(len(segments))
        ]

    def _embedded(self, ids: np.ndarray) -> np.ndarray:
        x = embed(self.weights.token_embedding, ids)  # [rows, d]
        if self.config.gemma:  # as llama.cpp: times sqrtf(d_model), in float32
            x = x * np.sqrt(np.float32(self.config.d_model))
        return x

    def residuals(self, ids: Sequence[int], layers: Sequence[int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """For every row of a prefill of `ids` on a fresh cache: the final-normed
        hidden state [n, d], and the residual stream after each block in `layers`
        (0-based) [n, d]. For probing what the blocks know (a draft head's inputs,
        scripts/probe_head_inputs.py); decoding never asks. The blocks run one call
        at a time (the stack keeps no residuals), which gives the stack's bits."""
        if any(not 0 <= layer < self.config.n_layers for layer in layers):
            raise ValueError(f"blocks {list(layers)}: the model has blocks 0 to {self.config.n_layers - 1}")
        seg = Segment(self.new_cache(len(ids)), list(ids), 0, all_logits=False)
        bounds = np.array([0, seg.n])
        taps: dict[int, np.ndarray] = dict.fromkeys(layers)
        x = self._embedded(np.asarray(ids, dtype=np.int64))
        if self.precision in INTEGER:
            with _blas_threads(1):  # as _forward: one thread pool at a time
                x = self._blocks([seg], x, seg.positions(), bounds, _attention_workers(), taps)
        else:
            x = self._blocks([seg], x, seg.positions(), bounds, taps=taps)
        return block_ops.rms_norm(x, self.weights.output_norm, self.config.rms_eps), taps

    def _blocks(
        self,
        segments: Sequence[Segment],
        x: np.ndarray,
        positions: np.ndarray,
        bounds: np.ndarray,
        workers: ThreadPoolExecutor | None = None,
        taps: dict[int, np.ndarray | None] | None = None,
    ) -> np.ndarray:
        """The blocks, one numpy or numba call at a time: any weight types, any
        number of segments, BLAS for prompts. Gives a row the same bits as
        layer_stack does. `workers`: threads that share a prompt's attention, each
        with single-threaded BLAS (the caller limits BLAS). `taps`: filled with the
        residual stream after each block it names."""
        cfg, w = self.config, self.weights
        hd, n_q, n_kv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        plan = RowPlan([s.n for s in segments])  # a prompt's rows by BLAS, the others by the kernels
        visible = [s.visible() for s in segments]  # [n, n] each: built once, used by every layer
        for layer_idx, lw in enumerate(w.layers):
            h = block_ops.rms_norm(x, lw.attn_norm, cfg.rms_eps)
            qkv = plan.linear(h, lw.w_qkv)  # [rows, (Hq + 2 Hkv) * hd]
            if lw.b_qkv is not None:
                qkv = qkv + lw.b_qkv
            q = qkv[:, : n_q * hd].reshape(-1, n_q, hd)
            k = qkv[:, n_q * hd : (n_q + n_kv) * hd].reshape(-1, n_kv, hd)
            if lw.q_norm is not None:
                q = block_ops.rms_norm(q.reshape(-1, hd), lw.q_norm, cfg.rms_eps).reshape(q.shape)
                k = block_ops.rms_norm(k.reshape(-1, hd), lw.k_norm, cfg.rms_eps).reshape(k.shape)
            rope = self._rope_local if cfg.local_layer(layer_idx) else self._rope
            q = rope.apply(q, positions)
            k = rope.apply(k, positions)
            v = qkv[:, (n_q + n_kv) * hd :].reshape(-1, n_kv, hd)
            attn = np.empty((x.shape[0], n_q * hd), dtype=np.float32)  # [rows, Hq * hd]
            for s_idx, seg in enumerate(segments):
                rows = slice(bounds[s_idx], bounds[s_idx + 1])
                attn[rows] = self._attend(
                    seg, visible[s_idx], layer_idx, q[rows], k[rows], v[rows], positions[rows], workers
                )
            y = plan.linear(attn, lw.w_out)  # [rows, d]
            if lw.post_attn_norm is not None:
                y = block_ops.rms_norm(y, lw.post_attn_norm, cfg.rms_eps)
            x = x + y
            h = block_ops.rms_norm(x, lw.ffn_norm, cfg.rms_eps)
            gate_up = plan.linear(h, lw.w_gate_up)  # [rows, 2 * ffn]
            gated = block_ops.gelu_gate(gate_up, cfg.d_ffn) if cfg.gemma else block_ops.silu_gate(gate_up, cfg.d_ffn)
            y = plan.linear(gated, lw.w_down)  # [rows, d]
            if lw.post_ffn_norm is not None:
                y = block_ops.rms_norm(y, lw.post_ffn_norm, cfg.rms_eps)
            x = x + y
            if taps is not None and layer_idx in taps:
                taps[layer_idx] = x.copy()
        return x

    def _attend(
        self,
        seg: Segment,
        visible: np.ndarray,
        layer: int,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        positions: np.ndarray,
        workers: ThreadPoolExecutor | None = None,
    ) -> np.ndarray:
        """Attention of the segment's rows over its cache; q [n, Hq, hd], k and v
        [n, Hkv, hd], visible [n, n] (Segment.visible), positions [n] the rows'.
        Returns [n, Hq * hd]. In a layer with a sliding window (gemma2's and gemma3's local ones),
        a row at position p sees positions p - window + 1 .. p only, as llama.cpp.

        A long segment (a prompt: matmul.BULK_ROWS rows or more) goes through
        numpy's batched products, whose BLAS is far faster on n x n scores; every
        other segment through block_ops.attend, one call with no temporaries."""
        cfg = self.config
        n, end = seg.n, seg.start + seg.n
        block_ops.write_kv(seg.cache.kernel_keys[layer], seg.cache.kernel_values[layer], seg.start, k, v)
        scale = cfg.attention_scale
        firsts = np.zeros(n, dtype=np.int64)
        if cfg.window and cfg.local_layer(layer):
            firsts = np.maximum(positions.astype(np.int64) - (cfg.window - 1), 0)
            visible = visible & (positions[None, :] >= firsts[:, None])  # the segment's own rows too
        if n < BULK_ROWS:
            return block_ops.attend(
                q,
                seg.cache.kernel_keys[layer],
                seg.cache.kernel_values[layer],
                seg.start,
                visible,
                scale,
                np.minimum(firsts, seg.start),
                np.float32(cfg.attn_softcap),
            )
        # BLAS multiplies float32: a float16 or 8-bit cache is widened first.
        cache_k, cache_v = seg.cache.floats(layer, end)
        firsts = np.minimum(firsts, seg.start)
        frozen = None
        if seg.cache.frozen:  # each row reads frozen keys below its own bound (block_ops.frozen_blocks)
            bounds = np.maximum(0, (positions.astype(np.int64) + 1 - block_ops.FROZEN_DELAY) // block_ops.FROZEN_BLOCK)
            frozen = (seg.cache.frozen_floats(layer, end), bounds * block_ops.FROZEN_BLOCK)
        return self._attend_prompt(seg, visible, q * scale, cache_k, cache_v, firsts, workers, frozen)

    def _attend_prompt(
        self,
        seg: Segment,
        visible: np.ndarray,
        q_scaled: np.ndarray,
        cache_k: np.ndarray,
        cache_v: np.ndarray,
        firsts: np.ndarray,
        workers: ThreadPoolExecutor | None = None,
        frozen: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """_attend for a long segment, whose keys and values are in the cache already;
        q_scaled [n, Hq, hd] is q over sqrt(hd); row i sees the cache from firsts[i].
        `frozen`: the cache's frozen keys as floats [Hkv, hd, positions] and where each
        row stops reading them.
        With `workers`, the blocks of rows are shared among its threads: each block
        is the same calls with the same shapes either way, so the same bits."""
        cfg = self.config
        n = seg.n
        group, n_kv, hd = cfg.n_heads // cfg.n_kv_heads, cfg.n_kv_heads, cfg.head_dim
        # Query head h reads kv head h // group: fold the group into the row axis so
        # that one batched product per kv head serves all of its query heads.
        q_scaled = q_scaled.transpose(1, 0, 2).reshape(n_kv, group, n, hd)
        out = np.empty((n, cfg.n_heads * hd), dtype=np.float32)

        # Blocks of query rows, each against only the keys it can see (the cache and
        # the segment up to its last row): half the work of the whole n x T square,
        # and scores small enough to stay in cache. 3.7x faster at 1,000 rows, 3x
        # at 2,000, where attention had been three quarters of a prefill.
        def attend_block(r0: int) -> None:
            r1 = min(n, r0 + _ATTENTION_BLOCK)
            rows, seen = r1 - r0, seg.start + r1
            qg = q_scaled[:, :, r0:r1].reshape(n_kv, group * rows, hd)
            scores = (qg @ cache_k[:, :, :seen]).reshape(n_kv, group, rows, seen)
            if frozen is not None and frozen[1][r0:r1].max() > 0:
                keys, ends = frozen[0], frozen[1][r0:r1]
                top = int(ends.max())
                below = (qg @ keys[:, :, :top]).reshape(n_kv, group, rows, top)
                np.copyto(scores[..., :top], below, where=np.arange(top)[None, :] < ends[:, None])
            if cfg.attn_softcap:  # gemma2: cap * tanh(score / cap)
                cap = np.float32(cfg.attn_softcap)
                scores = np.tanh(scores / cap) * cap
            # Every row sees the whole cache before the segment; within it, row i sees
            # rows <= i (a chain) or its ancestors (a tree).
            np.copyto(scores[..., seg.start + r0 :], -np.inf, where=~visible[r0:r1, r0:r1])
            if r0 and not visible[r0:r1, :r0].all():  # a chain sees all its earlier rows
                np.copyto(scores[..., seg.start : seg.start + r0], -np.inf, where=~visible[r0:r1, :r0])
            if firsts[r0:r1].any():  # a sliding window: the cache before each row's first position
                before = np.arange(seg.start)[None, :] < firsts[r0:r1, None]  # [rows, start]
                np.copyto(scores[..., : seg.start], -np.inf, where=before)
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            block = scores.reshape(n_kv, group * rows, seen) @ cache_v[:, :seen]  # [Hkv, G*rows, hd]
            out[r0:r1] = block.reshape(cfg.n_heads, rows, hd).transpose(1, 0, 2).reshape(rows, -1)

        starts = range(0, n, _ATTENTION_BLOCK)
        if workers is None or len(starts) < 2:
            for r0 in starts:
                attend_block(r0)
        else:
            # The last blocks see the most keys: handed out first, they leave the
            # short ones to even out the threads' ends. numpy and BLAS release the
            # GIL, so the threads run side by side: 1.6x on 1,000 rows' attention, a
            # 2,000 to 4,000-token prefill 1.3x to 1.5x faster. Not below: numba's
            # OpenMP threads spin for a while after each product and hold a core
            # (docs/performance.md), so shorter prompts run in the stack.
            list(workers.map(attend_block, reversed(starts)))
        return out
