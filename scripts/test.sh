#!/usr/bin/env bash
# README command 2: installs everything, builds, and runs the whole test suite:
# unit + integration tests (ctest), the same under ASan + UBSan
# (scripts/test_sanitizers.sh), the deployment checks (deploy/check.sh),
# then the GGUF parser fuzzer for a bounded time on its seed corpus (clang +
# libFuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${TANDEM_FUZZ_SECONDS:-60}

bash scripts/bootstrap.sh
bash scripts/build.sh

echo "[test] ctest" >&2
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 600)

# The same unit + integration tests built with ASan + UBSan (build-asan/);
# any sanitizer report fails. TANDEM_SANITIZERS=0 skips it (quick local runs).
if [ "${TANDEM_SANITIZERS:-1}" != "0" ]; then
  echo "[test] ASan + UBSan" >&2
  bash scripts/test_sanitizers.sh
fi

# Deployment artefacts: kustomize renders, schemas, yamllint, promtool,
# hadolint, and the dashboard's metric names against a live `tandem serve`.
echo "[test] deploy checks" >&2
bash deploy/check.sh

if [ "$FUZZ_SECONDS" -gt 0 ]; then
  echo "[test] fuzzing the GGUF parser for ${FUZZ_SECONDS}s" >&2
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF >/dev/null
  ninja -C build-fuzz -j"$(nproc)" gguf_fuzz
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp tests/fuzz/corpus/gguf/* "$work"/
  ./build-fuzz/tests/fuzz/gguf_fuzz -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 "$work" 2>&1 | tail -n 15
  echo "[test] fuzzing: no crash in ${FUZZ_SECONDS}s" >&2
fi
