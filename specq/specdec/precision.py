"""The model's precisions, in a module of their own so that the queue layer can name
them without importing the engine (numba, the kernels).

"f32": float32 arithmetic on the quantized weights (HuggingFace parity).
"int8": each activation row quantized to 8 bits, integer dot products (int8.py):
faster on many rows, and outputs that differ from f32's near ties.
"""

PRECISIONS = ("f32", "int8")
DEFAULT_PRECISION = "f32"
