#!/usr/bin/env python3
"""Writes the gguf fuzz seed corpus (tests/fuzz/corpus/gguf/) with gguf-py.

Run with the reference venv:  /work/refvenv/bin/python tools/make_gguf_seeds.py
The files are tiny valid GGUF v3 images written by an independent
implementation (gguf-py's GGUFWriter), so tests/common/gguf_test.cc also uses
them as a cross-check: every seed named valid_*.gguf must parse.
"""
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf import GGUFWriter, quants

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fuzz/corpus/gguf"


def write(name, build, alignment=None):
    path = OUT / name
    w = GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path.name}: {path.stat().st_size} bytes")


def metadata_only(w):
    w.add_uint8("u8", 7)
    w.add_int8("i8", -7)
    w.add_uint16("u16", 700)
    w.add_int16("i16", -700)
    w.add_uint32("llama.block_count", 2)
    w.add_int32("i32", -70000)
    w.add_float32("f32", 0.5)
    w.add_bool("bool", True)
    w.add_string("general.name", "seed")
    w.add_uint64("u64", 1 << 40)
    w.add_int64("i64", -(1 << 40))
    w.add_float64("f64", 2.5)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0])
    w.add_array("nested", [[1, 2], [3]])


def tensors(w):
    rng = np.random.default_rng(5)
    w.add_uint32("llama.block_count", 1)
    w.add_tensor("f32", rng.standard_normal((2, 4)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((8,)).astype(np.float16))
    for qtype, name in [(T.Q8_0, "q8_0"), (T.Q4_1, "q4_1"), (T.Q5_0, "q5_0")]:
        x = rng.standard_normal((2, 32)).astype(np.float32)
        q = quants.quantize(x, qtype)
        w.add_tensor(name, q, raw_dtype=qtype)
    k = rng.integers(0, 256, size=(1, 144), dtype=np.uint8)
    w.add_tensor("q4_k", k, raw_dtype=T.Q4_K)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write("valid_metadata.gguf", metadata_only)
    write("valid_tensors.gguf", tensors)
    write("valid_align64.gguf", tensors, alignment=64)
    write("valid_empty.gguf", lambda w: None)


if __name__ == "__main__":
    main()
