#!/usr/bin/env bash
# One-command CPU benchmark: Tandem vs llama.cpp on the same GGUF, same
# thread count, in the same run, printed as ratios.
#
#   tools/bench.sh [--model PATH] [--threads N] [--reps N] [--kernels fast|fast-int8|fast-int8-token|reference]
#                  [--kv-cache-dtype f32|f16|bf16|int8|fp8] [--batches 1,4,16,32,64]
#
# Tandem (build-bench/bench/tandem_bench): pp512, tg128, aggregate decode at
# batch 1/4/16/32/64, a memory-bandwidth probe and the decode bound it
# implies. llama.cpp (llama-cpp-python in .venv-ref, created with
# tools/setup_ref_env.sh when missing): pp512 and tg128, with llama.cpp's
# extra (AMX) weight buffers off (they crash on our AMX VM; see
# tools/bench_llamacpp.py --extra-bufts). The KV cache: Tandem's
# --kv-cache-dtype (default f16, the engine's CPU default) against llama.cpp's
# nearest type: f32, f16 and bf16 as themselves, int8 and fp8 (1 byte per
# element) as q8_0 (llama.cpp has no fp8 cache; q8_0 turns its flash
# attention on). Every number is the
# median of --reps runs (default 5). The machine's load average is printed
# before and after: on a shared machine, compare ratios, not absolutes.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=2
REPS=5
KERNELS=fast
KV=f16
BATCHES=1,4,16,32,64
JSON_OUT=
BUILD=${TANDEM_BENCH_BUILD:-build-bench}
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --kernels) KERNELS=$2; shift 2 ;;
    --kv-cache-dtype) KV=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --json-out) JSON_OUT=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
case "$KV" in
  f32 | f16 | bf16) LLAMA_KV=$KV ;;
  int8 | fp8) LLAMA_KV=q8_0 ;;
  *) echo "--kv-cache-dtype: expected f32|f16|bf16|int8|fp8" >&2; exit 2 ;;
esac
[ -f "$MODEL" ] || { echo "model not found: $MODEL (scripts/fetch_model.sh)" >&2; exit 1; }
if [ ! -x .venv-ref/bin/python ] || ! .venv-ref/bin/python -c "import llama_cpp" 2>/dev/null; then
  bash tools/setup_ref_env.sh
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF -DTANDEM_TESTS=OFF >&2
fi
ninja -C "$BUILD" tandem_bench >&2

# Alternate the two engines round by round (one rep each) so that load
# changes on a shared machine hit both alike; medians over the rounds.
echo "load before: $(uptime)" >&2
RUNS=$(mktemp)
trap 'rm -f "$RUNS"' EXIT
for round in $(seq "$REPS"); do
  echo "round $round/$REPS" >&2
  "$BUILD/bench/tandem_bench" --model "$MODEL" --threads "$THREADS" --reps 1 \
    --kernels "$KERNELS" --kv-cache-dtype "$KV" --batches "$BATCHES" 2>/dev/null |
    sed 's/^/tandem /' >>"$RUNS"
  .venv-ref/bin/python tools/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" \
    --kv-type "$LLAMA_KV" --reps 1 | sed 's/^/llama /' >>"$RUNS"
done
echo "load after:  $(uptime)" >&2

python3 - "$RUNS" "$MODEL" "$JSON_OUT" <<'PY'
import json, os, statistics, sys
ours, ref = [], []
for line in open(sys.argv[1]):
    who, js = line.split(" ", 1)
    (ours if who == "tandem" else ref).append(json.loads(js))
med = lambda xs: statistics.median(xs)
o = {k: med([r[k] for r in ours]) for k in ("pp_tok_s", "tg_tok_s", "bandwidth_gb_s", "decode_bound_tok_s")}
r = {k: med([x[k] for x in ref]) for k in ("pp_tok_s", "tg_tok_s")}
b = {n: med([x["decode_batch_tok_s"][n] for x in ours]) for n in ours[0]["decode_batch_tok_s"]}
first = ours[0]
print(f"{os.path.basename(sys.argv[2])}; threads {first['threads']}, medians of {len(ours)} "
      f"alternating rounds; tandem kernels {first['kernels']} ({first['isa']}), "
      f"KV {first['kv_cache_dtype']}; llama.cpp {ref[0]['version']}, KV {ref[0]['kv_type']}")
print(f"{'test':<22}{'tandem':>10}{'llama.cpp':>11}{'ratio':>9}")
for k, name in (("pp", f"pp{first['pp']}"), ("tg", f"tg{first['tg']}")):
    print(f"{name + ' tok/s':<22}{o[k + '_tok_s']:>10.1f}{r[k + '_tok_s']:>11.1f}"
          f"{o[k + '_tok_s'] / r[k + '_tok_s']:>8.2f}x")
for n, v in b.items():
    print(f"{'decode batch ' + n + ' tok/s':<22}{v:>10.1f}{'':>11}{v / b.get('1', v):>8.2f}x own batch 1")
print(f"bandwidth probe {o['bandwidth_gb_s']:.1f} GB/s; bytes read per decode token "
      f"{first['bytes_per_token'] / 1e6:.1f} MB; decode bound {o['decode_bound_tok_s']:.0f} tok/s; "
      f"tg = {100 * o['tg_tok_s'] / o['decode_bound_tok_s']:.0f}% of the bound")
print("per round tg tandem / llama.cpp:",
      " ".join(f"{a['tg_tok_s']:.0f}/{c['tg_tok_s']:.0f}" for a, c in zip(ours, ref)))
print("per round pp tandem / llama.cpp:",
      " ".join(f"{a['pp_tok_s']:.0f}/{c['pp_tok_s']:.0f}" for a, c in zip(ours, ref)))
if sys.argv[3]:
    with open(sys.argv[3], "a") as f:
        f.write(json.dumps({"model": os.path.basename(sys.argv[2]), "isa": first["isa"],
                            "kernels": first["kernels"], "kv": first["kv_cache_dtype"],
                            "llama_kv": ref[0]["kv_type"], "rounds": len(ours),
                            "tandem": o, "llama": r, "batch": b}) + "\n")
PY
