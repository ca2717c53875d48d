#!/usr/bin/env python3
"""No C++ function longer than 80 lines, except the ones listed below.

Long functions get split into named steps (issue 18); the exceptions are
code whose length is its point or that cannot be exercised here:
  - the SIMD matrix / attention kernels, whose register blocking reads best
    whole (a split would hide which accumulators live where);
  - the CUDA executor's Forward, which runs only on a GPU machine (a
    refactor there cannot be tested on this tree's CI).
Uses lizard (tools/requirements.txt) for the function boundaries; run from
the repository root, ideally with the bootstrap's .venv/bin/python.
"""
import pathlib
import sys

try:
    import lizard
except ImportError:
    sys.exit("[function-length] lizard is missing: bash scripts/bootstrap.sh installs it "
             "into .venv (tools/requirements.txt)")

MAX_LINES = 80
DIRS = ["common", "kernels", "engine", "plan", "quant", "services", "bench"]
# name (as lizard prints it) -> why it may be longer
ALLOWED = {
    "tandem::kernels::cpu::GemmT": "SIMD kernel (register blocking)",
    "tandem::kernels::cpu::Tile": "SIMD kernel (register blocking)",
    "tandem::kernels::AttendGroup64": "SIMD attention kernel",
    "tandem::engine::cuda::CudaExecutor::Forward": "runs only on a GPU machine",
}


def main() -> int:
    root = pathlib.Path(".")
    files = sorted(p for d in DIRS for p in (root / d).rglob("*.cc"))
    bad = []
    for path in files:
        for fn in lizard.analyze_file(str(path)).function_list:
            if fn.length > MAX_LINES and fn.name not in ALLOWED:
                bad.append(f"{path}:{fn.start_line}: {fn.name} has {fn.length} lines")
    if bad:
        print("\n".join(bad))
        print(f"[function-length] {len(bad)} function(s) over {MAX_LINES} lines: split them "
              "into named steps (or list a real exception in scripts/check_function_length.py)")
        return 1
    print(f"[function-length] {len(files)} files: no function over {MAX_LINES} lines "
          f"outside the {len(ALLOWED)} listed exceptions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
