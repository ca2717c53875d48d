#!/usr/bin/env python3
"""Writes tests/data/dequant_golden.bin: gguf-py (de)quantization goldens.

Run with the reference venv:  /work/refvenv/bin/python tools/golden_dequant.py
(gguf 0.19, numpy). Deterministic (fixed seed).

Format (all little-endian):
  header:  magic b"TDQG", u32 version (=1), u32 num_records
  record:  u32 kind       0 = dequantize: `bytes` -> expected `floats`
                          1 = quantize:   `floats` -> expected `bytes`
           u32 ggml_type  GGMLQuantizationType value
           u32 n          number of elements
           u32 num_bytes  size of the quantized data
           u8[num_bytes]  quantized data
           f32[n]         float data
Dequantize inputs are random bytes whose f16 scale fields are forced to
finite values in [-2, 2] (so outputs are finite); F16/BF16 inputs are random
finite bit patterns (incl. subnormals and signed zeros).
"""
import pathlib
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

SEED = 1234
# Byte offsets of the f16 scale fields inside one block.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
QUANTIZABLE = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]


def record(kind, qtype, q_bytes, floats):
    floats = np.ascontiguousarray(floats, dtype=np.float32).ravel()
    q_bytes = np.ascontiguousarray(q_bytes, dtype=np.uint8).ravel().tobytes()
    return struct.pack("<IIII", kind, int(qtype), floats.size, len(q_bytes)) + q_bytes + floats.tobytes()


def random_blocks(rng, qtype, n_blocks):
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scales = rng.uniform(-2.0, 2.0, size=n_blocks).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def random_halves(rng, n, exp_mask, exp_shift):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    exp = (bits >> exp_shift) & exp_mask
    bits = np.where(exp == exp_mask, bits ^ (1 << exp_shift), bits)  # no inf/nan
    return bits.astype(np.uint16)


def main():
    rng = np.random.default_rng(SEED)
    out = []
    # Dequantization.
    vals = rng.standard_normal(64).astype(np.float32) * 100
    out.append(record(0, T.F32, vals.view(np.uint8), vals))
    h = random_halves(rng, 256, 0x1F, 10)
    h[:4] = [0x0000, 0x8000, 0x0001, 0x83FF]
    out.append(record(0, T.F16, h.view(np.uint8), quants.dequantize(h.view(np.uint8), T.F16)))
    b = random_halves(rng, 256, 0xFF, 7)
    out.append(record(0, T.BF16, b.view(np.uint8), quants.dequantize(b.view(np.uint8), T.BF16)))
    for qtype, n_blocks in [(T.Q8_0, 8), (T.Q4_0, 8), (T.Q4_1, 8), (T.Q5_0, 8), (T.Q5_1, 8),
                            (T.Q2_K, 4), (T.Q3_K, 4), (T.Q4_K, 4), (T.Q5_K, 4), (T.Q6_K, 4)]:
        blocks = random_blocks(rng, qtype, n_blocks)
        out.append(record(0, qtype, blocks, quants.dequantize(blocks.ravel(), qtype)))
    # Quantization: gaussian rows of mixed scale, one all-zero block, one
    # block with a single nonzero, values on rounding ties.
    for qtype in QUANTIZABLE:
        block_size, _ = GGML_QUANT_SIZES[qtype]
        x = rng.standard_normal((8, 32)).astype(np.float32)
        x *= np.float32([0.01, 0.1, 1, 10, 1000, 1, 1, 1]).reshape(8, 1)
        x[5] = 0
        x[6] = 0
        x[6, 7] = -3.5
        x[7] = np.arange(-16, 16, dtype=np.float32) * 0.5
        if qtype in (T.F16, T.BF16):
            q = quants.quantize(x, qtype).view(np.uint8)
        else:
            q = quants.quantize(x, qtype)
        out.append(record(1, qtype, q, x))
    data = b"TDQG" + struct.pack("<II", 1, len(out)) + b"".join(out)
    path = pathlib.Path(__file__).resolve().parent.parent / "tests/data/dequant_golden.bin"
    path.write_bytes(data)
    print(f"wrote {path} ({len(data)} bytes, {len(out)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
