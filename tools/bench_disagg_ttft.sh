#!/bin/bash
# Colocated vs disaggregated TTFT / TPOT on this machine (README, "Disaggregated
# TTFT"). For each case: start `tandem serve` (colocated, disaggregated with
# every prompt remote, disaggregated with the default pd-decider), run a
# closed-loop `tandem bench`, stop it. Prints a table of medians, then for
# every disaggregated setup its TPOT p50 and TTFT p99 as ratios to the
# colocated run of the same round (the rounds run the setups back to back, so
# a ratio compares runs minutes apart, not the VM's speed in different
# rounds) and how many rounds it was no worse. Needs ./build/tandem
# (scripts/build.sh) and python3.
#
#   tools/bench_disagg_ttft.sh [REPS=3]
#   CASES="32:40 64:40" tools/bench_disagg_ttft.sh 1      # streams:prompt_tokens
#   SETUPS="colocated default" CASES="32:40" tools/bench_disagg_ttft.sh 10
#   PORT=52051 METRICS_PORT=19190 OUTPUT_LEN=128 tools/bench_disagg_ttft.sh
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
cases=${CASES:-"32:40 64:40 32:256"}
setups=${SETUPS:-"colocated remote default"}
port=${PORT:-52051}
mport=${METRICS_PORT:-19190}
out_len=${OUTPUT_LEN:-128}
dir=$(mktemp -d /tmp/tandem_disagg_ttft.XXXXXX)
echo "results in $dir" >&2

run() {  # name serve-args...
  local name=$1; shift
  local ep=$dir/$name.endpoints.json
  ./build/tandem serve --port "$port" --metrics-port "$mport" --http-port -1 \
      --endpoints-file "$ep" "$@" >"$dir/$name.serve.log" 2>&1 &
  local sp=$!
  for _ in $(seq 600); do [ -s "$ep" ] && break; sleep 0.5; done
  [ -s "$ep" ] || { echo "serve did not start: $dir/$name.serve.log" >&2; kill $sp; exit 1; }
  ./build/tandem bench --server "127.0.0.1:$port" --concurrency "$conc" \
      --num-requests $((conc * 2)) --warmup-requests 4 --input-len "$inlen" \
      --output-len "$out_len" --seed 1 --no-progress --out "$dir/$name.json" \
      >"$dir/$name.txt" 2>&1
  kill -TERM $sp; wait $sp || true
}

for rep in $(seq "$reps"); do
  for c in $cases; do
    conc=${c%%:*}; inlen=${c##*:}
    for setup in $setups; do
      case $setup in
        colocated) run "c${conc}_in${inlen}_colocated_r$rep" --colocated ;;
        remote) run "c${conc}_in${inlen}_remote_r$rep" --remote-prefill-min-tokens 0 ;;
        default) run "c${conc}_in${inlen}_default_r$rep" ;;
        *) echo "unknown setup '$setup' (colocated, remote, default)" >&2; exit 2 ;;
      esac
    done
    echo "rep $rep: $conc streams x $inlen prompt tokens done" >&2
  done
done

python3 - "$dir" "$reps" "$setups" $cases <<'PY'
import json, statistics as st, sys
d, reps, setups, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
print("| streams | prompt tokens | setup | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | e2e p99 ms |")
print("|---|---|---|---|---|---|---|")
for c in cases:
    conc, inlen = c.split(":")
    for setup in setups:
        rs = [json.load(open(f"{d}/c{conc}_in{inlen}_{setup}_r{k}.json"))["runs"][0]
              for k in range(1, reps + 1)]
        m = lambda key: st.median(r[key] for r in rs)
        print(f"| {conc} | {inlen} | {setup} | {m('output_tokens_per_second'):.0f} | "
              f"{m('p50_ttft_ms'):.0f} / {m('p99_ttft_ms'):.0f} | "
              f"{m('p50_tpot_ms'):.1f} / {m('p99_tpot_ms'):.1f} | {m('p99_e2e_ms'):.0f} |")
if "colocated" in setups and len(setups) > 1:
    print()
    print("| streams | prompt tokens | setup | TPOT p50 / colocated, per round | median | rounds <= 1.00 | TTFT p99 / colocated, median |")
    print("|---|---|---|---|---|---|---|")
    for c in cases:
        conc, inlen = c.split(":")
        run = lambda setup, k: json.load(open(f"{d}/c{conc}_in{inlen}_{setup}_r{k}.json"))["runs"][0]
        for setup in (s for s in setups if s != "colocated"):
            tpot = [run(setup, k)["p50_tpot_ms"] / run("colocated", k)["p50_tpot_ms"]
                    for k in range(1, reps + 1)]
            ttft = [run(setup, k)["p99_ttft_ms"] / run("colocated", k)["p99_ttft_ms"]
                    for k in range(1, reps + 1)]
            print(f"| {conc} | {inlen} | {setup} | {' '.join(f'{x:.3f}' for x in tpot)} | "
                  f"{st.median(tpot):.3f} | {sum(x <= 1.0 for x in tpot)} of {reps} | "
                  f"{st.median(ttft):.2f} |")
PY
