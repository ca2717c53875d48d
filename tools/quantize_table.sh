#!/usr/bin/env bash
# The README's quantization tables, judged by `tandem perplexity
# --kl-divergence` on the held-out text (tests/data/perplexity_text.txt)
# against the f32 reference: the input model's dequantized weights, f32
# kernels (--kernels reference), f32 KV cache. Calibration text:
# tests/data/calibration_text.txt (a different text). Three tables:
#   1. KV cache dtypes (KV_DTYPES) with the reference weights and kernels;
#   2. weights: each type x METHODS (rtn / awq / gptq / gptq-act: gptq with
#      --gptq-act-order), reference kernels
#      (f32 activations), f32 KV;
#   3. W8A8 (int8 weights x int8 activations, f32 KV): q8_0 rtn and
#      smoothquant at each of SMOOTH_ALPHAS, each with per-32-block
#      (--kernels fast-int8) and per-token (fast-int8-token) activation scales.
#
#   tools/quantize_table.sh [types...]     (default: q4_0 q4_k_m)
#
# Env: TANDEM (binary, default build/tandem), OUT (work dir, default
# /tmp/tandem_quant_table), THREADS (default 2), LOCK (a command prefix, e.g.
# "flock -o /tmp/tandem-cpu.lock"), METHODS (default "rtn awq gptq gptq-act"),
# KV_DTYPES (default "f16 bf16 int8 fp8"; empty skips table 1),
# SMOOTH_ALPHAS (default "0.5 0.8"; W8A8=0 skips table 3).
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM=${TANDEM:-build/tandem}
OUT=${OUT:-/tmp/tandem_quant_table}
THREADS=${THREADS:-2}
LOCK=${LOCK:-}
METHODS=${METHODS:-rtn awq gptq gptq-act}
KV_DTYPES=${KV_DTYPES-f16 bf16 int8 fp8}
SMOOTH_ALPHAS=${SMOOTH_ALPHAS:-0.5 0.8}
W8A8=${W8A8:-1}
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(q4_0 q4_k_m)
TEXT=tests/data/perplexity_text.txt
CALIB=tests/data/calibration_text.txt
mkdir -p "$OUT"
PPL=(perplexity --file "$TEXT" --threads "$THREADS")
if [ ! -s "$OUT/ref.kld" ]; then
  $LOCK "$TANDEM" "${PPL[@]}" --kernels reference --kv-cache-dtype f32 \
    --kl-divergence-base "$OUT/ref.kld" --json > "$OUT/ref.json"
fi
REF_PPL=$(python3 -c "import json;print(f\"{json.load(open('$OUT/ref.json'))['ppl']:.4f}\")")

# kld NAME [perplexity flags...]: runs against the base, prints the row's
# "PPL | mean KLD | p99 KLD | same top-1" cells.
kld() {
  local name=$1
  shift
  $LOCK "$TANDEM" "${PPL[@]}" "$@" --kl-divergence --kl-divergence-base "$OUT/ref.kld" \
    --json > "$OUT/$name.json"
  python3 - "$OUT/$name.json" <<'PY'
import json, sys
k = json.load(open(sys.argv[1]))["kl_divergence"]
def num(v, digits):  # small values (the KV rows) in scientific notation
    return f"{v:.2e}" if 0 < abs(v) < 1e-3 else f"{v:.{digits}f}"
print(f"{k['ppl']:.4f} ± {k['ppl_error']:.4f} | "
      f"{num(k['kld_mean']['mean'], 5)} ± {num(k['kld_mean']['error'], 5)} | "
      f"{num(k['kld_p99'], 4)} | {100 * k['same_top_p']['mean']:.2f}%")
PY
}

# quantize FILE ARGS...: quantizes, prints the seconds it took (timed inside
# $LOCK, so waiting for the lock does not count).
quantize() {
  local f=$1
  shift
  # shellcheck disable=SC2016
  $LOCK bash -c 's=$(date +%s%N); "$@" > "$0.quantize.log" 2>&1; e=$(date +%s%N)
    echo $(( (e - s + 500000000) / 1000000000 ))' \
    "$f" "$TANDEM" quantize "$@" --calibration "$CALIB" --threads "$THREADS" --out "$f"
}

if [ -n "$KV_DTYPES" ]; then
  echo "| KV cache | PPL | mean KLD | p99 KLD | same top-1 |"
  echo "|---|---|---|---|---|"
  echo "| f32 (reference) | $REF_PPL | 0 | 0 | 100% |"
  for kv in $KV_DTYPES; do
    echo "| $kv | $(kld "kv-$kv" --kernels reference --kv-cache-dtype "$kv") |"
  done
  echo
fi

echo "| type | method | PPL | mean KLD | p99 KLD | same top-1 | quantize s |"
echo "|---|---|---|---|---|---|---|"
echo "| reference (f32) | - | $REF_PPL | 0 | 0 | 100% | - |"
for type in "${TYPES[@]}"; do
  for method in $METHODS; do
    f="$OUT/$type-$method.gguf"
    margs=(--method "$method")
    [ "$method" = gptq-act ] && margs=(--method gptq --gptq-act-order)
    secs=$(quantize "$f" --type "$type" "${margs[@]}")
    echo "| $type | $method | $(kld "$type-$method" --model "$f" --kernels reference \
      --kv-cache-dtype f32) | $secs |"
  done
done

[ "$W8A8" = 1 ] || exit 0
echo
echo "| weights | activations (--kernels) | PPL | mean KLD | p99 KLD | same top-1 | quantize s |"
echo "|---|---|---|---|---|---|---|"
rows=("q8_0-rtn|q8_0 rtn|--type q8_0 --method rtn")
for a in $SMOOTH_ALPHAS; do
  rows+=("smoothquant-$a|q8_0 smoothquant a=$a|--method smoothquant --alpha $a")
done
for row in "${rows[@]}"; do
  IFS='|' read -r name label args <<< "$row"
  f="$OUT/w8a8-$name.gguf"
  # shellcheck disable=SC2086
  secs=$(quantize "$f" $args)
  for kernels in fast-int8 fast-int8-token; do
    scale=$([ "$kernels" = fast-int8 ] && echo "per 32-block" || echo "per token")
    echo "| $label | int8 $scale ($kernels) | $(kld "w8a8-$name-$kernels" --model "$f" \
      --kernels "$kernels" --kv-cache-dtype f32) | $secs |"
  done
done
