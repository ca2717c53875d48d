#!/usr/bin/env python3
"""Speculative decoding benchmark: single-stream decode tokens/s with and
without n-gram drafts on three workloads (tools/spec_workloads/: an
input-grounded rewrite of a >300-token passage, a one-change code edit, an
open chat question), greedy, chat template, same GGUF and threads.

With --llama-python PATH (a Python that imports llama_cpp, e.g. .venv-ref
from tools/setup_ref_env.sh), llama.cpp runs the same prompts in the same run
without and with its prompt-lookup decoding (llama_cpp.llama_speculative.
LlamaPromptLookupDecoding), for the ratio against the peer.

With --llama-lookup PATH (llama.cpp's C++ `llama-lookup` example, built from
the same sdist's sources by tools/build_llama_lookup.sh) it also runs
llama.cpp's own prompt-lookup decoder on the same token sequence (the chat
template rendered as text and checked against Tandem's prompt token ids):
once with --spec-draft-n-max 0 (its plain decoding, the same loop) and once
with --spec-draft-n-max K, reporting its decode tokens/s and acceptance.

With --draft-model PATH (or "self": the benchmarked model as its own draft)
it also runs --spec-method draft (draft kernels --draft-kernels, default
fast-int8) and adds its tokens/s, speedup and acceptance columns.

Prints, per workload, the median over --reps runs of: tokens generated,
decode tokens/s (1000 / TPOT), the [spec] acceptance numbers, the speedup.

  python3 tools/bench_spec.py [--tandem build/tandem] [--threads 2] [--reps 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("grounded", "code_edit", "open_chat")

LLAMA_SNIPPET = r"""
import json, sys, time
import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
model, threads, max_tokens, lookup, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
kw = dict(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4)) if lookup else {}
if hasattr(llama_cpp.llama_model_params, "use_extra_bufts"):
    # No AMX weight repacking: it segfaults in 0.3.36 on AMX machines (as in
    # tools/bench_llamacpp.py); llama.cpp then runs its AVX-512 VNNI kernels.
    low = llama_cpp.llama_cpp
    default_params = low.llama_model_default_params
    def model_params():
        params = default_params()
        params.use_extra_bufts = False
        return params
    low.llama_model_default_params = model_params
llm = llama_cpp.Llama(model_path=model, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False, **kw)
msgs = [{"role": "user", "content": prompt}]
t0 = time.perf_counter(); first = None; n = 0
for chunk in llm.create_chat_completion(messages=msgs, max_tokens=max_tokens, temperature=0.0, stream=True):
    if chunk["choices"][0]["delta"].get("content"):
        n += 1
        if first is None: first = time.perf_counter()
t1 = time.perf_counter()
print(json.dumps({"chunks": n, "decode_tps": (n - 1) / (t1 - first) if n > 1 and first else 0.0}))
"""


def run_tandem(tandem, model, threads, max_tokens, prompt, method, k, draft=None):
    cmd = [tandem, "generate", "--chat", "--json", "--prompt", prompt, "--max-tokens",
           str(max_tokens), "--threads", str(threads), "--spec-method", method,
           "--spec-tokens", str(k)]
    if draft:
        cmd += ["--spec-draft-model", draft[0], "--spec-draft-kernels", draft[1]]
    if model:
        cmd += ["--model", model]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(p.stdout)
    m = re.search(r"\[spec\] .*accepted \(([0-9.]+)%\); mean acceptance length ([0-9.]+)",
                  p.stderr)
    acc = (float(m.group(1)), float(m.group(2))) if m else None
    tps = 1000.0 / out["tpot_ms"] if out["tpot_ms"] > 0 else 0.0
    return {"tokens": len(out["token_ids"]), "tps": tps, "acc": acc, "ids": out["token_ids"],
            "prompt_ids": out["prompt_token_ids"]}


# SmolLM2's chat template (ChatML with its default system message) as text,
# for llama-lookup, which tokenizes a raw prompt. lookup_prompt() checks the
# rendering against the token ids Tandem's own template produced.
CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
          "Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


def lookup_prompt(tandem, model, prompt, prompt_ids):
    text = CHATML.format(prompt)
    cmd = [tandem, "tokenize", "--json", "--prompt", text] + (["--model", model] if model else [])
    ids = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    if ids["token_ids"] != prompt_ids:
        sys.exit("--llama-lookup: the ChatML rendering does not match this model's chat template "
                 "(prompt token ids differ); it is written for the bundled SmolLM2")
    return text


def run_lookup(binary, model, threads, max_tokens, text, k):
    # n_predict counts up to max_tokens + 1 (its loop stops past n_predict).
    cmd = [binary, "-m", model, "-p", text, "-n", str(max_tokens - 1), "-c", "4096", "-t",
           str(threads), "-tb", str(threads), "--temp", "0", "--spec-draft-n-max", str(k)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    log = p.stdout + p.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", log)
    enc = re.search(r"encoded\s+(\d+) tokens", log)
    if p.returncode != 0 or not m or not enc:
        sys.exit(f"llama-lookup failed (exit {p.returncode}):\n{log[-2000:]}")
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", log)
    accepted = re.search(r"n_accept\s+=\s+(\d+)", log)
    n, secs = int(m.group(1)), float(m.group(2))
    return {"tokens": n, "tps": n / secs, "encoded": int(enc.group(1)),
            "drafted": int(drafted.group(1)) if drafted else 0,
            "accepted": int(accepted.group(1)) if accepted else 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--llama-python", default="")
    ap.add_argument("--llama-lookup", default="",
                    help="llama.cpp's llama-lookup binary (tools/build_llama_lookup.sh)")
    ap.add_argument("--draft-model", default="", help='a draft GGUF, or "self"')
    ap.add_argument("--draft-kernels", default="fast-int8")
    a = ap.parse_args()
    model = a.model or os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    draft = None
    if a.draft_model:
        draft = (model if a.draft_model == "self" else a.draft_model, a.draft_kernels)
    print(f"speculative decoding benchmark: {os.path.basename(model)}, {a.threads} threads, "
          f"greedy, max {a.max_tokens} tokens, k={a.spec_tokens}, median of {a.reps}",
          file=sys.stderr)
    rows = []
    for w in WORKLOADS:
        prompt = open(os.path.join(ROOT, "tools", "spec_workloads", w + ".txt")).read().strip()
        off, on, dr = [], [], []
        for r in range(a.reps):
            print(f"  {w}: run {r + 1}/{a.reps}", file=sys.stderr)
            off.append(run_tandem(a.tandem, a.model, a.threads, a.max_tokens, prompt, "off", a.spec_tokens))
            on.append(run_tandem(a.tandem, a.model, a.threads, a.max_tokens, prompt, "ngram", a.spec_tokens))
            if draft:
                dr.append(run_tandem(a.tandem, a.model, a.threads, a.max_tokens, prompt, "draft",
                                     a.spec_tokens, draft))
        same = all(x["ids"] == off[0]["ids"] for x in off + on + dr)
        row = {
            "workload": w, "tokens": off[0]["tokens"], "identical": same,
            "off_tps": statistics.median(x["tps"] for x in off),
            "ngram_tps": statistics.median(x["tps"] for x in on),
            "acceptance_pct": on[0]["acc"][0] if on[0]["acc"] else 0.0,
            "mean_accept_len": on[0]["acc"][1] if on[0]["acc"] else 1.0,
        }
        if draft:
            row["draft_tps"] = statistics.median(x["tps"] for x in dr)
            row["draft_acceptance_pct"] = dr[0]["acc"][0] if dr[0]["acc"] else 0.0
            row["draft_accept_len"] = dr[0]["acc"][1] if dr[0]["acc"] else 1.0
        if a.llama_python:
            for lookup in (0, 1):
                vals = []
                for _ in range(a.reps):
                    p = subprocess.run([a.llama_python, "-c", LLAMA_SNIPPET, model, str(a.threads),
                                        str(a.max_tokens), str(lookup), prompt],
                                       capture_output=True, text=True, check=True)
                    vals.append(json.loads(p.stdout.strip().splitlines()[-1])["decode_tps"])
                row["llama_lookup_tps" if lookup else "llama_tps"] = statistics.median(vals)
        if a.llama_lookup:
            text = lookup_prompt(a.tandem, a.model, prompt, off[0]["prompt_ids"])
            base, look = [], []
            for r in range(a.reps):
                print(f"  {w}: llama-lookup run {r + 1}/{a.reps}", file=sys.stderr)
                base.append(run_lookup(a.llama_lookup, model, a.threads, a.max_tokens, text, 0))
                look.append(run_lookup(a.llama_lookup, model, a.threads, a.max_tokens, text,
                                       a.spec_tokens))
            if look[0]["encoded"] != len(off[0]["prompt_ids"]):
                sys.exit(f"llama-lookup encoded {look[0]['encoded']} prompt tokens, Tandem "
                         f"{len(off[0]['prompt_ids'])}")
            lk = look[0]
            row["lcpp_tokens"] = lk["tokens"]
            row["lcpp_tps"] = statistics.median(x["tps"] for x in base)
            row["lcpp_lookup_tps"] = statistics.median(x["tps"] for x in look)
            row["lcpp_accept_pct"] = 100.0 * lk["accepted"] / max(1, lk["drafted"])
            # Tokens per target forward: every forward yields one token plus
            # the drafts it accepted.
            forwards = lk["tokens"] - lk["accepted"]
            row["lcpp_accept_len"] = lk["tokens"] / max(1, forwards)
        rows.append(row)
    hdr = f"{'workload':<11}{'tokens':>7}{'same':>6}{'off tok/s':>11}{'ngram tok/s':>13}{'speedup':>9}{'accept %':>10}{'len':>6}"
    if draft:
        hdr += f"{'draft tok/s':>13}{'speedup':>9}{'accept %':>10}{'len':>6}"
    if a.llama_python:
        hdr += f"{'llama.cpp':>11}{'+lookup':>9}{'speedup':>9}{'ngram/lookup':>14}"
    if a.llama_lookup:
        hdr += (f"{'lc tokens':>10}{'llama-lookup off':>17}{'on':>8}{'speedup':>9}{'accept %':>10}"
                f"{'len':>6}{'ngram/llama-lookup':>20}")
    print(hdr)
    for r in rows:
        line = (f"{r['workload']:<11}{r['tokens']:>7}{'yes' if r['identical'] else 'NO':>6}"
                f"{r['off_tps']:>11.1f}{r['ngram_tps']:>13.1f}{r['ngram_tps'] / r['off_tps']:>8.2f}x"
                f"{r['acceptance_pct']:>10.1f}{r['mean_accept_len']:>6.2f}")
        if draft:
            line += (f"{r['draft_tps']:>13.1f}{r['draft_tps'] / r['off_tps']:>8.2f}x"
                     f"{r['draft_acceptance_pct']:>10.1f}{r['draft_accept_len']:>6.2f}")
        if a.llama_python:
            line += (f"{r['llama_tps']:>11.1f}{r['llama_lookup_tps']:>9.1f}"
                     f"{r['llama_lookup_tps'] / r['llama_tps']:>8.2f}x"
                     f"{r['ngram_tps'] / r['llama_lookup_tps']:>13.2f}x")
        if a.llama_lookup:
            line += (f"{r['lcpp_tokens']:>10}{r['lcpp_tps']:>17.1f}{r['lcpp_lookup_tps']:>8.1f}"
                     f"{r['lcpp_lookup_tps'] / r['lcpp_tps']:>8.2f}x{r['lcpp_accept_pct']:>10.1f}"
                     f"{r['lcpp_accept_len']:>6.2f}{r['ngram_tps'] / r['lcpp_lookup_tps']:>19.2f}x")
        print(line)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
