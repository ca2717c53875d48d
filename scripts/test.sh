#!/usr/bin/env bash
# README command 2: installs everything, builds, and runs the whole test suite:
# static checks (clang-format, architecture.md vs the tree, the layering,
# clang -Wthread-safety, no function over 80 lines but the listed kernels),
# unit + integration tests (ctest), the same under ASan + UBSan
# (scripts/test_sanitizers.sh), the deployment checks (deploy/check.sh),
# then every fuzz target for a bounded time on its seed corpus (clang +
# libFuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${TANDEM_FUZZ_SECONDS:-140}
# The sanitizer run (scripts/test_sanitizers.sh, on unless
# TANDEM_SANITIZERS=0) and its build directory, which also holds the
# thread-safety-checked objects and the libFuzzer targets.
SANITIZERS=${TANDEM_SANITIZERS:-1}
ASAN_BUILD_DIR=${TANDEM_ASAN_BUILD_DIR:-build-asan}

# Wall time of each phase, printed as it ends and as a table at the end (CI
# must stay well under its limit: the table says where the time goes).
PHASES=()
phase_start=$SECONDS
phase() {  # phase NAME: the phase that just ended
  local took=$((SECONDS - phase_start))
  PHASES+=("$(printf '%-22s %5d s' "$1" "$took")")
  echo "[test] $1: ${took} s (total $SECONDS s)" >&2
  phase_start=$SECONDS
}
report_phases() {
  echo "[test] wall time by phase:" >&2
  printf '  %s\n' "${PHASES[@]}" >&2
  echo "  total                  $SECONDS s" >&2
}

bash scripts/bootstrap.sh
phase bootstrap
# The CUDA kernels for one architecture only: CI has no GPU and only checks
# that they compile (no kernel depends on __CUDA_ARCH__); a build for GPUs
# keeps the default, 80;90.
bash scripts/build.sh -DTANDEM_CUDA_ARCHITECTURES=90
phase build

# Static checks: every C++ source clang-formatted; docs/architecture.md names
# every source directory and only paths that exist; every include is of a
# target the includer links; no function over 80 lines but the listed
# kernels; clang's -Wthread-safety over every C++ source that mentions a
# capability or reaches one through project headers (GCC ignores the
# ABSL_GUARDED_BY annotations), here or after the sanitizer build.
echo "[test] static checks" >&2
bash scripts/check_format.sh
python3 scripts/check_architecture.py
python3 scripts/check_layers.py build
.venv/bin/python scripts/check_function_length.py
# With the sanitizer run, its clang build compiles with -Werror=thread-safety
# and the check below runs after it, on the sources it did not compile.
if [ "$SANITIZERS" = "0" ]; then
  python3 scripts/check_thread_safety.py build/compile_commands.json
fi

phase "static checks"
echo "[test] ctest" >&2
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 600)
phase ctest

# The same unit + integration tests built with ASan + UBSan (build-asan/);
# any sanitizer report fails. TANDEM_SANITIZERS=0 skips it (quick local runs).
if [ "$SANITIZERS" != "0" ]; then
  echo "[test] ASan + UBSan" >&2
  bash scripts/test_sanitizers.sh
  phase "ASan + UBSan"
  # Thread-safety of the sources build-asan does not compile the same way
  # (the CUDA backend's host code, the NCCL transport, the benchmarks).
  python3 scripts/check_thread_safety.py build/compile_commands.json \
    --except-built "$ASAN_BUILD_DIR"
  phase "thread-safety (rest)"
fi

# Deployment artefacts: kustomize renders, schemas, yamllint, promtool,
# hadolint, and the dashboard's metric names against a live `tandem serve`.
echo "[test] deploy checks" >&2
bash deploy/check.sh
phase "deploy checks"

# Every fuzz target (tests/fuzz/*_fuzz.cc) for a bounded time on its seed
# corpus: the GGUF reader, the JSON parser, the tokenizer and detokenizer,
# the prompt-file reader, request validation, the KV handoff stream and the
# KLD base file of `tandem perplexity`.
# TANDEM_FUZZ_SECONDS is the total fuzzing time, split evenly (gguf gets a
# double share); the targets run one per core, so the wall time is about
# that total divided by the core count.
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  targets=(gguf json tokenizer prompt_file validate kv_push kld_base)
  per=$(( FUZZ_SECONDS / (${#targets[@]} + 1) ))
  [ "$per" -lt 5 ] && per=5
  echo "[test] fuzzing ${#targets[@]} targets, ${per}s each (gguf $((2 * per))s)" >&2
  if [ "$SANITIZERS" != "0" ]; then
    # The sanitizer build (clang, ASan + UBSan, TANDEM_FUZZ=ON) already
    # linked every target with libFuzzer and ran its seed corpus.
    fuzz_dir=$ASAN_BUILD_DIR
  else
    # A build of its own: unity, as the ASan one, at -O1 -g1 (libFuzzer's
    # usual level; a quarter less build time than -O2 -g).
    fuzz_dir=build-fuzz
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 \
      "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" >/dev/null
    ninja -C build-fuzz -j"$(nproc)" "${targets[@]/%/_fuzz}"
    phase "fuzz build"
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # One target per core at a time: each is single-threaded, so on 2 cores
  # the phase takes half the wall time for the same fuzzing per target.
  fuzz_one() {  # fuzz_one TARGET SECONDS: exit code to $work/TARGET.rc
    local rc=0
    "$fuzz_dir"/tests/fuzz/"$1"_fuzz -max_total_time="$2" -rss_limit_mb=2048 \
      -timeout=10 -print_final_stats=1 "$work/$1" > "$work/$1.log" 2>&1 || rc=$?
    echo "$rc" > "$work/$1.rc"
  }
  for t in "${targets[@]}"; do
    secs=$per
    [ "$t" = gguf ] && secs=$((2 * per))
    mkdir -p "$work/$t"
    cp tests/fuzz/corpus/"$t"/* "$work/$t"/
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
    echo "[test] fuzz $t for ${secs}s" >&2
    fuzz_one "$t" "$secs" &
  done
  wait
  failed=0
  for t in "${targets[@]}"; do
    rc=$(cat "$work/$t.rc" 2>/dev/null || echo missing)
    if [ "$rc" != 0 ]; then
      tail -n 40 "$work/$t.log"
      echo "[test] fuzz $t: crash, exit $rc (the input is in the log above)" >&2
      failed=1
      continue
    fi
    grep -E "^stat::(number_of_executed_units|peak_rss_mb)" "$work/$t.log" | sed "s/^/  $t /"
  done
  [ "$failed" = 0 ] || exit 1
  echo "[test] fuzzing: no crash" >&2
  phase fuzzing
fi
report_phases
