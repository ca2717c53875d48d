#!/usr/bin/env bash
# Builds and runs the GPU tests on a machine with an NVIDIA GPU:
#   - tests/gpu/   (ctest label "gpu"): the NCCL KV transport on real CUDA +
#     NCCL: device copies, a one-rank communicator sending to itself through
#     the transport's data path (packing, upload, grouped ncclSend/ncclRecv,
#     download, unpacking), init / receive timeouts and ncclCommAbort
#     recovery, and (with two GPUs) sender -> receiver end to end over gRPC;
#   - tests/cuda/  (ctest label "cuda"): the CUDA kernels against the CPU
#     references and the CUDA executor against the CPU executor;
# plus the CPU tests of the transport (nccl_transport_test) in the same
# NCCL-enabled build, then bench/gpu_bench (prefill and decode tok/s at batch
# 1/16/64 for SmolLM2-135M Q4_1 and a synthetic Llama-3-8B shape in BF16 and
# Q4_0, next to the HBM-bandwidth bound; TANDEM_GPU_BENCH=0 skips it).
#
#   tests/gpu/run.sh [BUILD_DIR]        (default: build-gpu at the repo root)
#
# Configures its own build dir with -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON (fails
# when nvcc, cudart or NCCL are missing), builds only the test binaries it
# runs, runs them with ctest, prints a summary and exits nonzero when a test
# failed, none ran, or a test skipped that must run on a GPU machine (the
# two-GPU test may skip on one GPU). Environment: JOBS (build parallelism,
# default nproc), TANDEM_GPU_ALLOW_SKIP=1 (accept every skip),
# CMAKE_CUDA_ARCHITECTURES (passed through when set).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
# Skips that are fine on a GPU machine: the two-GPU test on one GPU, and the
# tests that check the no-device behaviour.
ALLOWED_SKIP='TwoGpus|NoDevice|WithoutAGpu|MissingGpu'

echo "== tandem GPU tests: $ROOT -> $BUILD"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi -L || true
else
  echo "warning: nvidia-smi not found"
fi

GEN=()
if command -v ninja > /dev/null; then GEN=(-G Ninja); fi
CFG=(-DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON -DTANDEM_TESTS=ON)
if [[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]]; then
  CFG+=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
fi
if [[ ! -f "$BUILD/CMakeCache.txt" ]] || ! grep -q '^TANDEM_NCCL:STRING=ON' "$BUILD/CMakeCache.txt"; then
  echo "== configure"
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" "${CFG[@]}"
else
  cmake "$BUILD" > /dev/null
fi

# The test binaries: one per tests/gpu/*_test.cc and tests/cuda/*_test.cc.
TARGETS=(nccl_transport_test)
BENCH="${TANDEM_GPU_BENCH:-1}"
if [[ "$BENCH" == "1" ]]; then TARGETS+=(gpu_bench); fi
for f in "$ROOT"/tests/gpu/*_test.cc "$ROOT"/tests/cuda/*_test.cc; do
  [[ -e "$f" ]] && TARGETS+=("$(basename "$f" .cc)")
done
echo "== build: ${TARGETS[*]}"
cmake --build "$BUILD" --parallel "$JOBS" --target "${TARGETS[@]}"

LOG="$BUILD/gpu-tests.log"
echo "== run (log: $LOG)"
set +e
(cd "$BUILD" && ctest -L '^(gpu|cuda)$' --output-on-failure --timeout 600) 2>&1 | tee "$LOG"
GPU_RC=${PIPESTATUS[0]}
(cd "$BUILD" && ctest -R '^(Nccl|KvBlockPacking)' -LE '^gpu$' --output-on-failure --timeout 600) \
  2>&1 | tee -a "$LOG"
CPU_RC=${PIPESTATUS[0]}
set -e
CTEST_RC=$(( GPU_RC != 0 || CPU_RC != 0 ))

BENCH_RC=0
if [[ "$BENCH" == "1" ]]; then
  echo "== bench/gpu_bench (log: $BUILD/gpu-bench.log)"
  set +e
  timeout 300 "$BUILD/bench/gpu_bench" --model "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
    2>&1 | tee "$BUILD/gpu-bench.log"
  BENCH_RC=${PIPESTATUS[0]}
  set -e
fi

# Summary from ctest's per-test lines ("Test #N: name ....   Passed / ***Failed / ***Skipped").
passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$LOG" || true)
failed=$(grep -E 'Test +#[0-9]+: ' "$LOG" | grep -cE '\*\*\*(Failed|Exception|Timeout)|Not Run' || true)
skipped_lines=$(grep -E 'Test +#[0-9]+: .*\*\*\*Skipped' "$LOG" || true)
skipped=$(printf '%s' "$skipped_lines" | grep -c . || true)
bad_skips=$(printf '%s\n' "$skipped_lines" | grep -vE "$ALLOWED_SKIP" | grep . || true)
echo
echo "== summary: $passed passed, $failed failed, $skipped skipped"
if [[ -n "$skipped_lines" ]]; then printf 'skipped:\n%s\n' "$skipped_lines"; fi
if [[ -n "$bad_skips" ]]; then
  echo "note: a skip above (without an allowed reason) means the tests saw no usable CUDA device"
fi
status=0
if [[ "$CTEST_RC" -ne 0 || "$failed" -ne 0 ]]; then
  echo "FAIL: ctest exit codes gpu=$GPU_RC cpu=$CPU_RC, $failed failed"
  status=1
fi
if [[ "$BENCH_RC" -ne 0 ]]; then
  echo "FAIL: gpu_bench exit code $BENCH_RC"
  status=1
fi
if [[ "$passed" -eq 0 ]]; then
  echo "FAIL: no test passed"
  status=1
fi
if [[ -n "$bad_skips" && "${TANDEM_GPU_ALLOW_SKIP:-0}" != "1" ]]; then
  echo "FAIL: GPU tests skipped on a GPU run (TANDEM_GPU_ALLOW_SKIP=1 accepts that)"
  status=1
fi
[[ $status -eq 0 ]] && echo "OK"
exit $status
