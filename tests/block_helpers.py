"""Random GGUF tensors of the block types, shared by the block and int8 tests."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from specq.specdec.qkernels import QuantizedMatrix

# Byte ranges of each type's block that hold fp16 scales: random bits there would
# be NaNs and infinities, which no quantizer writes.
_FP16 = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "Q3_K": [108],
}


def random_tensor(type_name: str, n_out: int, n_in: int, seed: int = 0) -> np.ndarray:
    """Random bytes [n_out, bytes per row] of a type, its scales finite fp16s of
    either sign (zero and subnormal ones included)."""
    rng = np.random.default_rng(seed)
    size, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    n = n_out * n_in // size
    blocks = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for at in _FP16[type_name]:
        scale = rng.standard_normal(n).astype(np.float32) * np.float32(10.0) ** rng.integers(-6, 1, n)
        scale[:3] = [0.0, -0.0, 6e-8]
        blocks[:, at : at + 2] = scale.astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks.reshape(n_out, -1)


def quantized_matrix(type_name: str, n_out: int, n_in: int, seed: int = 0) -> tuple[QuantizedMatrix, np.ndarray]:
    """A random [n_out, n_in] matrix quantized by gguf, and its values."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float32)
    raw = np.asarray(quantize(w, GGMLQuantizationType[type_name]), dtype=np.uint8).reshape(n_out, -1)
    values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(n_out, n_in).astype(np.float32)
    return QuantizedMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in)), values


def quantized_activations(n: int, n_in: int, seed: int = 1) -> np.ndarray:
    """Random activation rows for the int8 products, with outliers and a zero block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    x[:, :3] *= 20  # outliers, as real activations have
    x[0, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    return x
