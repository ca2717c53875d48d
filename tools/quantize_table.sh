#!/usr/bin/env bash
# The README's quantization table: the bundled model quantized with
# rtn / awq / gptq at each type, judged by `tandem perplexity` on the held-out
# text (tests/data/perplexity_text.txt) against the f32 reference (the input
# model's dequantized weights, f32 kernels, f32 KV cache). Calibration text:
# tests/data/calibration_text.txt (a different text).
#
#   tools/quantize_table.sh [types...]     (default: q4_0 q4_k_m)
#
# Env: TANDEM (binary, default build/tandem), OUT (work dir, default
# /tmp/tandem_quant_table), THREADS (default 2), LOCK (a command prefix, e.g.
# "flock -o /tmp/tandem-cpu.lock"), METHODS (default "rtn awq gptq").
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM=${TANDEM:-build/tandem}
OUT=${OUT:-/tmp/tandem_quant_table}
THREADS=${THREADS:-2}
LOCK=${LOCK:-}
METHODS=${METHODS:-rtn awq gptq}
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(q4_0 q4_k_m)
TEXT=tests/data/perplexity_text.txt
CALIB=tests/data/calibration_text.txt
mkdir -p "$OUT"
PPL=(perplexity --file "$TEXT" --kernels reference --kv-cache-dtype f32 --threads "$THREADS")
if [ ! -s "$OUT/ref.kld" ]; then
  $LOCK "$TANDEM" "${PPL[@]}" --kl-divergence-base "$OUT/ref.kld" --json > "$OUT/ref.json"
fi
echo "| type | method | PPL | mean KLD | p99 KLD | same top-1 | quantize s |"
echo "|---|---|---|---|---|---|---|"
python3 -c "import json;j=json.load(open('$OUT/ref.json'));print(f\"| reference (f32) | - | {j['ppl']:.4f} | 0 | 0 | 100% | - |\")"
for type in "${TYPES[@]}"; do
  for method in $METHODS; do
    f="$OUT/$type-$method.gguf"
    start=$(date +%s.%N)
    $LOCK "$TANDEM" quantize --type "$type" --method "$method" --calibration "$CALIB" \
      --threads "$THREADS" --out "$f" > "$OUT/$type-$method.quantize.log" 2>&1
    secs=$(python3 -c "print(f'{$(date +%s.%N) - $start:.0f}')")
    $LOCK "$TANDEM" "${PPL[@]}" --model "$f" --kl-divergence --kl-divergence-base "$OUT/ref.kld" \
      --json > "$OUT/$type-$method.json"
    python3 - "$OUT/$type-$method.json" "$type" "$method" "$secs" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
k = j["kl_divergence"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {k['ppl']:.4f} ± {k['ppl_error']:.4f} | "
      f"{k['kld_mean']['mean']:.5f} ± {k['kld_mean']['error']:.5f} | {k['kld_p99']:.4f} | "
      f"{100 * k['same_top_p']['mean']:.2f}% | {sys.argv[4]} |")
PY
  done
done
