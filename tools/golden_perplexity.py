#!/usr/bin/env python3
"""Reference perplexity for `tandem perplexity` (tests/integration/perplexity_test.cc).

Computes what llama.cpp's llama-perplexity prints ("Final estimate: PPL = X +/- err")
for a GGUF and a text, with llama.cpp itself through llama-cpp-python, following
tools/perplexity/perplexity.cpp step by step:
  - tokens = tokenize(text, add_special=True, parse_special=False): BOS only when
    the model's metadata asks for it;
  - fewer than 2 * n_ctx tokens is an error; n_chunk = len(tokens) // n_ctx;
  - each chunk is evaluated from an empty KV cache, its first token replaced by
    BOS when the model adds BOS, with logits for every position;
  - positions first = n_ctx // 2 .. n_ctx - 2 are scored against the next token:
    nll = max + log(sum exp(logit - max)) - logit[target] (sum in double);
  - PPL = exp(mean nll), error = PPL * sqrt((E[nll^2] - E[nll]^2) / (count - 1)).

Writes tests/data/perplexity_<model stem>_ctx<N>.json (or --out) with the
per-chunk running PPL, the final PPL and error, the token count and the
versions used. Usage:
  bash tools/setup_ref_env.sh   # or: python3 -m venv .venv-ref && .venv-ref/bin/pip install llama-cpp-python numpy
  .venv-ref/bin/python tools/golden_perplexity.py [--model PATH] [--file TEXT] [--ctx-size 512]
"""
import argparse
import hashlib
import json
import math
import os

import numpy as np
import llama_cpp
from llama_cpp import Llama

# llama.cpp's AMX weight repacking ("extra buffer types") crashed in
# ggml_backend_amx_mul_mat on the machine the golden was made on (llama-cpp-python
# 0.3.36, batches > 1 token); without the extra buffer types llama.cpp runs its
# standard CPU kernels (Q4_1 x Q8_1 dot products), the same as a non-AMX machine.
_default_params = llama_cpp.llama_cpp.llama_model_default_params


def _params_without_extra_bufts():
    params = _default_params()
    params.use_extra_bufts = False
    return params


llama_cpp.llama_cpp.llama_model_default_params = _params_without_extra_bufts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--file", default=os.path.join(ROOT, "tests", "data", "perplexity_text.txt"))
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    n_ctx = args.ctx_size

    llm = Llama(model_path=args.model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                logits_all=True, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False)
    with open(args.file, "rb") as f:
        text = f.read()
    tokens = llm.tokenize(text, add_bos=True, special=False)
    add_bos = bool(llm._model.add_bos_token())
    if len(tokens) < 2 * n_ctx:
        raise SystemExit(f"need at least {2 * n_ctx} tokens, the text has {len(tokens)}")
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    n_vocab = llm.n_vocab()

    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:n_ctx], dtype=np.float32).reshape(n_ctx, n_vocab)
        for i in range(first, n_ctx - 1):
            row = logits[i]
            m = float(row.max())
            s = float(np.exp((row - m).astype(np.float32), dtype=np.float32).astype(np.float64).sum())
            nll = m + math.log(s) - float(row[chunk[i + 1]])
            nll_sum += nll
            nll2_sum += nll * nll
            count += 1
        running.append(math.exp(nll_sum / count))
        print(f"[{c + 1}]{running[-1]:.4f},", end="", flush=True)
    mean = nll_sum / count
    ppl = math.exp(mean)
    var = nll2_sum / count - mean * mean
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 else 0.0
    print(f"\nFinal estimate: PPL = {ppl:.4f} +/- {err:.5f}")

    stem = os.path.splitext(os.path.basename(args.model))[0]
    out = args.out or os.path.join(ROOT, "tests", "data", f"perplexity_{stem}_ctx{n_ctx}.json")
    golden = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "model": os.path.basename(args.model),
        "model_sha256": sha256(args.model),
        "file": os.path.relpath(os.path.abspath(args.file), ROOT),
        "file_sha256": sha256(args.file),
        "n_ctx": n_ctx,
        "add_bos": add_bos,
        "n_tokens": len(tokens),
        "n_chunks": n_chunk,
        "scored_tokens": count,
        "chunk_ppl": [round(v, 6) for v in running],
        "ppl": round(ppl, 6),
        "ppl_error": round(err, 6),
        "mean_nll": round(mean, 8),
    }
    with open(out, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
