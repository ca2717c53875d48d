#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian (bookworm) machine, run as root (or with
# sudo available): Debian packages, a Python venv in .venv, the default model.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  clang clang-format libclang-rt-14-dev lld
  libabsl-dev libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus prometheus-cpp-dev openssl libcpp-httplib-dev libboost-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  python3 python3-venv python3-pip unzip
)

log() { echo "[bootstrap] $*" >&2; }

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "Debian packages: all present"
fi

# Python venv for the project's scripts (light: no torch here; the golden
# generators use tools/setup_ref_env.sh).
if [ ! -x .venv/bin/python ]; then
  log "creating Python venv in .venv"
  /usr/bin/python3 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
# Reinstall whenever tools/requirements.txt changes (a stamp holds its hash).
req_hash=$(sha256sum tools/requirements.txt | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha256 2>/dev/null)" != "$req_hash" ]; then
  log "installing Python packages into .venv (tools/requirements.txt)"
  .venv/bin/pip install -q --disable-pip-version-check -r tools/requirements.txt
  echo "$req_hash" > .venv/.requirements.sha256
else
  log "Python packages: up to date"
fi

bash scripts/fetch_model.sh
log "done"
