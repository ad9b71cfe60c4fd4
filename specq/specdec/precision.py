"""The model's precisions, in a module of their own so that the queue layer can name
them without importing the engine (numba, the kernels).

"f32": float32 arithmetic on the quantized weights (HuggingFace parity).
"int16": each activation row quantized to 15 bits and multiplied as two int8 halves
with integer dot products (int8.py): faster than f32 on several rows, and next-token
predictions that agree with f32's (docs/performance.md).
"int8": activations quantized to 8 bits: faster still, and outputs that differ from
f32's near ties.
"""

PRECISIONS = ("f32", "int16", "int8")
DEFAULT_PRECISION = "f32"
