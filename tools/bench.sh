#!/usr/bin/env bash
# One-command CPU benchmark: Tandem vs llama.cpp on the same GGUF, same
# thread count, in the same run, printed as ratios.
#
#   tools/bench.sh [--model PATH] [--threads N] [--reps N] [--kernels fast|fast-int8|reference]
#
# Tandem (build-bench/bench/tandem_bench): pp512, tg128, aggregate decode at
# batch 1/4/16/32/64, a memory-bandwidth probe and the decode bound it
# implies. llama.cpp (llama-cpp-python in .venv-ref, created with
# tools/setup_ref_env.sh when missing): pp512 and tg128. Every number is the
# median of --reps runs (default 5). The machine's load average is printed
# before and after: on a shared machine, compare ratios, not absolutes.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=2
REPS=5
KERNELS=fast
BUILD=${TANDEM_BENCH_BUILD:-build-bench}
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --kernels) KERNELS=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -f "$MODEL" ] || { echo "model not found: $MODEL (scripts/fetch_model.sh)" >&2; exit 1; }
if [ ! -x .venv-ref/bin/python ] || ! .venv-ref/bin/python -c "import llama_cpp" 2>/dev/null; then
  bash tools/setup_ref_env.sh
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF -DTANDEM_TESTS=OFF >&2
fi
ninja -C "$BUILD" tandem_bench >&2

echo "load before: $(uptime)" >&2
OURS=$("$BUILD/bench/tandem_bench" --model "$MODEL" --threads "$THREADS" --reps "$REPS" \
  --kernels "$KERNELS" 2>/dev/null)
REF=$(.venv-ref/bin/python tools/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" \
  --reps "$REPS")
echo "load after:  $(uptime)" >&2

python3 - "$OURS" "$REF" <<'PY'
import json, sys
o, r = json.loads(sys.argv[1]), json.loads(sys.argv[2])
b = o["decode_batch_tok_s"]
print(f"model threads {o['threads']}, medians of {o['reps']} runs; tandem kernels {o['kernels']} ({o['isa']})")
print(f"{'test':<22}{'tandem':>12}{'llama.cpp':>12}{'ratio':>9}")
for k in ("pp", "tg"):
    name = f"{k}{o[k]} tok/s"
    print(f"{name:<22}{o[k + '_tok_s']:>12.1f}{r[k + '_tok_s']:>12.1f}{o[k + '_tok_s'] / r[k + '_tok_s']:>8.2f}x")
for n, v in b.items():
    print(f"{'decode batch ' + n + ' tok/s':<22}{v:>12.1f}{'':>12}{v / b.get('1', v):>8.2f}x own batch-1")
print(f"bandwidth probe {o['bandwidth_gb_s']:.1f} GB/s; bytes read per decode token "
      f"{o['bytes_per_token'] / 1e6:.1f} MB; decode bound {o['decode_bound_tok_s']:.0f} tok/s; "
      f"tg128 = {100 * o['tg_fraction_of_bound']:.0f}% of the bound")
print("json:", json.dumps({"tandem": o, "llama.cpp": r}))
PY
