"""Writes int8_kernels.py: the register-blocked micro-kernels of the int8 products.

A micro-kernel keeps NO x 8 outputs for NR activation rows in registers (float
accumulators, and per block the exact int32 sums) while it streams the weights of
those outputs once; the code is the same for every (NO, NR) but for the number of
named locals, so it is written out by this generator rather than by hand. The output
is committed (numba caches compiled code only for functions defined in a source file)
and a test checks that it is what this generator writes.

    python -m specq.specdec.int8_codegen      # rewrites specq/specdec/int8_kernels.py

Per block b, output lane o and row r, in this order and nothing else:
    Q4_1:  acc = fma(float(isum), d_w * d_x, acc);  acc = fma(m_w, s_x, acc)
    Q8_0:  acc = fma(float(isum), d_w * d_x, acc)
isum is exact, so a row's result depends on nothing but its own values: the same
bits alone, in any group and in any blocking (bitwise row invariance).
"""

from __future__ import annotations

import os

# (outputs / 8, rows) per micro-kernel. With 32 vector registers (AVX-512VL) two
# output vectors by three rows measured fastest; with AVX2's 16, one by four
# (docs/performance.md, "int8 products").
BLOCKINGS = ((2, 3), (1, 4))
TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "int8_kernels.py")

_ARGS = {"q4_1": "wq, wd, wm, xq, xd, xs", "q8_0": "wq, wd, xq, xd", "q8_0v": "wq, wd, ws, xq, xd"}
_SIGNATURES = {
    "q4_1": "void(uint8[::1], float32[::1], float32[::1], int8[::1], float32[::1], float32[::1], "
            "float32[::1], int64, int64, int64, int64, int64)",
    "q8_0": "void(int8[::1], float32[::1], int8[::1], float32[::1], float32[::1], int64, int64, int64, int64, int64)",
    "q8_0v": "void(int8[::1], float32[::1], int32[::1], int8[::1], float32[::1], float32[::1], int64, int64, int64, "
             "int64, int64)",
}


def _micro(kind: str, no: int, nr: int) -> list[str]:
    lines = [
        "",
        "",
        "@njit(inline='always')",
        f"def _{kind}_{no}_{nr}({_ARGS[kind]}, out, c8, r0, nb, n_in, n_out):  # pragma: no cover - compiled",
    ]
    add = lines.append
    for o in range(no):
        for r in range(nr):
            add(f"    a{o}{r} = zeros_f32()")
    add("    for b in range(nb):")
    for o in range(no):
        add(f"        w{o} = (c8 + {o}) * nb + b")
    for r in range(nr):
        add(f"        x{r} = (r0 + {r}) * n_in + b * 32")
    for o in range(no):
        for r in range(nr):
            add(f"        s{o}{r} = zeros_i32()")
    if kind == "q4_1":
        # Byte 4 * lane + p of vector v: input 4v + p (low nibble), 16 + 4v + p (high).
        for v in range(4):
            for o in range(no):
                add(f"        p = load_bytes(wq, w{o} * 128 + {32 * v})")
                add(f"        lo{o} = low_nibbles(p)")
                add(f"        hi{o} = high_nibbles(p)")
            for r in range(nr):
                add(f"        xl = broadcast4(xq, x{r} + {4 * v})")
                add(f"        xh = broadcast4(xq, x{r} + {16 + 4 * v})")
                for o in range(no):
                    add(f"        s{o}{r} = dot4(dot4(s{o}{r}, lo{o}, xl), hi{o}, xh)")
    elif kind == "q8_0v":
        # With VNNI only: (x + 128) as unsigned bytes times w, less 128 * sum(w) (ws,
        # per output and block): one instruction per product where the sign trick
        # below takes three. The same integers.
        for v in range(8):
            for o in range(no):
                add(f"        q{o} = load_bytes(wq, w{o} * 256 + {32 * v})")
            for r in range(nr):
                add(f"        xv = flip_sign_bits(broadcast4(xq, x{r} + {4 * v}))")
                for o in range(no):
                    add(f"        s{o}{r} = dot4(s{o}{r}, xv, q{o})")
        for o in range(no):
            add(f"        ws{o} = load_i32(ws, w{o} * 8)")
            for r in range(nr):
                add(f"        s{o}{r} = sub_i32(s{o}{r}, ws{o})")
    else:
        # Byte 4 * lane + p of vector v: input 4v + p.
        for v in range(8):
            for o in range(no):
                add(f"        q{o} = load_bytes(wq, w{o} * 256 + {32 * v})")
                add(f"        m{o} = magnitudes(q{o})")
            for r in range(nr):
                add(f"        xv = broadcast4(xq, x{r} + {4 * v})")
                for o in range(no):
                    add(f"        s{o}{r} = dot4(s{o}{r}, m{o}, signs_of(xv, q{o}))")
    for o in range(no):
        add(f"        dw{o} = load_f32(wd, w{o} * 8)")
        if kind == "q4_1":
            add(f"        mw{o} = load_f32(wm, w{o} * 8)")
    for r in range(nr):
        add(f"        dx = broadcast_f32(xd, (r0 + {r}) * nb + b)")
        if kind == "q4_1":
            add(f"        sx = broadcast_f32(xs, (r0 + {r}) * nb + b)")
        for o in range(no):
            add(f"        a{o}{r} = fma(to_float(s{o}{r}), mul(dw{o}, dx), a{o}{r})")
            if kind == "q4_1":
                add(f"        a{o}{r} = fma(mw{o}, sx, a{o}{r})")
    for o in range(no):
        for r in range(nr):
            add(f"    store_f32(out, (r0 + {r}) * n_out + (c8 + {o}) * 8, a{o}{r})")
    return lines


def _driver(kind: str, no: int, nr: int) -> list[str]:
    """Each thread takes a slice of the output vectors; in it, NO vectors at a time
    (single ones for the slice's remainder), and for those all rows in groups of NR
    (then the remaining rows as one smaller group): the group's weights, a few KB,
    stay in L1 while the row groups pass over them."""
    args = _ARGS[kind]
    lines = [
        "",
        "",
        f'@njit("{_SIGNATURES[kind]}", parallel=True, cache=True, nogil=True)',
        f"def {kind}_{no}x{nr}({args}, out, n, nb, n_in, n_out, n_slices):  # pragma: no cover - compiled",
        "    n8 = n_out // 8",
        "    for t in prange(n_slices):",
        "        last = (t + 1) * n8 // n_slices",
        "        c8 = t * n8 // n_slices",
        "        while c8 < last:",
        f"            step = {no} if c8 + {no} <= last else 1",
        "            r0 = 0",
        "            while r0 < n:",
        f"                g = min({nr}, n - r0)",
    ]
    first = True
    for step in sorted({no, 1}, reverse=True):
        for g in range(nr, 0, -1):
            lines.append(f"                {'if' if first else 'elif'} step == {step} and g == {g}:")
            lines.append(f"                    _{kind}_{step}_{g}({args}, out, c8, r0, nb, n_in, n_out)")
            first = False
    lines += ["                r0 += g", "            c8 += step"]
    return lines


def generate() -> str:
    lines = [
        '"""Generated by specq/specdec/int8_codegen.py (its docstring says what these are).',
        "",
        "Do not edit: run `python -m specq.specdec.int8_codegen`; a test checks that this",
        'file is what it writes."""',
        "",
        "from numba import njit, prange",
        "",
        "from specq.specdec.vec import (",
        "    broadcast4, broadcast_f32, dot4, flip_sign_bits, fma, high_nibbles, load_bytes, load_f32, load_i32,",
        "    low_nibbles, magnitudes, mul, signs_of, store_f32, sub_i32, to_float, zeros_f32, zeros_i32,",
        ")",
    ]
    for kind in ("q4_1", "q8_0", "q8_0v"):
        for no, nr in BLOCKINGS:
            for step in sorted({no, 1}):
                for g in range(1, nr + 1):
                    name = f"_{kind}_{step}_{g}("
                    if not any(name in line for line in lines):
                        lines += _micro(kind, step, g)
            lines += _driver(kind, no, nr)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(TARGET, "w") as f:
        f.write(generate())
    print(f"wrote {TARGET}")
