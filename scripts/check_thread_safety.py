#!/usr/bin/env python3
"""Checks the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations.

GCC ignores Abseil's thread-safety annotations; clang checks them with
-Wthread-safety. This runs clang++ -fsyntax-only -Wthread-safety
-Werror=thread-safety over every C++ source of a CMake build (its
compile_commands.json, so the flags and include paths are the build's), two
files at a time, and fails on the first report. CUDA sources are skipped
(nvcc builds them); generated protobuf sources too.

Only sources where the analysis can report anything are compiled: those
that mention a capability (an ABSL_ thread-safety annotation, absl::Mutex
and its scoped locks, absl::CondVar) themselves or in a project header they
include, directly or through other project headers. Without one the
analysis has nothing to check, and skipping those sources (three in four)
takes about 4 minutes off CI on 2 cores. --all compiles every source.

    python3 scripts/check_thread_safety.py build/compile_commands.json [--all]
"""
import json
import os
import re
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


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CAPABILITY = re.compile(r"\bABSL_[A-Z_]*(GUARDED_BY|LOCKS?_|LOCKABLE|CAPABILITY|ACQUIRE|RELEASE|"
                        r"EXCLUSIVE|SHARED|NO_THREAD_SAFETY)|\babsl::(Mutex|CondVar|ReaderMutexLock|"
                        r"WriterMutexLock)")


def mentions_capability(root):
    """path -> whether the file or a project header it reaches mentions one.
    Each file is read once; each query walks its own include graph (a
    per-query visited set, so include cycles cannot cache a wrong answer)."""
    scanned = {}  # path -> (mentions a capability, included project paths)

    def scan(path):
        if path not in scanned:
            text = open(path, encoding="utf-8", errors="replace").read()
            scanned[path] = (bool(CAPABILITY.search(text)),
                             [os.path.join(root, inc) for inc in INCLUDE.findall(text)])
        return scanned[path]

    def reaches(path):
        seen, stack = set(), [path]
        while stack:
            f = stack.pop()
            if f in seen or not os.path.isfile(f):
                continue
            seen.add(f)
            found, includes = scan(f)
            if found:
                return True
            stack.extend(includes)
        return False

    return reaches


def main():
    args = [a for a in sys.argv[1:] if a != "--all"]
    check_all = "--all" in sys.argv[1:]
    path = args[0] if args else "build/compile_commands.json"
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
    total = len(entries)
    if not check_all:
        relevant = mentions_capability(root)
        entries = [e for e in entries if relevant(e["file"])]
        print(f"[thread-safety] {len(entries)} of {total} sources reach a capability "
              "(the others have nothing to check; --all compiles them too)", file=sys.stderr)

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
