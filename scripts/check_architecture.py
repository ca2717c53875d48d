#!/usr/bin/env python3
"""Checks that docs/architecture.md describes the tree as it is.

Every directory that holds tracked source files (C++, CUDA, proto, Python,
shell, CMake) and every top-level directory must be named in
docs/architecture.md: either by its path ("engine/spec/"), or by its last
component ("spec/") on a line that also names its parent's path (a table row
of the parent directory listing its subdirectories). Every path the document
names in backticks that looks like a file or directory of the tree must exist.
Exit 1 with the list of what is missing or stale.

    python3 scripts/check_architecture.py
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = re.compile(r"(\.(cc|h|cu|cuh|proto|py|sh|cmake)|CMakeLists\.txt)$")
DOC = os.path.join(ROOT, "docs", "architecture.md")


def tracked_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if f]


def main():
    files = tracked_files()
    dirs = set()
    for f in files:
        d = os.path.dirname(f)
        if SOURCE.search(f) and d:
            dirs.add(d)
        top = f.split("/")[0]
        if "/" in f and not top.startswith("."):
            dirs.add(top)
    lines = open(DOC, encoding="utf-8").read().splitlines()
    text = "\n".join(lines)

    def named(d):
        if d + "/" in text:
            return True
        parent, name = os.path.split(d)
        return any(f"`{name}/" in line and parent + "/" in line for line in lines)

    missing = sorted(d for d in dirs if not named(d))

    # Paths in backticks that start with a top-level directory of the tree
    # must exist (files, directories, or globs like `tests/*_test.cc`).
    tops = {f.split("/")[0] for f in files if "/" in f}
    existing = set(files) | {os.path.dirname(f) for f in files}
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            existing.add("/".join(parts[:i]))
    stale = []
    for ref in sorted(set(re.findall(r"`([A-Za-z0-9_./{},*-]+)`", text))):
        if ref.split("/")[0] not in tops or "*" in ref or "{" in ref:
            continue
        path = ref.rstrip("/")
        if path not in existing:
            stale.append(ref)

    for d in missing:
        print(f"architecture.md does not name the directory {d}/", file=sys.stderr)
    for r in stale:
        print(f"architecture.md names `{r}`, which is not in the tree", file=sys.stderr)
    if missing or stale:
        return 1
    print(f"[architecture] {len(dirs)} directories named, every named path exists", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
