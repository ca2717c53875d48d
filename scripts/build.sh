#!/usr/bin/env bash
# Configures and builds Tandem in build/ (Release, Ninja, ccache when present).
# Extra arguments go to cmake's configure step, e.g. -DTANDEM_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${TANDEM_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$BUILD_DIR" -j"$(nproc)"
