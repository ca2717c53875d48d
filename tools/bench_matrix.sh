#!/usr/bin/env bash
# The weight-type x KV-dtype x ISA matrix of tools/bench.sh (Tandem vs
# llama.cpp on the same file and threads, alternating rounds, medians):
# pp512, tg128 and aggregate decode at batch 32 (and our batch 1 for the
# batch-32 / batch-1 ratio), printed as one markdown table.
#
#   tools/bench_matrix.sh [--reps N] [--threads N] [--isas "native avx512vnni"]
#                         [--types "q4_1 q4_k_m q8_0"] [--kv "f32 f16 bf16 int8 fp8"]
#
# Weight files: the bundled Q4_1, and Q4_K_M / Q8_0 made from it by
# `tandem quantize` (rtn; the reference weights are the dequantized Q4_1)
# into models/ when missing. Every weight type runs with the default KV
# cache (f16); the bundled Q4_1 also runs with every KV dtype in --kv.
# "native" is the ISA the CPU picks (AMX where present); the others are
# forced with TANDEM_KERNEL_ISA (llama.cpp runs its own best kernels in
# every row). Long: about a minute per row and rep on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3
THREADS=2
ISAS="native avx512vnni"
TYPES="q4_1 q4_k_m q8_0"
KVS="f32 f16 bf16 int8 fp8"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --isas) ISAS=$2; shift 2 ;;
    --types) TYPES=$2; shift 2 ;;
    --kv) KVS=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
BUNDLED=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$BUNDLED" ] || bash scripts/fetch_model.sh
[ -x build/tandem ] || bash scripts/build.sh

model_for() {  # weight type -> GGUF path (made with tandem quantize when missing)
  local t=$1
  if [ "$t" = q4_1 ]; then echo "$BUNDLED"; return; fi
  local out="models/SmolLM2-135M-Instruct.${t^^}.tandem.gguf"
  if [ ! -f "$out" ]; then
    echo "[bench_matrix] making $out (tandem quantize --type $t --method rtn)" >&2
    build/tandem quantize --model "$BUNDLED" --type "$t" --method rtn --out "$out" >&2
  fi
  echo "$out"
}

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
rows=()
for t in $TYPES; do
  rows+=("$t f16")
  if [ "$t" = q4_1 ]; then
    for kv in $KVS; do [ "$kv" = f16 ] || rows+=("$t $kv"); done
  fi
done
n=0
total=$(( ${#rows[@]} * $(echo "$ISAS" | wc -w) ))
for isa in $ISAS; do
  for row in "${rows[@]}"; do
    read -r t kv <<<"$row"
    n=$((n + 1))
    model=$(model_for "$t")
    echo "[bench_matrix] $n/$total: $t, KV $kv, ISA $isa" >&2
    env_isa=()
    [ "$isa" = native ] || env_isa=(TANDEM_KERNEL_ISA="$isa")
    env "${env_isa[@]}" bash tools/bench.sh --model "$model" --threads "$THREADS" \
      --reps "$REPS" --kv-cache-dtype "$kv" --batches 1,32 --json-out "$OUT" >&2
  done
done

python3 - "$OUT" <<'PY'
import json, sys
print("| weights | KV (ours / llama.cpp) | ISA | pp512 ours / llama.cpp | ratio | tg128 ours / llama.cpp | ratio | batch 32 tok/s | / our batch 1 |")
print("|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    o, l, b = r["tandem"], r["llama"], r["batch"]
    print(f"| {r['model']} | {r['kv']} / {r['llama_kv']} | {r['isa']} "
          f"| {o['pp_tok_s']:.0f} / {l['pp_tok_s']:.0f} | {o['pp_tok_s'] / l['pp_tok_s']:.2f}x "
          f"| {o['tg_tok_s']:.0f} / {l['tg_tok_s']:.0f} | {o['tg_tok_s'] / l['tg_tok_s']:.2f}x "
          f"| {b['32']:.0f} | {b['32'] / b['1']:.2f}x |")
PY
