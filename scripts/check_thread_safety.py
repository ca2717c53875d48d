#!/usr/bin/env python3
"""Checks the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations.

GCC ignores Abseil's thread-safety annotations; clang checks them with
-Wthread-safety. This runs clang++ -fsyntax-only -Wthread-safety
-Werror=thread-safety over every C++ source of a CMake build (its
compile_commands.json, so the flags and include paths are the build's), two
files at a time, and fails on the first report. CUDA sources are skipped
(nvcc builds them); generated protobuf sources too.

    python3 scripts/check_thread_safety.py build/compile_commands.json
"""
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CLANG = os.environ.get("CLANGXX", "clang++")
# GCC flags clang does not know, dropped.
GCC_ONLY = {"-fno-semantic-interposition"}


def command_for(entry):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out = [CLANG, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
           "-Wno-unknown-warning-option"]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = True
            continue
        if a in GCC_ONLY or a.startswith("-W"):
            continue
        out.append(a)
    out.append(entry["file"])
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "build/compile_commands.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    entries = []
    for e in json.load(open(path)):
        f = e["file"]
        if not f.endswith(".cc") or not f.startswith(root + os.sep):
            continue
        rel = os.path.relpath(f, root)
        if rel.startswith("build") or ".pb." in rel:
            continue
        entries.append(e)
    entries.sort(key=lambda e: e["file"])

    def run(e):
        r = subprocess.run(command_for(e), cwd=e["directory"], capture_output=True, text=True)
        return e["file"], r.returncode, r.stderr

    failed = 0
    with ThreadPoolExecutor(max_workers=int(os.environ.get("JOBS", "2"))) as pool:
        for i, (f, rc, err) in enumerate(pool.map(run, entries), 1):
            if rc != 0:
                failed += 1
                sys.stderr.write(err)
            if i % 20 == 0 or i == len(entries):
                print(f"[thread-safety] {i}/{len(entries)} files", file=sys.stderr, flush=True)
    if failed:
        print(f"[thread-safety] {failed} file(s) with reports", file=sys.stderr)
        return 1
    print(f"[thread-safety] {len(entries)} files clean", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
