"""Writes int8_kernels.py: the register-blocked micro-kernels of the int8 products.

A micro-kernel keeps NO x LANES outputs for NR activation rows in registers (float
accumulators, and per block the exact int32 sums) while it streams the weights of
those outputs once; the code is the same for every (NO, NR) but for the number of
named locals, so it is written out by this generator rather than by hand. The output
is committed (numba caches compiled code only for functions defined in a source file)
and a test checks that it is what this generator writes.

    python -m specq.specdec.int8_codegen      # rewrites specq/specdec/int8_kernels.py

Per block b, output lane o and row r, in this order and nothing else:
    Q4_1, Q8_M:  acc = fma(float(isum), d_w * d_x, acc);  acc = fma(m_w, s_x, acc)
    Q8_0:        acc = fma(float(isum), d_w * d_x, acc)
    Q8_H:        acc = fma(float(isum_1), d_w1 * d_x, acc);  acc = fma(float(isum_2), d_w2 * d_x, acc);
                 acc = fma(m_w, s_x, acc)
(Q8_M: 8-bit weights with a minimum, Q8_H: 8-bit weights with a scale per half
block of 16 and a minimum; gguf_blocks.py says which GGUF types they hold.)
isum is exact, so a row's result depends on nothing but its own values: the same
bits alone, in any group and in any blocking (bitwise row invariance).
"""

from __future__ import annotations

import os

# (output groups, rows) per micro-kernel. With 32 vector registers (AVX-512VL) two
# output vectors by three rows measured fastest; with AVX2's 16, one by four
# (docs/performance.md, "int8 products").
BLOCKINGS = ((2, 3), (1, 4))
TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "int8_kernels.py")

# A kind ending in "s" is the split form (the int16 precision): each activation comes
# as two int8 halves, high (xq) and low (xl), q = 128 high + low, and the kernel sums
# both against the same weights, then combines the sums in int32. A kind ending in "i"
# takes the int16 precision's activations whole, as int16 (xw), without VNNI.
_ARGS = {
    "q4_1": "wq, wd, wm, xq, xd, xs",
    "q8_0": "wq, wd, xq, xd",
    "q8_0v": "wq, wd, ws, xq, xd",
    "q4_1s": "wq, wd, wm, xq, xl, xd, xs",
    "q8_0vs": "wq, wd, ws, xq, xl, xd",
    "q8_0i": "wq, wd, xw, xd",
    "q8_mi": "wq, wd, wm, xw, xd, xs",
    "q8_hi": "wq, wd, wm, xw, xd, xs",
    "q8_m": "wq, wd, wm, xq, xd, xs",
    "q8_mv": "wq, wd, wm, ws, xq, xd, xs",
    "q8_mvs": "wq, wd, wm, ws, xq, xl, xd, xs",
    "q8_h": "wq, wd, wm, xq, xd, xs",
    "q8_hv": "wq, wd, wm, ws, xq, xd, xs",
    "q8_hvs": "wq, wd, wm, ws, xq, xl, xd, xs",
}
# How far ahead a micro-kernel asks for its weights (vec.prefetch), in output groups:
# a group's blocks lie end to end (nb blocks), so block b of group c + 4 is about 18
# KB ahead in a layer of the default model (at 16 lanes; half that at 8). With the
# weights in memory, the layers' products of 1 row took 1.2x to 1.5x less time than
# without, of 5 rows 1.4x; on a Zen 4 three and four groups ahead about the same,
# one or two, or into L1, slower at one row; on a Xeon (AMX) four made a lone step
# 1.047x and 1.054x faster than three in two runs, rounds of 5 to 64 rows the same
# (docs/performance.md; not tuned at 8 lanes).
PREFETCH_GROUPS = 4
SPLIT_BLOCKINGS = ((2, 2), (1, 2))  # twice the integer sums in registers: fewer rows at a time
# Nibble weights on AVX2 without VNNI: one by three rows measured 1.1x to 1.2x one by
# four from 4 rows up (an AMD EPYC, znver3: 106 against 89 G multiply-adds/s at 32
# rows; 1 row the same), with the int16 sums of vec.nibble_dot4.
NIBBLE_BLOCKINGS = ((2, 3), (1, 3))


# Per kernel family: (kind, lanes, blockings). 8 lanes: 256-bit vectors (AVX2, and
# AVX-VNNI); 16 lanes: 512-bit ones, with AVX-512 VNNI only (q8_0's sign trick has no
# 512-bit form there; q8_0v needs none).
FAMILIES = (
    ("q4_1", 8, NIBBLE_BLOCKINGS),
    ("q8_0", 8, BLOCKINGS),
    ("q8_0v", 8, BLOCKINGS),
    ("q4_1", 16, ((2, 3),)),
    ("q8_0v", 16, ((2, 3),)),
    ("q4_1s", 8, SPLIT_BLOCKINGS),
    ("q8_0vs", 8, SPLIT_BLOCKINGS),
    # Split at 512 bits: two by three rows (24 of the 32 registers: six float sums,
    # twelve integer ones) where AVX2's two by two must stop. On a Zen 4, against two
    # by two, the layers' products 1.05x to 1.06x faster at 3 and 5 rows and 1.03x at
    # 8, the output head 1.07x at 8; 1 and 32 rows the same (docs/performance.md).
    # Q4_1 takes two by four (30 registers: eight float sums, sixteen integer ones,
    # four of unpacked weights, two of activations): on an Intel Xeon (2026-12-06,
    # quiet; the same bits) the layers' products of 5, 8, 32 and 64 rows 1.02x,
    # 1.23x, 1.12x and 1.08x faster than two by three; three by two and one by four
    # fell between the two at 8 and 32 rows and below two by three at 5 and 64
    # (docs/performance.md; not measured on a Zen 4).
    ("q4_1s", 16, ((2, 4),)),
    ("q8_0vs", 16, ((2, 3),)),
    # The formats other GGUF types are unpacked into (int8.py): most models never
    # reach them.
    ("q8_m", 8, BLOCKINGS),
    ("q8_mv", 8, BLOCKINGS),
    ("q8_mv", 16, ((2, 3),)),
    ("q8_mvs", 8, SPLIT_BLOCKINGS),
    ("q8_mvs", 16, ((2, 2),)),
    # Two sums per output and row where the others keep one: half the rows at a time.
    ("q8_h", 8, SPLIT_BLOCKINGS),
    ("q8_hv", 8, SPLIT_BLOCKINGS),
    ("q8_hv", 16, ((2, 2),)),
    ("q8_hvs", 8, ((1, 2), (1, 1))),
    ("q8_hvs", 16, ((1, 2),)),
    # 8-bit weights against whole 15-bit activations (the int16 precision without
    # VNNI): int16 products (vec.madd16), half the instructions of the split halves'
    # sign trick, which these replaced. On znver3 the Q8_0 output head 1.1x faster at
    # 1 row, 1.4x to 1.5x at 5 and 32 (one by four rows no faster); Q8_M and Q8_H 1.4x
    # at 1 row, 1.6x to 1.7x at 5.
    ("q8_0i", 8, ((1, 3),)),
    ("q8_mi", 8, ((1, 3),)),
    ("q8_hi", 8, ((1, 2),)),  # two sums per output and row: fewer rows
)


def _name(kind: str, lanes: int) -> str:
    return kind if lanes == 8 else f"{kind}w"


def _micro_int16(kind: str, nr: int) -> list[str]:
    """8-bit weights (Q8_0, Q8_M, Q8_H) against int16 activations, one output group by
    nr rows: per vector of the block (4 inputs of 8 outputs), its two halves widened
    to int16 and each row's 4 inputs broadcast; every output's sum in two lanes until
    vec.pair_totals. The epilogue is _micro's, in the same order."""
    family = kind[:-1]
    with_min, parts = family != "q8_0", 2 if family == "q8_h" else 1
    lines = [
        "",
        "",
        "@njit(inline='always')",
        f"def _{kind}_1_{nr}({_ARGS[kind]}, out, c, r0, lap, laps, nb, n_in, n_out):  # pragma: no cover - compiled",
    ]
    add = lines.append
    for r in range(nr):
        add(f"    a0{r} = zeros_f32()")
    add("    for b in range(nb):")
    add("        w0 = c * nb + b")
    _prefetches(add, 1, 256, 8, parts, ("wd", "wm") if with_min else ("wd",))
    for r in range(nr):
        add(f"        x{r} = (r0 + {r}) * n_in + b * 32")
        for k in range(parts):
            add(f"        s{r}_{k} = zeros_i32()")
            add(f"        t{r}_{k} = zeros_i32()")
    for v in range(8):
        k = v * parts // 8  # vectors 4..7 hold inputs 16..31, a Q8_H block's second half
        add(f"        wa = widen_bytes(wq, w0 * 256 + {32 * v})")
        add(f"        wb = widen_bytes(wq, w0 * 256 + {32 * v + 16})")
        for r in range(nr):
            add(f"        xv = broadcast_pairs(xw, x{r} + {4 * v})")
            add(f"        s{r}_{k} = madd16(s{r}_{k}, wa, xv)")
            add(f"        t{r}_{k} = madd16(t{r}_{k}, wb, xv)")
    _epilogue(add, "", 8, 1, nr, parts, with_min, lambda o, r, k: f"pair_totals(s{r}_{k}, t{r}_{k})")
    return lines


def _scale_at(block: str, k: int, parts: int, lanes: int) -> str:
    """Where the d (or ws) of scale k of a group's block (its index in the weights'
    blocks, an expression) begins in its flat array."""
    return f"{block} * {lanes}" if parts == 1 else f"({block} * {parts} + {k}) * {lanes}"


def _prefetches(add, no: int, block_bytes: int, lanes: int, parts: int, arrays: tuple[str, ...]) -> None:
    """Asks for the lines of a block of the group PREFETCH_GROUPS ahead of each of the
    tile's no groups: its quants (every 64 bytes) and one scale of each array (a
    block's scales fit in a line). With more rows than the tile's, the driver passes
    over the same groups `laps` times (the weights from L1 after the first); the
    group ahead's blocks are asked for a share in each pass (every laps-th block
    visited, `lap` the pass), so that its lines keep coming while the later passes
    multiply. Asked for all in the first, they came in its time alone, and each
    pass after it added its multiplies to a round's time: 4 rows cost 1.49x a row
    where 3 cost 1.22x."""
    add("        visit = lap * nb + b")
    add("        if visit % laps == 0:")
    add("            shift = visit // laps - b")
    for o in range(no):
        ahead = f"(w{o} + {PREFETCH_GROUPS} * nb + shift)"
        for offset in range(0, block_bytes, 64):
            add(f"            prefetch(wq, {ahead} * {block_bytes} + {offset})")
        for array in arrays:
            if array == "wm":  # one minimum a block
                add(f"            prefetch(wm, {ahead} * {lanes})")
                continue
            for k in range(parts):
                add(f"            prefetch({array}, {_scale_at(ahead, k, parts, lanes)})")


def _epilogue(add, w: str, lanes: int, no: int, nr: int, parts: int, with_min: bool, total) -> None:
    """Per block, the float step every micro-kernel ends with, in the order the module
    docstring gives (the bits depend on it), then the outputs' stores after the last
    block. total(o, r, k): the int32 sums of output group o, row r and scale k; the
    float accumulators are a{o}{r}, the weights' block index w{o}."""

    for o in range(no):
        for k in range(parts):
            add(f"        dw{o}{'_' * k}{k or ''} = load_f32{w}(wd, {_scale_at(f'w{o}', k, parts, lanes)})")
        if with_min:
            add(f"        mw{o} = load_f32{w}(wm, w{o} * {lanes})")
    for r in range(nr):
        add(f"        dx = broadcast_f32{w}(xd, (r0 + {r}) * nb + b)")
        if with_min:
            add(f"        sx = broadcast_f32{w}(xs, (r0 + {r}) * nb + b)")
        for o in range(no):
            for k in range(parts):
                dw = f"dw{o}{'_' * k}{k or ''}"
                add(f"        a{o}{r} = fma{w}(to_float{w}({total(o, r, k)}), mul{w}({dw}, dx), a{o}{r})")
            if with_min:
                add(f"        a{o}{r} = fma{w}(mw{o}, sx, a{o}{r})")
    for o in range(no):
        for r in range(nr):
            add(f"    store_f32{w}(out, (r0 + {r}) * n_out + (c + {o}) * {lanes}, a{o}{r})")


def _micro(kind: str, lanes: int, no: int, nr: int) -> list[str]:
    if kind.endswith("i"):
        return _micro_int16(kind, nr)
    w = "" if lanes == 8 else "_w"  # the intrinsics' suffix for this width (vec.py)
    split = kind.endswith("s")
    base = kind[:-1] if split else kind
    vnni = base.endswith("v")
    family = base[:-1] if vnni else base  # q4_1, q8_0, q8_m or q8_h
    with_min = family != "q8_0"
    parts = 2 if family == "q8_h" else 1  # integer sums per output and row: one per scale
    block_bytes = (16 if family == "q4_1" else 32) * lanes  # one output group's block
    halves = (("s", "xq"), ("t", "xl")) if split else (("s", "xq"),)  # (sum, activations) per half

    def acc(total: str, o: int, r: int, k: int = 0) -> str:  # the integer sum of scale k
        return f"{total}{o}{r}" if k == 0 else f"{total}{o}{r}_{k}"

    lines = [
        "",
        "",
        "@njit(inline='always')",
        f"def _{_name(kind, lanes)}_{no}_{nr}({_ARGS[kind]}, out, c, r0, lap, laps, nb, n_in, n_out):  "
        "# pragma: no cover - compiled",
    ]
    add = lines.append
    for o in range(no):
        for r in range(nr):
            add(f"    a{o}{r} = zeros_f32{w}()")
    add("    for b in range(nb):")
    for o in range(no):
        add(f"        w{o} = (c + {o}) * nb + b")
    scales = ("wd",) + (("wm",) if with_min else ()) + (("ws",) if vnni else ())
    _prefetches(add, no, block_bytes, lanes, parts, scales)
    for r in range(nr):
        add(f"        x{r} = (r0 + {r}) * n_in + b * 32")
    zeros = "nibble_zeros" if family == "q4_1" else "zeros_i32"  # vec.nibble_dot4 says why
    for total, _ in halves:
        for o in range(no):
            for r in range(nr):
                for k in range(parts):
                    add(f"        {acc(total, o, r, k)} = {zeros}{w}()")
    step = 4 * lanes  # bytes per vector
    if family == "q4_1":
        # Byte 4 * lane + p of vector v: input 4v + p (low nibble), 16 + 4v + p (high).
        for v in range(4):
            for o in range(no):
                add(f"        p = load_bytes{w}(wq, w{o} * {block_bytes} + {step * v})")
                add(f"        lo{o} = low_nibbles{w}(p)")
                add(f"        hi{o} = high_nibbles{w}(p)")
            for r in range(nr):
                for total, acts in halves:
                    add(f"        bl = broadcast4{w}({acts}, x{r} + {4 * v})")
                    add(f"        bh = broadcast4{w}({acts}, x{r} + {16 + 4 * v})")
                    for o in range(no):
                        dot = f"nibble_dot4{w}"
                        add(f"        {total}{o}{r} = {dot}({dot}({total}{o}{r}, lo{o}, bl), hi{o}, bh)")
        for o in range(no):
            for r in range(nr):
                total = f"nibble_split_total{w}(s{o}{r}, t{o}{r})" if split else f"nibble_total{w}(s{o}{r})"
                add(f"        s{o}{r} = {total}")
    elif vnni:
        # With VNNI only: (x + 128) as unsigned bytes times w, less 128 * sum(w) (ws,
        # per output and block, or half block): one instruction per product where
        # the sign trick below takes three. The same integers.
        for v in range(8):
            for o in range(no):
                add(f"        q{o} = load_bytes{w}(wq, w{o} * {block_bytes} + {step * v})")
            for r in range(nr):
                for total, acts in halves:
                    if lanes == 8:
                        add(f"        xv = flip_sign_bits(broadcast4({acts}, x{r} + {4 * v}))")
                    else:  # the activations hold x + 128 already: numba/LLVM did not finish compiling the xor here
                        add(f"        xv = broadcast4_w({acts}, x{r} + {4 * v})")
                    for o in range(no):
                        s_ = acc(total, o, r, v * parts // 8)  # vectors 4..7 hold inputs 16..31
                        add(f"        {s_} = dot4{w}({s_}, xv, q{o})")
        for o in range(no):
            for k in range(parts):
                add(f"        ws{o} = load_i32{w}(ws, {_scale_at(f'w{o}', k, parts, lanes)})")
                for r in range(nr):
                    for total, _ in halves:
                        add(f"        {acc(total, o, r, k)} = sub_i32{w}({acc(total, o, r, k)}, ws{o})")
    else:
        # Byte 4 * lane + p of vector v: input 4v + p.
        for v in range(8):
            for o in range(no):
                add(f"        q{o} = load_bytes(wq, w{o} * {block_bytes} + {step * v})")
                add(f"        m{o} = magnitudes(q{o})")
            for r in range(nr):
                for total, acts in halves:
                    add(f"        xv = broadcast4({acts}, x{r} + {4 * v})")
                    for o in range(no):
                        s_ = acc(total, o, r, v * parts // 8)
                        add(f"        {s_} = dot4({s_}, m{o}, signs_of(xv, q{o}))")
    if split and family != "q4_1":
        for o in range(no):
            for r in range(nr):
                for k in range(parts):
                    add(f"        {acc('s', o, r, k)} = combine7{w}({acc('s', o, r, k)}, {acc('t', o, r, k)})")
    _epilogue(add, w, lanes, no, nr, parts, with_min, lambda o, r, k: acc("s", o, r, k))
    return lines


def _driver(kind: str, lanes: int, no: int, nr: int) -> list[str]:
    """Each thread takes a slice of the output groups (`lanes` outputs each); in it,
    NO groups at a time (single ones for the slice's remainder), and for those all
    rows in groups of NR (then the remaining rows as one smaller group): the group's
    weights, a few KB, stay in L1 while the row groups pass over them."""
    args, name = _ARGS[kind], _name(kind, lanes)
    # Compiled on first use, for the types they are called with: a CPU runs either
    # the 256-bit or the 512-bit drivers (int8.py), and a model few of the families.
    lines = [
        "",
        "",
        "@njit(parallel=True, cache=True, nogil=True)",
        f"def {name}_{no}x{nr}({args}, out, n, nb, n_in, n_out, n_slices):  # pragma: no cover - compiled",
        f"    groups = n_out // {lanes}",
        "    for t in prange(n_slices):",
        "        last = (t + 1) * groups // n_slices",
        "        c = t * groups // n_slices",
        "        while c < last:",
        f"            step = {no} if c + {no} <= last else 1",
        "            r0 = 0",
        f"            laps = (n + {nr - 1}) // {nr}",
        "            while r0 < n:",
        f"                g = min({nr}, n - r0)",
    ]
    first = True
    for step in sorted({no, 1}, reverse=True):
        for g in range(nr, 0, -1):
            lines.append(f"                {'if' if first else 'elif'} step == {step} and g == {g}:")
            call = f"_{name}_{step}_{g}({args}, out, c, r0, r0 // {nr}, laps, nb, n_in, n_out)"
            lines.append(f"                    {call}")
            first = False
    lines += ["                r0 += g", "            c += step"]
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
        "from specq.specdec.vec import (  # noqa: F401 - each kernel family uses its own",
    ]
    names = sorted({n for n in _NARROW_NAMES} | {f"{n}_w" for n in _NARROW_NAMES if n not in _NARROW_ONLY})
    for i in range(0, len(names), 8):
        lines.append("    " + ", ".join(names[i : i + 8]) + ",")
    lines.append(")")
    defined: set[str] = set()
    for kind, lanes, blockings in FAMILIES:
        for no, nr in blockings:
            for step in sorted({no, 1}):
                for g in range(1, nr + 1):
                    name = f"_{_name(kind, lanes)}_{step}_{g}"
                    if name not in defined:
                        defined.add(name)
                        lines += _micro(kind, lanes, step, g)
            lines += _driver(kind, lanes, no, nr)
    return "\n".join(lines) + "\n"


_NARROW_NAMES = (
    "broadcast4",
    "broadcast_f32",
    "broadcast_pairs",
    "combine7",
    "dot4",
    "flip_sign_bits",
    "fma",
    "high_nibbles",
    "load_bytes",
    "load_f32",
    "load_i32",
    "low_nibbles",
    "madd16",
    "magnitudes",
    "mul",
    "nibble_dot4",
    "nibble_split_total",
    "nibble_total",
    "nibble_zeros",
    "pair_totals",
    "prefetch",
    "signs_of",
    "store_f32",
    "sub_i32",
    "to_float",
    "widen_bytes",
    "zeros_f32",
    "zeros_i32",
)
# Unused at 512 bits
_NARROW_ONLY = (
    "prefetch",
    "magnitudes",
    "signs_of",
    "flip_sign_bits",
    "broadcast_pairs",
    "madd16",
    "pair_totals",
    "widen_bytes",
)


if __name__ == "__main__":
    with open(TARGET, "w") as f:
        f.write(generate())
    print(f"wrote {TARGET}")
