#!/usr/bin/env python3
"""Writes tests/data/kquant_golden.bin: inputs and ggml's own Q4_K / Q5_K /
Q6_K reference quantization of them (quantize_row_q{4,5,6}_K_ref called
through ctypes from llama-cpp-python's libggml-base.so), for
tests/kernels/quantize_kquant_test.cc.

Usage: tools/make_kquant_golden.py [path/to/libggml-base.so]
(default: the one in .venv-ref, see tools/setup_ref_env.sh).

Format (little-endian): "KQG1", u32 count, then per case: u32 ggml type,
u32 n (elements), n f32 inputs, u32 num_bytes, the quantized bytes.
"""
import ctypes
import glob
import struct
import sys

import numpy as np

TYPES = {12: ("quantize_row_q4_K_ref", 144), 13: ("quantize_row_q5_K_ref", 176),
         14: ("quantize_row_q6_K_ref", 210)}


def inputs():
    rng = np.random.default_rng(17)
    cases = [rng.normal(0, 1, 512), rng.normal(0, 0.02, 256), rng.uniform(0.5, 2.0, 256),
             np.zeros(256), np.full(256, -0.75)]
    x = rng.normal(0, 0.05, 768)
    x[rng.integers(0, 768, 6)] *= 40.0  # outliers
    cases.append(x)
    x = rng.normal(0, 1, 256)
    x[:32] = 0.0  # one all-zero sub-block
    cases.append(x)
    return [c.astype(np.float32) for c in cases]


def main():
    lib_path = sys.argv[1] if len(sys.argv) > 1 else (
        glob.glob(".venv-ref/lib/python3*/site-packages/llama_cpp/lib/libggml-base.so") or [""])[0]
    lib = ctypes.CDLL(lib_path)
    out = bytearray(b"KQG1")
    cases = [(t, x) for t in TYPES for x in inputs()]
    out += struct.pack("<I", len(cases))
    for t, x in cases:
        fn_name, block_bytes = TYPES[t]
        fn = getattr(lib, fn_name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        dst = ctypes.create_string_buffer(len(x) // 256 * block_bytes)
        fn(x.ctypes.data, dst, len(x))
        out += struct.pack("<II", t, len(x)) + x.tobytes()
        out += struct.pack("<I", len(dst.raw)) + dst.raw
    with open("tests/data/kquant_golden.bin", "wb") as f:
        f.write(out)
    print(f"wrote {len(cases)} cases, {len(out)} bytes")


if __name__ == "__main__":
    main()
