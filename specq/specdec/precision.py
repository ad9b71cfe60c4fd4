"""The model's precisions, in a module of their own so that the queue layer can name
them without importing the engine (numba, the kernels).

"f32": float32 arithmetic on the quantized weights (HuggingFace parity).
"int16": each activation row quantized to 15 bits and multiplied as two int8 halves
with integer dot products (int8.py), keys cached as float16 (and older ones again as
8 bits, block_ops.freeze_block) and values as 8 bits with a scale each
(model.KV_TYPES): faster than f32 on several rows, and next-token
predictions that agree with f32's (docs/performance.md).
"int8": activations quantized to 8 bits, and keys and values cached as 8 bits with a
scale each (model.KVCache): faster still, 0.50x int16's cache memory, and outputs
that differ from f32's near ties.
"""

from specq.errors import ParameterError

PRECISIONS = ("f32", "int16", "int8")
INTEGER = ("int16", "int8")  # the precisions whose products run on int8.py's kernels
# What a command runs at unless told otherwise: int16 wherever its kernels run, since
# it predicts what f32 does (docs/performance.md: top-1 agreement 99.50%, mean KL
# 8e-5 nats on the bench mix, with its cache of float16 keys, 8-bit copies of older
# ones and 8-bit values; the rest near ties) at up to twice the speed on many rows.
AUTO = "auto"

# The version of each precision's arithmetic, raised whenever a release changes its
# bits on purpose. A checkpoint records it (specq.requests.checkpoint), and a worker
# whose version differs starts the request again: continuing it with other numbers
# would give an output that no uninterrupted decode gives. Checkpoints made before
# versions were recorded count as version 1. int16 2: 8-bit values in its KV cache
# (2026-12-05). All precisions +1 (f32 2, int16 3, int8 2): sampled decoding's warp
# and draw compiled (sampling_kernels), and the recurrent head's SiLU and confidence
# (recurrent_kernels), whose last bits move a seeded request's draws now and then.
# All +1 again (f32 3, int16 4, int8 3; 2026-12-06): a sampled request's `auto` rule
# became the race rule, which draws other tokens for the same seed. int16 5
# (2026-12-07): rows read keys 32 positions past a whole block of 64 as 8 bits a
# channel (block_ops' frozen keys).
NUMERICS_VERSIONS = {"f32": 3, "int16": 5, "int8": 3}


def numerics(precision: str) -> str:
    """What a checkpoint records of the arithmetic that decoded it, e.g. "int16.3"."""
    return f"{precision}.{NUMERICS_VERSIONS[precision]}"


def integer_available() -> bool:
    """Whether this CPU runs the integer precisions' kernels (AVX2, FMA, F16C). Reads
    the CPU's features only: importing specq.specdec.int8 compiles or loads its
    small kernels, which a command that only names a precision (`submit`, `run`'s
    parent) need not pay."""
    from specq.specdec import vec

    return vec.has_avx2()


def require_integer() -> None:
    if not integer_available():
        raise ParameterError(
            "this CPU has no AVX2 with FMA, which the int8 and int16 precisions need; use --precision f32"
        )


def resolve(precision: str) -> str:
    """A concrete precision for `precision`: "auto" is int16 on a CPU with AVX2 and
    FMA, else f32. A batch records the concrete one, so all its workers agree."""
    if precision != AUTO:
        return precision
    return "int16" if integer_available() else "f32"
