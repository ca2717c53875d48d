#!/usr/bin/env bash
# Packs a CUDA build made on this machine for a GPU machine that cannot build
# Tandem itself (no gRPC / protobuf / abseil / prometheus-cpp development
# packages there, nothing to download): the test binaries, `tandem` and
# gpu_bench, with every shared library they load except glibc and the CUDA
# driver, cuBLAS and NCCL (which the GPU machine has), into one tar.xz; and the
# default model split in two parts (a device call carries at most 64 MiB).
#
#   tests/gpu/bundle.sh [BUILD_DIR] [OUT_DIR]
#       BUILD_DIR  a configured -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON
#                  -DTANDEM_NATIVE=OFF build (default build-gpu; NATIVE off so
#                  the code runs on the GPU machine's CPU, whatever it is)
#       OUT_DIR    default build-carry: OUT_DIR/bundle (bundle.tar.xz) and
#                  OUT_DIR/model-a, OUT_DIR/model-b (the model's two parts)
#
# tests/gpu/run_prebuilt.sh unpacks and runs it there; docs/gpu.md says how.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(realpath "${1:-$ROOT/build-gpu}")"
OUT="$(realpath -m "${2:-$ROOT/build-carry}")"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
BINARIES=(tandem bench/gpu_bench)
for f in "$ROOT"/tests/cuda/*_test.cc "$ROOT"/tests/gpu/*_test.cc; do
  BINARIES+=("tests/$(basename "$f" .cc)")
done
BINARIES+=(tests/nccl_transport_test tests/cluster_test)

grep -q '^TANDEM_NATIVE:BOOL=OFF' "$BUILD/CMakeCache.txt" ||
  { echo "bundle.sh: $BUILD is not a -DTANDEM_NATIVE=OFF build" >&2; exit 2; }
echo "== build: ${BINARIES[*]##*/}"
cmake --build "$BUILD" --parallel "${JOBS:-2}" --target "${BINARIES[@]##*/}"

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
REL="${BUILD#"$ROOT"/}"
mkdir -p "$STAGE/$REL/bundle-lib"
for b in "${BINARIES[@]}"; do
  mkdir -p "$STAGE/$REL/$(dirname "$b")"
  strip -o "$STAGE/$REL/$b" "$BUILD/$b"
done
# Shared libraries but glibc's, the dynamic loader, the CUDA driver, cuBLAS
# and NCCL (found on the GPU machine by run_prebuilt.sh).
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libnccl)'
for b in "${BINARIES[@]}"; do
  ldd "$BUILD/$b" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $SKIP ]] && continue
  cp -L "$path" "$STAGE/$REL/bundle-lib/$name"
done
sha256sum "$MODEL" | awk '{print $1}' > "$STAGE/$REL/model.sha256"
echo "$REL" > "$STAGE/BUILD_DIR"

rm -rf "$OUT"
mkdir -p "$OUT/bundle" "$OUT/model-a" "$OUT/model-b"
echo "== pack $(du -sh "$STAGE" | cut -f1) -> $OUT/bundle/bundle.tar.xz"
tar -C "$STAGE" -cf - . | xz -T2 -6 > "$OUT/bundle/bundle.tar.xz"
# Part a travels with the bundle (together under 64 MiB with the tree), part
# b in the next call.
bundle_bytes=$(stat -c %s "$OUT/bundle/bundle.tar.xz")
tree_bytes=$(git -C "$ROOT" ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
a_bytes=$(( 64 * 1048576 - bundle_bytes - tree_bytes - 4 * 1048576 ))
model_bytes=$(stat -c %s "$MODEL")
(( a_bytes > model_bytes - 60 * 1048576 )) ||
  { echo "bundle.sh: bundle too large to leave room for the model's first part" >&2; exit 1; }
head -c "$a_bytes" "$MODEL" > "$OUT/model-a/model.part-a"
tail -c +"$(( a_bytes + 1 ))" "$MODEL" > "$OUT/model-b/model.part-b"
ls -la "$OUT"/*/
echo "== carry: build-carry/bundle build-carry/model-a (first call), build-carry/model-b (second)"
