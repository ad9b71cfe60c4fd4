#!/usr/bin/env python3
"""Write the default model (SmolLM2-135M-Instruct, Q4_1) in other GGUF types with
llama.cpp's own quantizer, for measuring specq on the files people download.

SmolLM2-135M's rows of 576 values are not whole K-quant blocks of 256, so llama.cpp
gives those matrices a fallback type: its "Q4_K_M" file holds Q5_0, Q8_0, Q4_K and
Q6_K, its "Q5_K_M" file Q5_1, Q8_0, Q5_K and Q6_K (docs/performance.md lists them).
The source is already quantized, so these files carry its rounding plus their own:
they test loading and speed, not the quality of a type.

Usage:  pip install -e '.[compare]' && python scripts/requantize.py DIR [TYPE ...]
        (types: Q4_0 Q5_0 Q5_1 Q8_0 Q3_K_M Q4_K_M Q5_K_M Q6_K F16 BF16; default: all)
Then:   specq bench --model DIR/smollm2-Q4_K_M.gguf --proposers none --compare llama.cpp
"""

from __future__ import annotations

import ctypes
import os
import sys

# llama.cpp's llama_ftype values (llama.h).
FTYPES = {
    "F16": 1,
    "Q4_0": 2,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q3_K_M": 12,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "BF16": 32,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    directory, types = argv[0], argv[1:] or list(FTYPES)
    unknown = [t for t in types if t not in FTYPES]
    if unknown:
        print(f"error: unknown type {unknown[0]!r} (choose from {', '.join(FTYPES)})", file=sys.stderr)
        return 1
    try:
        import llama_cpp
    except ImportError:
        print("error: llama-cpp-python is not installed (pip install -e '.[compare]')", file=sys.stderr)
        return 1
    from specq.specdec.loader import default_model_path

    os.makedirs(directory, exist_ok=True)
    source = default_model_path()
    for name in types:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[name]
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        target = os.path.join(directory, f"smollm2-{name}.gguf")
        if llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params)) != 0:
            print(f"error: llama.cpp could not write {target}", file=sys.stderr)
            return 1
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
