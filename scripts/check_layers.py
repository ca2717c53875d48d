#!/usr/bin/env python3
"""Checks the layering: a target may include only headers of what it links.

Every target's include path is the source root (so `#include "engine/x.h"`
reads the same everywhere); what keeps the layers apart is this check. It
asks CMake for the link graph (--graphviz), maps every project source to its
target (compile_commands.json) and every project header to the target whose
sources share its directory, then follows each source's `#include "..."`
lines (and those of the project headers it reaches): a header owned by a
target that is neither the including target nor among its transitive link
dependencies is a layering violation. Exit 1 listing them.

    python3 scripts/check_layers.py build
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Deliberate upward includes, each with its reason.
ALLOWED = {
    # The CUDA NCCL ops implement the NcclOps interface (a header-only
    # abstract class) that the transfer layer declares and links them through.
    ("services/transfer/cuda/nccl_ops_cuda.cc", "services/transfer/nccl_ops.h"),
}


def link_graph(build):
    with tempfile.TemporaryDirectory() as tmp:
        dot = os.path.join(tmp, "g.dot")
        subprocess.run(["cmake", f"--graphviz={dot}", "."], cwd=build, check=True,
                       capture_output=True)
        text = open(dot).read()
    names = dict(re.findall(r'"(node\d+)" \[ label = "([^"]+)"', text))
    deps = defaultdict(set)
    for a, b in re.findall(r'"(node\d+)" -> "(node\d+)"', text):
        deps[names[a]].add(names[b])
    return deps


def closure(deps, target):
    seen, stack = set(), [target]
    while stack:
        t = stack.pop()
        for d in deps.get(t, ()):
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return seen


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
    deps = link_graph(build)
    entries = json.load(open(os.path.join(build, "compile_commands.json")))
    target_of = {}  # source (relative) -> target
    for e in entries:
        f = os.path.relpath(e["file"], ROOT)
        if f.startswith(".."):
            continue
        cmd = e.get("command") or " ".join(e["arguments"])
        m = re.search(r"CMakeFiles/([^/ ]+)\.dir/", cmd)
        if m:
            target_of[f] = m.group(1)
    dir_owner = defaultdict(set)
    for f, t in target_of.items():
        if not f.startswith("tests/") and not f.startswith("build"):
            dir_owner[os.path.dirname(f)].add(t)

    def owner(header):
        if header.startswith("tandem/v1/"):
            return "tandem_proto"
        d = os.path.dirname(header)
        while True:
            if len(dir_owner.get(d, ())) == 1:
                return next(iter(dir_owner[d]))
            # A directory of headers only (kernels/): the unique owner of its subdirectories.
            below = {t for k, ts in dir_owner.items() if k.startswith(d + "/") for t in ts}
            if len(below) == 1:
                return next(iter(below))
            return None

    violations = []
    for src, target in sorted(target_of.items()):
        allowed = closure(deps, target) | {target}
        seen, stack = set(), [src]
        while stack:
            f = stack.pop()
            path = os.path.join(ROOT, f)
            if f in seen or not os.path.exists(path):
                continue
            seen.add(f)
            for inc in INCLUDE.findall(open(path, encoding="utf-8", errors="replace").read()):
                if not os.path.exists(os.path.join(ROOT, inc)) and not inc.startswith("tandem/v1/"):
                    continue  # a system or generated header
                o = owner(inc)
                if (o is not None and o not in allowed and not inc.startswith("tests/")
                        and (src, inc) not in ALLOWED):
                    violations.append(f"{f} ({target}) includes {inc} of {o}, which {target} does not link")
                if not inc.startswith("tandem/v1/") and inc not in seen:
                    stack.append(inc)
    for v in sorted(set(violations)):
        print(v, file=sys.stderr)
    if violations:
        print(f"[layers] {len(set(violations))} layering violation(s)", file=sys.stderr)
        return 1
    print(f"[layers] {len(target_of)} sources: every include is of a linked target", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
