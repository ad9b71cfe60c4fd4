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
INTEGER = ("int16", "int8")  # the precisions whose products run on int8.py's kernels
# What a command runs at unless told otherwise: int16 wherever its kernels run, since
# it predicts what f32 does (docs/performance.md: top-1 agreement 99.91%, mean KL
# below 1e-5 nats on the bench mix, with its float16 KV cache; the rest near ties) at
# up to twice the speed on many rows.
AUTO = "auto"


def resolve(precision: str) -> str:
    """A concrete precision for `precision`: "auto" is int16 on a CPU with AVX2 and
    FMA, else f32. A batch records the concrete one, so all its workers agree."""
    if precision != AUTO:
        return precision
    from specq.specdec import int8  # compiles the kernels where they run: only when asked

    return "int16" if int8.AVAILABLE else "f32"
