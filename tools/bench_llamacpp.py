#!/usr/bin/env python3
"""pp<N> / tg<N> of llama.cpp (llama-cpp-python) on a GGUF, llama-bench style.

pp: one prompt of N random tokens evaluated in one batch (n_batch = N);
tg: N sequential single-token evals from an empty context. Each is the
median of --reps runs after a warm-up. Prints one JSON object.
"""
import argparse
import json
import random
import statistics
import sys
import time

import llama_cpp


# ggml_type ids of the KV cache types compared with Tandem's --kv-cache-dtype.
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--pp", type=int, default=512)
    p.add_argument("--tg", type=int, default=128)
    p.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f16",
                   help="llama.cpp's KV cache type (type_k = type_v; q8_0 needs flash attention, "
                        "which is then on)")
    p.add_argument("--extra-bufts", choices=("on", "off"), default="off",
                   help="llama.cpp's extra weight buffer types (on x86 for Q4_1: the AMX "
                        "repacking, which segfaults in ggml_backend_amx_mul_mat in 0.3.36 "
                        "on our AMX VM); off runs its AVX-512 / VNNI kernels")
    a = p.parse_args()
    if hasattr(llama_cpp.llama_model_params, "use_extra_bufts"):
        # Llama() takes its model params from the low-level module's defaults.
        low = llama_cpp.llama_cpp
        default_params = low.llama_model_default_params

        def model_params():
            params = default_params()
            params.use_extra_bufts = a.extra_bufts == "on"
            return params

        low.llama_model_default_params = model_params
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=max(a.pp, a.tg) + 16, n_batch=a.pp,
                          n_ubatch=a.pp, n_threads=a.threads, n_threads_batch=a.threads,
                          type_k=KV_TYPES[a.kv_type], type_v=KV_TYPES[a.kv_type],
                          flash_attn=a.kv_type == "q8_0", verbose=False)
    vocab = llm.n_vocab()
    ctx = llm._ctx.ctx
    rng = random.Random(1)
    # The low-level API: Llama.eval() adds Python-side logits bookkeeping
    # that costs more than the model itself on a 135M model.
    mem = llama_cpp.llama_get_memory(ctx) if hasattr(llama_cpp, "llama_get_memory") else None

    def clear():
        if mem is not None:
            llama_cpp.llama_memory_clear(mem, True)
        else:
            llama_cpp.llama_kv_cache_clear(ctx)

    def decode(ids):
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")

    def pp_run():
        toks = [rng.randrange(vocab) for _ in range(a.pp)]
        clear()
        t0 = time.perf_counter()
        decode(toks)
        return a.pp / (time.perf_counter() - t0)

    def tg_run():
        toks = [rng.randrange(vocab) for _ in range(a.tg)]
        clear()
        t0 = time.perf_counter()
        for t in toks:
            decode([t])
        return a.tg / (time.perf_counter() - t0)

    pp_run()  # warm-up
    pp = statistics.median(pp_run() for _ in range(a.reps))
    tg = statistics.median(tg_run() for _ in range(a.reps))
    print(json.dumps({"engine": "llama.cpp", "version": llama_cpp.__version__,
                      "extra_bufts": a.extra_bufts, "kv_type": a.kv_type,
                      "threads": a.threads, "reps": a.reps, "pp": a.pp, "pp_tok_s": round(pp, 2),
                      "tg": a.tg, "tg_tok_s": round(tg, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
