#!/usr/bin/env bash
# README command 1: installs everything, builds, and runs the main job on the
# default model: `tandem serve` (router + 1 prefill + 1 decode worker on
# loopback), one `tandem client` call against it, then a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/build.sh

PORT="${TANDEM_PORT:-50051}"
METRICS_PORT="${TANDEM_METRICS_PORT:-9090}"
workdir="$(mktemp -d)"
echo "[demo] ./build/tandem serve --port $PORT --metrics-port $METRICS_PORT" >&2
./build/tandem serve --port "$PORT" --metrics-port "$METRICS_PORT" \
  --endpoints-file "$workdir/endpoints.json" >"$workdir/serve.out" 2>"$workdir/serve.err" &
serve_pid=$!
cleanup() {
  if kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid"
    wait "$serve_pid" || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT

for _ in $(seq 1 600); do
  grep -q '^ready$' "$workdir/serve.out" 2>/dev/null && break
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    cat "$workdir/serve.err" >&2
    echo "[demo] tandem serve exited" >&2
    exit 1
  fi
  sleep 0.2
done
grep -q '^ready$' "$workdir/serve.out" || { cat "$workdir/serve.err" >&2; exit 1; }
cat "$workdir/serve.out" >&2
echo "[demo] ./build/tandem client --server 127.0.0.1:$PORT --prompt 'The capital of France is' --max-tokens 64 --stream" >&2
./build/tandem client --server "127.0.0.1:$PORT" --prompt "The capital of France is" \
  --max-tokens 64 --temperature 0 --stream
kill -TERM "$serve_pid"
wait "$serve_pid"
echo "[demo] cluster stopped (exit $?)" >&2
