#!/usr/bin/env bash
# Checks that every tracked C++ / CUDA source follows .clang-format
# (clang-format 14, Debian's clang-format package). Lists the files that do
# not and exits 1; `scripts/check_format.sh --fix` rewrites them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  echo "[format] formatted ${#files[@]} files" >&2
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  printf '[format] not clang-formatted: %s\n' "${bad[@]}" >&2
  echo "[format] ${#bad[@]} of ${#files[@]} files; fix with scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "[format] ${#files[@]} files clang-formatted" >&2
