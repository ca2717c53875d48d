#!/usr/bin/env bash
# README command 1: installs everything, builds, and runs the main job on the
# default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/build.sh
echo "[demo] ./build/tandem generate --prompt 'The capital of France is' --max-tokens 64" >&2
./build/tandem generate --prompt "The capital of France is" --max-tokens 64
