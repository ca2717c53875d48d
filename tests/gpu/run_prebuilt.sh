#!/usr/bin/env bash
# Runs the GPU tests and benchmark from a bundle made by tests/gpu/bundle.sh,
# on a GPU machine that cannot build Tandem (a bare CUDA image: nvcc and
# cuBLAS / NCCL, but none of the C++ development packages and no network).
# Two phases, one device call each (a call carries at most 64 MiB and the
# model alone is 94 MiB):
#
#   tests/gpu/run_prebuilt.sh kernels   carry build-carry/bundle, build-carry/model-a
#       unpacks the bundle to /tmp/tandem-gpu, then: the CUDA kernel tests,
#       the executor tests on tiny models, the NCCL tests, gpu_bench on the
#       synthetic Llama-3-8B shapes; keeps the model's first part
#   tests/gpu/run_prebuilt.sh model     carry build-carry/model-b
#       (same machine, still warm) joins the model and checks its sha256,
#       then: SmolLM2 against the goldens and batch-of-64 invariance, the
#       cluster test on cuda (disaggregated on one GPU == colocated ==
#       tandem generate), `tandem generate --device cuda`, gpu_bench on
#       SmolLM2
#   tests/gpu/run_prebuilt.sh all       both in one call (a tree with the
#       whole model, e.g. a machine where the model is already in models/)
#
# Logs go to $OUT/<phase>.log when $OUT is set. Exit 1 when a test failed.
set -uo pipefail

PHASE="${1:-all}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CARRY="$ROOT/build-carry"
WORK=/tmp/tandem-gpu
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
LOG="${OUT:-/tmp}/$PHASE.log"
exec > >(tee "$LOG") 2>&1

echo "== tandem prebuilt GPU run: phase $PHASE, root $ROOT"
nvidia-smi -L || echo "warning: nvidia-smi failed"

# --- the bundle: unpacked once per machine -----------------------------------
if [[ -f "$CARRY/bundle/bundle.tar.xz" && ! -f "$WORK/.unpacked" ]]; then
  mkdir -p "$WORK"
  if command -v xz > /dev/null; then
    xz -dc "$CARRY/bundle/bundle.tar.xz" | tar -C "$WORK" -xf -
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      "$CARRY/bundle/bundle.tar.xz" "$WORK"
  fi
  touch "$WORK/.unpacked"
fi
[[ -f "$WORK/.unpacked" ]] || { echo "FAIL: no bundle (carry build-carry/bundle)"; exit 1; }
REL="$(cat "$WORK/BUILD_DIR")"
# The binaries hold the build machine's absolute paths (tests/data, models/,
# the build dir): make them resolve here.
BUILD_ROOT=/work/main
if [[ "$(realpath -m "$BUILD_ROOT")" != "$ROOT" ]]; then
  if [[ -e "$BUILD_ROOT" || -L "$BUILD_ROOT" ]]; then
    echo "note: $BUILD_ROOT exists; compiled-in paths point there"
  else
    mkdir -p "$(dirname "$BUILD_ROOT")" && ln -s "$ROOT" "$BUILD_ROOT"
  fi
fi
rm -rf "${ROOT:?}/$REL" && ln -s "$WORK/$REL" "$ROOT/$REL"
B="$ROOT/$REL"

# --- libraries: the bundle's, then cuBLAS and NCCL from this machine ----------
find_lib() {
  local name=$1 d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
           /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    [[ -e "$d/$name" ]] && { echo "$d"; return 0; }
  done
  find / -xdev -name "$name" -not -path '/proc/*' 2> /dev/null | head -1 | xargs -r dirname
}
LIBS="$B/bundle-lib"
for l in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  d="$(find_lib "$l")"
  if [[ -n "$d" ]]; then
    echo "$l: $d"
    [[ ":$LIBS:" == *":$d:"* ]] || LIBS="$LIBS:$d"
  else
    echo "warning: $l not found on this machine"
  fi
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$B/tests/cuda_ops_test" | grep -q 'not found'; then
  echo "missing libraries:"; ldd "$B/tests/cuda_ops_test" | grep 'not found'
fi

FAILED=()
# run NAME TIMEOUT CMD...: one test binary or command, its result in FAILED.
run() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "== $name"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$WORK/run.out"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc in $(( SECONDS - t0 )) s"
  [[ $rc -eq 0 ]] || FAILED+=("$name (exit $rc)")
  # A skip on a GPU machine means the test saw no device (or no model), but
  # for the no-device and two-GPU cases.
  local skips
  skips=$(grep -oE '^\[  SKIPPED \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+' "$WORK/run.out" | cut -c14- |
    grep -vE "$ALLOWED_SKIP" | sort -u)
  [[ -z "$skips" ]] || FAILED+=("$name skipped: $(echo $skips)")
}
ALLOWED_SKIP='TwoGpus|NoDevice|WithoutAGpu|MissingGpu'
GT=(--gtest_color=no --gtest_brief=0)

if [[ "$PHASE" == kernels || "$PHASE" == all ]]; then
  if [[ -f "$CARRY/model-a/model.part-a" ]]; then cp "$CARRY/model-a/model.part-a" "$WORK/"; fi
  for t in cuda_int8_math_test cuda_rmsnorm_test cuda_ops_test cuda_attention_test \
      cuda_executor_test cuda_kv_memory_test nccl_gpu_test; do
    run "$t" 150 "$B/tests/$t" "${GT[@]}"
  done
  run nccl_transport_test 150 "$B/tests/nccl_transport_test" "${GT[@]}"
  run "gpu_bench --kernels" 200 "$B/bench/gpu_bench" --kernels
  run "gpu_bench (synthetic)" 200 "$B/bench/gpu_bench" --model /nonexistent
fi

# Hardware counters of chosen kernels (Firecracker machines: ncu works
# there), e.g. NCU_KERNELS='Gemv8Kernel<2, 1, 1>;Gemv8Kernel<30, 1, 1>'.
if [[ "$PHASE" == ncu ]]; then
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)"
  IFS=';' read -r -a kernels <<< "${NCU_KERNELS:-Gemv8Kernel<(\(int\))?2, (\(int\))?1, (\(int\))?1>}"
  for k in "${kernels[@]}"; do
    run "ncu $k" 200 "$NCU" --clock-control none --kernel-name-base demangled \
      -k "regex:$k" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      "$B/bench/gpu_bench" --kernels
  done
fi

if [[ "$PHASE" == model || "$PHASE" == all ]]; then
  MODEL="$ROOT/models/$MODEL_NAME"
  if [[ ! -s "$MODEL" ]]; then
    [[ -f "$CARRY/model-b/model.part-b" ]] && cp "$CARRY/model-b/model.part-b" "$WORK/"
    mkdir -p "$ROOT/models"
    cat "$WORK/model.part-a" "$WORK/model.part-b" > "$WORK/$MODEL_NAME" 2> /dev/null
    ln -sf "$WORK/$MODEL_NAME" "$MODEL"
  fi
  if [[ "$(sha256sum < "$MODEL" | cut -d' ' -f1)" != "$(cat "$B/model.sha256")" ]]; then
    echo "FAIL: $MODEL is not the bundled model (sha256 differs; was the first part kept?)"
    exit 1
  fi
  export TANDEM_MODEL="$MODEL"
  run cuda_smollm2_test 300 "$B/tests/cuda_smollm2_test" "${GT[@]}"
  # Bit-identical disaggregated == colocated == generate needs a batch
  # invariant engine on the GPU (docs/gpu.md); the other cluster tests run as
  # users run them.
  run "cluster_test (cuda)" 300 env TANDEM_TEST_DEVICE=cuda TANDEM_TEST_BINARY="$B/tandem" \
    "$B/tests/cluster_test" "${GT[@]}" --gtest_filter='-*ThirtyTwo*'
  run "cluster_test (cuda, batch invariant)" 300 env TANDEM_TEST_DEVICE=cuda \
    TANDEM_BATCH_INVARIANT=1 TANDEM_TEST_BINARY="$B/tandem" "$B/tests/cluster_test" \
    "${GT[@]}" --gtest_filter='*ThirtyTwo*:ClusterKvDtypeTest.*'
  # The user's path: `tandem generate` greedy on both devices. Printed, not
  # a failure when they differ: the CPU runs its fast kernels (int8
  # activations) and an f16 KV cache, the GPU f32 math; cuda_smollm2_test is
  # the exact check.
  printf '%s\n' '{"prompt": "The capital of France is"}' '{"prompt": "def fibonacci(n):"}' \
    '{"prompt": "Once upon a time, in a small village"}' '{"prompt": "List three colors:"}' \
    > "$WORK/prompts.jsonl"
  # cuda-int8: TANDEM_CUDA_INT8_ACTS=1 (GemvInt8, the CPU's activation precision).
  for d in cpu cuda cuda-int8; do
    run "tandem generate --device $d" 120 env TANDEM_CUDA_INT8_ACTS="$([[ $d == cuda-int8 ]] && echo 1)" \
      "$B/tandem" generate --device "${d%-int8}" --model "$MODEL" \
      --prompts-file "$WORK/prompts.jsonl" --max-tokens 48 --json
    cp "$WORK/run.out" "$WORK/generate-$d.out"
  done
  # cuda-bf16: a bf16 KV cache on the device (half the KV bytes).
  run "tandem generate --device cuda --kv-cache-dtype bf16" 120 "$B/tandem" generate \
    --device cuda --kv-cache-dtype bf16 --model "$MODEL" --prompts-file "$WORK/prompts.jsonl" \
    --max-tokens 48 --json
  cp "$WORK/run.out" "$WORK/generate-cuda-bf16.out"
  for d in cuda cuda-int8 cuda-bf16; do
  run "generate cpu vs $d" 10 python3 - "$WORK/generate-cpu.out" "$WORK/generate-$d.out" <<'PY'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p) if l.startswith("{")]
cpu, gpu = load(sys.argv[1]), load(sys.argv[2])
assert len(cpu) == len(gpu) == 4, (len(cpu), len(gpu))
bad = 0
for c, g in zip(cpu, gpu):
    n = next((i for i, (a, b) in enumerate(zip(c["token_ids"], g["token_ids"])) if a != b), None)
    print(f"cpu ttft {c['ttft_ms']:.1f} ms tpot {c['tpot_ms']:.2f} ms | cuda ttft {g['ttft_ms']:.1f} ms "
          f"tpot {g['tpot_ms']:.2f} ms | {'identical' if n is None else f'differ at {n}'}: {g['text'][:60]!r}")
    bad += n is not None
print(f"{len(cpu) - bad} of {len(cpu)} identical for 48 tokens")
PY
  done
  # --kv-cache-memory as a fraction of the free device memory.
  run "tandem generate --device cuda --kv-cache-memory 0.5" 120 "$B/tandem" generate \
    --device cuda --model "$MODEL" --kv-cache-memory 0.5 --prompt "Hello" --max-tokens 8
  grep -q "GiB free on cuda" "$WORK/run.out" || FAILED+=("--kv-cache-memory 0.5: no budget line")
  run "gpu_bench (SmolLM2)" 300 "$B/bench/gpu_bench" --model "$MODEL" --no-synthetic
  run "gpu_bench (SmolLM2, no CUDA graphs)" 300 env TANDEM_CUDA_GRAPHS=0 "$B/bench/gpu_bench" \
    --model "$MODEL" --no-synthetic
  run "gpu_bench (SmolLM2, int8 activations)" 300 env TANDEM_CUDA_INT8_ACTS=1 \
    "$B/bench/gpu_bench" --model "$MODEL" --no-synthetic
fi

echo
if [[ ${#FAILED[@]} -gt 0 ]]; then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "OK: phase $PHASE"
