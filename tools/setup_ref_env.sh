#!/usr/bin/env bash
# Creates .venv-ref with the reference implementations (transformers + torch on
# the CPU, gguf, llama-cpp-python, sentencepiece) used to regenerate the goldens
# in tests/data. Not needed to build or test Tandem.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-ref/bin/python ] || python3 -m venv .venv-ref
.venv-ref/bin/pip install --disable-pip-version-check -r tools/requirements-ref.txt
echo "reference env ready: .venv-ref/bin/python tools/golden_*.py" >&2
