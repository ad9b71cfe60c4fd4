"""Attention's cache layouts for frozen 8-bit keys, timed over caches in memory: the
scores and the weighted values of SEQUENCES x LAYERS x 3 kv heads (3 query heads
each, head width 64) at CONTEXT positions, on two threads, each task asking for the
next task's lines as it reads its own (as block_ops does). Synthetic bytes: this
times reads and arithmetic, not results.

  A  float16 keys in blocks of 8 positions (main's layout)
  B  frozen blocks (32 positions: each channel's 32 units, then float16 steps and
     minima) in an array of their own; the last positions' float16 keys in a ring
  C  as B, the float16 keys kept for every position
  D  frozen blocks spread over the blocks of keys they lie in (the branch's third form)
  E  as C, the frozen scores in integers (vpdpbusd; the query split into two 7-bit
     halves once, not per block)
  F  as E, the query folded with each block's steps and split per block (scalar)

Values are 8-bit rows of 64 in every form. Prints each form's median time over the
trials and its ratio to A's.

  python scripts/bench_frozen_layouts.py --context 500 --trials 11
"""

import argparse
import time

import numpy as np
from numba import njit, prange

from specq.specdec import vec

HD, KB, FB = 64, 8, 32
FBYTES = HD * FB + 4 * HD  # 2304
NKV, RING = 3, 8
DSTRIDE = 1024 + 576  # bytes of a key block in the third form


@njit(inline="always")
def ask(arr, at, n):
    for e in range(0, n, 64 // arr.itemsize):
        vec.prefetch(arr, at + e)


@njit(inline="always")
def add1(a, b):
    return vec.fma(vec.splat_f32(np.float32(1.0)), a, b)


@njit(inline="always")
def f16_scores(q, keys, base, t0, end, raw, ahead, stride):
    q0, q1, q2 = q[0], q[1], q[2]
    while t0 + 4 * KB <= end:
        a00, a01, a02, a03 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a10, a11, a12, a13 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a20, a21, a22, a23 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        block = base + (t0 // KB) * stride
        for i in range(HD):
            row = block + i * KB
            k0, k1 = vec.load_f32(keys, row), vec.load_f32(keys, row + stride)
            k2, k3 = vec.load_f32(keys, row + 2 * stride), vec.load_f32(keys, row + 3 * stride)
            w = vec.broadcast_f32(q0, i)
            a00, a01, a02, a03 = vec.fma(w, k0, a00), vec.fma(w, k1, a01), vec.fma(w, k2, a02), vec.fma(w, k3, a03)
            w = vec.broadcast_f32(q1, i)
            a10, a11, a12, a13 = vec.fma(w, k0, a10), vec.fma(w, k1, a11), vec.fma(w, k2, a12), vec.fma(w, k3, a13)
            w = vec.broadcast_f32(q2, i)
            a20, a21, a22, a23 = vec.fma(w, k0, a20), vec.fma(w, k1, a21), vec.fma(w, k2, a22), vec.fma(w, k3, a23)
        if ahead >= 0:
            ask(keys, ahead + (t0 // KB) * stride, 4 * stride)
        vec.store_f32(raw[0], t0, a00)
        vec.store_f32(raw[0], t0 + 8, a01)
        vec.store_f32(raw[0], t0 + 16, a02)
        vec.store_f32(raw[0], t0 + 24, a03)
        vec.store_f32(raw[1], t0, a10)
        vec.store_f32(raw[1], t0 + 8, a11)
        vec.store_f32(raw[1], t0 + 16, a12)
        vec.store_f32(raw[1], t0 + 24, a13)
        vec.store_f32(raw[2], t0, a20)
        vec.store_f32(raw[2], t0 + 8, a21)
        vec.store_f32(raw[2], t0 + 16, a22)
        vec.store_f32(raw[2], t0 + 24, a23)
        t0 += 4 * KB
    while t0 < end:
        a0, a1, a2 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        block = base + (t0 // KB) * stride
        for i in range(HD):
            k0 = vec.load_f32(keys, block + i * KB)
            a0 = vec.fma(vec.broadcast_f32(q0, i), k0, a0)
            a1 = vec.fma(vec.broadcast_f32(q1, i), k0, a1)
            a2 = vec.fma(vec.broadcast_f32(q2, i), k0, a2)
        if ahead >= 0:
            ask(keys, ahead + (t0 // KB) * stride, stride)
        vec.store_f32(raw[0], t0, a0)
        vec.store_f32(raw[1], t0, a1)
        vec.store_f32(raw[2], t0, a2)
        t0 += KB


@njit(inline="always")
def frozen_scores(q, fz, base, nblocks, raw, folded, ahead, inblock):
    q0, q1, q2 = q[0], q[1], q[2]
    w0, w1, w2 = folded[0], folded[1], folded[2]
    for b in range(nblocks):
        blk = base + b * FBYTES
        if ahead >= 0:
            if inblock:
                for k in range(4):
                    ask(fz, ahead + (4 * b + k) * DSTRIDE + 1024, 576)
            else:
                ask(fz, ahead + b * FBYTES, FBYTES)
        c0, c1, c2 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        steps = blk + HD * FB
        for i in range(0, HD, 8):
            if inblock:
                sa = base + (4 * b + i // 16) * DSTRIDE + 1024 + 512 + 2 * (i % 16)
                step, low = vec.load_halves(fz, sa), vec.load_halves(fz, sa + 32)
            else:
                step, low = vec.load_halves(fz, steps + 2 * i), vec.load_halves(fz, steps + 2 * HD + 2 * i)
            x = vec.load_f32(q0, i)
            vec.store_f32(w0, i, vec.mul(x, step))
            c0 = vec.fma(x, low, c0)
            x = vec.load_f32(q1, i)
            vec.store_f32(w1, i, vec.mul(x, step))
            c1 = vec.fma(x, low, c1)
            x = vec.load_f32(q2, i)
            vec.store_f32(w2, i, vec.mul(x, step))
            c2 = vec.fma(x, low, c2)
        a00, a01, a02, a03 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a10, a11, a12, a13 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a20, a21, a22, a23 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        data = blk
        for i in range(HD):
            if inblock and i % 16 == 0:
                data = base + (4 * b + i // 16) * DSTRIDE + 1024
            u0, u1 = vec.load_u8_f32(fz, data), vec.load_u8_f32(fz, data + 8)
            u2, u3 = vec.load_u8_f32(fz, data + 16), vec.load_u8_f32(fz, data + 24)
            w = vec.broadcast_f32(w0, i)
            a00, a01, a02, a03 = vec.fma(w, u0, a00), vec.fma(w, u1, a01), vec.fma(w, u2, a02), vec.fma(w, u3, a03)
            w = vec.broadcast_f32(w1, i)
            a10, a11, a12, a13 = vec.fma(w, u0, a10), vec.fma(w, u1, a11), vec.fma(w, u2, a12), vec.fma(w, u3, a13)
            w = vec.broadcast_f32(w2, i)
            a20, a21, a22, a23 = vec.fma(w, u0, a20), vec.fma(w, u1, a21), vec.fma(w, u2, a22), vec.fma(w, u3, a23)
            data += FB
        t0 = b * FB
        vec.store_f32(raw[0], t0, add1(a00, c0))
        vec.store_f32(raw[0], t0 + 8, add1(a01, c0))
        vec.store_f32(raw[0], t0 + 16, add1(a02, c0))
        vec.store_f32(raw[0], t0 + 24, add1(a03, c0))
        vec.store_f32(raw[1], t0, add1(a10, c1))
        vec.store_f32(raw[1], t0 + 8, add1(a11, c1))
        vec.store_f32(raw[1], t0 + 16, add1(a12, c1))
        vec.store_f32(raw[1], t0 + 24, add1(a13, c1))
        vec.store_f32(raw[2], t0, add1(a20, c2))
        vec.store_f32(raw[2], t0 + 8, add1(a21, c2))
        vec.store_f32(raw[2], t0 + 16, add1(a22, c2))
        vec.store_f32(raw[2], t0 + 24, add1(a23, c2))


@njit(inline="always")
def int_scores(q, fz, base, nblocks, raw, qh, ql, ahead, fold):
    for b in range(nblocks):
        blk = base + b * FBYTES
        if ahead >= 0:
            ask(fz, ahead + b * FBYTES, FBYTES)
        if fold:  # scalar: quantize q * step to 15 bits, split into high and low 7-bit halves
            for k in range(3):
                big = np.float32(1e-30)
                for i in range(HD):
                    big = max(big, abs(q[k, i]))
                s = np.float32(16256.0) / big
                for i in range(HD):
                    v = np.int32(np.rint(q[k, i] * s))
                    h = (v + 64) >> 7
                    qh[k, i] = np.int8(h)
                    ql[k, i] = np.int8(v - (h << 7))
        h0, h1, h2 = qh[0], qh[1], qh[2]
        l0, l1, l2 = ql[0], ql[1], ql[2]
        a00, a01, a02, a03 = vec.zeros_i32(), vec.zeros_i32(), vec.zeros_i32(), vec.zeros_i32()
        a10, a11, a12, a13 = vec.zeros_i32(), vec.zeros_i32(), vec.zeros_i32(), vec.zeros_i32()
        a20, a21, a22, a23 = vec.zeros_i32(), vec.zeros_i32(), vec.zeros_i32(), vec.zeros_i32()
        for j in range(HD // 4):
            d = blk + j * 128
            u0, u1, u2, u3 = (
                vec.load_bytes(fz, d),
                vec.load_bytes(fz, d + 32),
                vec.load_bytes(fz, d + 64),
                vec.load_bytes(fz, d + 96),
            )
            w = vec.broadcast4(h0, 4 * j)
            a00, a01, a02, a03 = vec.dot4(a00, u0, w), vec.dot4(a01, u1, w), vec.dot4(a02, u2, w), vec.dot4(a03, u3, w)
            w = vec.broadcast4(h1, 4 * j)
            a10, a11, a12, a13 = vec.dot4(a10, u0, w), vec.dot4(a11, u1, w), vec.dot4(a12, u2, w), vec.dot4(a13, u3, w)
            w = vec.broadcast4(h2, 4 * j)
            a20, a21, a22, a23 = vec.dot4(a20, u0, w), vec.dot4(a21, u1, w), vec.dot4(a22, u2, w), vec.dot4(a23, u3, w)
        a00, a01, a02, a03 = (
            vec.combine7(a00, vec.zeros_i32()),
            vec.combine7(a01, vec.zeros_i32()),
            vec.combine7(a02, vec.zeros_i32()),
            vec.combine7(a03, vec.zeros_i32()),
        )
        a10, a11, a12, a13 = (
            vec.combine7(a10, vec.zeros_i32()),
            vec.combine7(a11, vec.zeros_i32()),
            vec.combine7(a12, vec.zeros_i32()),
            vec.combine7(a13, vec.zeros_i32()),
        )
        a20, a21, a22, a23 = (
            vec.combine7(a20, vec.zeros_i32()),
            vec.combine7(a21, vec.zeros_i32()),
            vec.combine7(a22, vec.zeros_i32()),
            vec.combine7(a23, vec.zeros_i32()),
        )
        for j in range(HD // 4):
            d = blk + j * 128
            u0, u1, u2, u3 = (
                vec.load_bytes(fz, d),
                vec.load_bytes(fz, d + 32),
                vec.load_bytes(fz, d + 64),
                vec.load_bytes(fz, d + 96),
            )
            w = vec.broadcast4(l0, 4 * j)
            a00, a01, a02, a03 = vec.dot4(a00, u0, w), vec.dot4(a01, u1, w), vec.dot4(a02, u2, w), vec.dot4(a03, u3, w)
            w = vec.broadcast4(l1, 4 * j)
            a10, a11, a12, a13 = vec.dot4(a10, u0, w), vec.dot4(a11, u1, w), vec.dot4(a12, u2, w), vec.dot4(a13, u3, w)
            w = vec.broadcast4(l2, 4 * j)
            a20, a21, a22, a23 = vec.dot4(a20, u0, w), vec.dot4(a21, u1, w), vec.dot4(a22, u2, w), vec.dot4(a23, u3, w)
        t0 = b * FB
        vec.store_f32(raw[0], t0, vec.to_float(a00))
        vec.store_f32(raw[0], t0 + 8, vec.to_float(a01))
        vec.store_f32(raw[0], t0 + 16, vec.to_float(a02))
        vec.store_f32(raw[0], t0 + 24, vec.to_float(a03))
        vec.store_f32(raw[1], t0, vec.to_float(a10))
        vec.store_f32(raw[1], t0 + 8, vec.to_float(a11))
        vec.store_f32(raw[1], t0 + 16, vec.to_float(a12))
        vec.store_f32(raw[1], t0 + 24, vec.to_float(a13))
        vec.store_f32(raw[2], t0, vec.to_float(a20))
        vec.store_f32(raw[2], t0 + 8, vec.to_float(a21))
        vec.store_f32(raw[2], t0 + 16, vec.to_float(a22))
        vec.store_f32(raw[2], t0 + 24, vec.to_float(a23))


@njit(inline="always")
def weigh(values, base, end, raw, out, ahead):
    o00, o01, o02, o03 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
    o04, o05, o06, o07 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
    for t in range(end):
        if ahead >= 0 and t % 8 == 0:
            ask(values, ahead + t * HD, 8 * HD)
        row = base + t * HD
        v0, v1, v2, v3 = (
            vec.load_f32(values, row),
            vec.load_f32(values, row + 8),
            vec.load_f32(values, row + 16),
            vec.load_f32(values, row + 24),
        )
        v4, v5, v6, v7 = (
            vec.load_f32(values, row + 32),
            vec.load_f32(values, row + 40),
            vec.load_f32(values, row + 48),
            vec.load_f32(values, row + 56),
        )
        for k in range(3):
            w = vec.broadcast_f32(raw[k], t)
            o00, o01, o02, o03 = vec.fma(w, v0, o00), vec.fma(w, v1, o01), vec.fma(w, v2, o02), vec.fma(w, v3, o03)
            o04, o05, o06, o07 = vec.fma(w, v4, o04), vec.fma(w, v5, o05), vec.fma(w, v6, o06), vec.fma(w, v7, o07)
    vec.store_f32(out, 0, add1(add1(o00, o01), add1(o02, o03)))
    vec.store_f32(out, 8, add1(add1(o04, o05), add1(o06, o07)))


@njit(parallel=True)
def run(form, qs, keys, fz, values, raws, folds, outs, qhs, qls, sizes, order):
    CTX, NF, BLOCKS, TASKS, LAYERS = sizes
    for layer in range(LAYERS):
        for half in prange(2):
            raw, folded, out = raws[half], folds[half], outs[half]
            lo, hi = half * TASKS // 2, (half + 1) * TASKS // 2
            for task in range(lo, hi):
                slot = order[layer * TASKS + task]
                nxt = order[layer * TASKS + task + 1] if task + 1 < hi else -1
                q = qs[task]
                vb = slot * BLOCKS * KB * HD
                vahead = nxt * BLOCKS * KB * HD if nxt >= 0 else -1
                if form == 0:
                    kb = slot * BLOCKS * KB * HD
                    f16_scores(q, keys, kb, 0, CTX, raw, nxt * BLOCKS * KB * HD if nxt >= 0 else -1, HD * KB)
                elif form == 3:  # third form: frozen quarters inside the key blocks
                    kb = slot * BLOCKS * (DSTRIDE // 2)
                    kahead = nxt * BLOCKS * (DSTRIDE // 2) if nxt >= 0 else -1
                    frozen_scores(q, keys.view(np.uint8), 2 * kb, NF, raw, folded, 2 * kahead if nxt >= 0 else -1, True)
                    f16_scores(q, keys, kb, NF * FB, CTX, raw, kahead, DSTRIDE // 2)
                elif form >= 4:  # integer frozen scores (4: query split once; 5: folded per block, scalar)
                    fb = slot * NF * FBYTES
                    int_scores(
                        q, fz, fb, NF, raw, qhs[half], qls[half], nxt * NF * FBYTES if nxt >= 0 else -1, form == 5
                    )
                    kb = slot * BLOCKS * KB * HD
                    f16_scores(q, keys, kb, NF * FB, CTX, raw, nxt * BLOCKS * KB * HD if nxt >= 0 else -1, HD * KB)
                else:
                    fb = slot * NF * FBYTES
                    frozen_scores(q, fz, fb, NF, raw, folded, nxt * NF * FBYTES if nxt >= 0 else -1, False)
                    if form == 1:  # ring of RING blocks, tail blocks at ring positions
                        kb = slot * RING * KB * HD - NF * FB * HD
                        f16_scores(
                            q,
                            keys,
                            kb,
                            NF * FB,
                            CTX,
                            raw,
                            nxt * RING * KB * HD - NF * FB * HD if nxt >= 0 else -1,
                            HD * KB,
                        )
                    else:
                        kb = slot * BLOCKS * KB * HD
                        f16_scores(q, keys, kb, NF * FB, CTX, raw, nxt * BLOCKS * KB * HD if nxt >= 0 else -1, HD * KB)
                for k in range(3):
                    for t in range(CTX):
                        raw[k, t] *= np.float32(1e-3)
                weigh(values, vb, CTX, raw, out, vahead)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=500, help="positions a sequence's cache holds")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument(
        "--scatter",
        action="store_true",
        help="tasks' caches in shuffled places, not end to end (as sequences' caches lie in a round)",
    )
    args = parser.parse_args()
    for name in ("context", "sequences", "layers", "trials"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)} is not 1 or more")
    CTX, SEQS, LAYERS = args.context, args.sequences, args.layers
    NF = max(0, (CTX + 1 - 32) // FB)  # frozen blocks (block_ops.frozen_blocks)
    BLOCKS, TASKS = -(-(CTX + KB) // KB), SEQS * NKV
    sizes = (CTX, NF, BLOCKS, TASKS, LAYERS)
    order = np.arange(LAYERS * TASKS, dtype=np.int64)
    if args.scatter:
        np.random.default_rng(1).shuffle(order)
    rng = np.random.default_rng(0)
    n = LAYERS * TASKS
    keys_full = rng.integers(0x3000, 0x3C00, n * BLOCKS * KB * HD, dtype=np.uint16)  # float16 bits 0.125..1
    keys_ring = rng.integers(0x3000, 0x3C00, n * RING * KB * HD + 64, dtype=np.uint16)
    keys_third = rng.integers(0x3000, 0x3C00, n * BLOCKS * DSTRIDE // 2 + 64, dtype=np.uint16)
    third8 = keys_third.view(np.uint8)
    for s in range(n):
        for b in range(NF * 4):
            at = s * BLOCKS * DSTRIDE + b * DSTRIDE + 1024 + 512
            third8[at : at + 64].view(np.uint16)[:] = 0x2000
    fz = rng.integers(0, 256, n * NF * FBYTES + 64, dtype=np.uint8)
    # steps/minima: valid halves
    for s in range(n * NF):
        at = s * FBYTES + HD * FB
        fz[at : at + 4 * HD].view(np.uint16)[:] = 0x2000
    values = rng.integers(-127, 128, n * BLOCKS * KB * HD, dtype=np.int8)
    qs = rng.standard_normal((TASKS, 3, HD)).astype(np.float32)
    raws = np.zeros((2, 3, BLOCKS * KB + 64), np.float32)
    folds = np.zeros((2, 3, HD), np.float32)
    outs = np.zeros((2, HD), np.float32)
    qhs = rng.integers(-100, 100, (2, 3, HD)).astype(np.int8)
    qls = rng.integers(-64, 64, (2, 3, HD)).astype(np.int8)
    print(
        f"{SEQS} sequences x {LAYERS} layers, context {CTX}: frozen blocks {NF}; "
        f"bytes read: A keys {n * CTX * HD * 2 / 1e6:.0f} MB, "
        f"B/C keys {(n * NF * FBYTES + n * (CTX - NF * FB) * HD * 2) / 1e6:.0f} MB, values {n * CTX * HD / 1e6:.0f} MB",
        flush=True,
    )
    forms = {
        "A f16": (0, keys_full),
        "B frozen+ring": (1, keys_ring),
        "C frozen+full f16": (2, keys_full),
        "D third form": (3, keys_third),
        "E int frozen": (4, keys_full),
        "F int frozen+fold": (5, keys_full),
    }
    for form, k in forms.values():
        run(form, qs, k, fz, values, raws, folds, outs, qhs, qls, sizes, order)
    times = {name: [] for name in forms}
    for _ in range(args.trials):
        for name, (form, k) in forms.items():
            t = time.perf_counter()
            run(form, qs, k, fz, values, raws, folds, outs, qhs, qls, sizes, order)
            times[name].append((time.perf_counter() - t) * 1e3)
    base = np.median(times["A f16"])
    for name, ts in times.items():
        print(f"{name:20s} median {np.median(ts):7.2f} ms  min {min(ts):7.2f}  vs A {np.median(ts) / base:.3f}")


if __name__ == "__main__":
    main()
