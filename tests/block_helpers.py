"""Random GGUF tensors of the block types, shared by the block and int8 tests."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

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
