#!/usr/bin/env python3
"""Makes a K-quant GGUF (default Q4_K_M) of a quantized GGUF for tests and
benchmarks of the K-quant fast path (kernels/qgemm.h).

The source (e.g. the bundled SmolLM2 Q4_1) is first dequantized with gguf-py
into an F32 GGUF (same metadata, tensors in the same order), which
llama.cpp's llama_model_quantize then requantizes. Needs .venv-ref
(tools/setup_ref_env.sh: gguf, numpy, llama-cpp-python).

  .venv-ref/bin/python tools/make_kquant_gguf.py \
      --src models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out models/SmolLM2-135M-Instruct.Q4_K_M.gguf [--ftype Q4_K_M]

Hidden sizes that are not a multiple of 256 (SmolLM2's 576) make llama.cpp
fall back to legacy types for those rows (Q5_0 / Q8_0 ...); the 1536-column
ffn_down keeps Q4_K / Q6_K.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import gguf

FTYPES = {"Q4_K_M": 15, "Q4_K_S": 14, "Q5_K_M": 17, "Q5_K_S": 16, "Q6_K": 18, "F16": 1, "BF16": 32}


def dequantize_to_f32(src: str, dst: str) -> None:
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            w.add_uint32(name, 0)  # ALL_F32
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # numpy shape is ggml's shape reversed ([rows, cols]).
        w.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: str, dst: str, ftype: int, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize failed: {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ftype", default="Q4_K_M", choices=sorted(FTYPES))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.out))) as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        dequantize_to_f32(a.src, f32)
        quantize(f32, a.out, FTYPES[a.ftype], a.threads)
    r = gguf.GGUFReader(a.out)
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    print(a.out, counts)


if __name__ == "__main__":
    main()
