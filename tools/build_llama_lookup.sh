#!/usr/bin/env bash
# Builds llama.cpp's C++ prompt-lookup decoder, `llama-lookup` (examples/lookup),
# from the llama.cpp sources vendored in the llama-cpp-python sdist of the
# version tools/bench_llamacpp.py measures, for `tools/bench_spec.py
# --llama-lookup DIR`. Native CPU flags, static, no CURL; the binary lands
# in DIR/bin/llama-lookup (DIR defaults to build-llamacpp/). Not needed to
# build or test Tandem. About 5-10 minutes on 2 cores.
#
#   tools/build_llama_lookup.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=${1:-build-llamacpp}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p "$DIR/src"
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "[build_llama_lookup] downloading the llama-cpp-python $VERSION sdist" >&2
  "$PY" -m pip download --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$DIR/src" >&2
  tar xzf "$DIR/src/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/src"
fi
echo "[build_llama_lookup] configuring $SRC" >&2
cmake -S "$SRC" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >&2
echo "[build_llama_lookup] building llama-lookup" >&2
cmake --build "$DIR/build" --target llama-lookup -j "$(nproc)" >&2
mkdir -p "$DIR/bin"
cp "$DIR/build/bin/llama-lookup" "$DIR/bin/"
echo "$DIR/bin/llama-lookup"
