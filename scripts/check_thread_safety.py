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

--except-built DIR leaves out every source that build directory DIR has
already compiled with -Werror=thread-safety (scripts/test_sanitizers.sh's
clang build does): a translation unit whose object file exists there was
checked when it compiled; a unity file stands for the sources it includes.
CI then compiles here only what that build does not (the CUDA backend's host
sources, the benchmarks).

    python3 scripts/check_thread_safety.py build/compile_commands.json [--all]
        [--except-built build-asan]
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
    args = arguments(entry)
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


UNITY_INCLUDE = re.compile(r'^\s*#\s*include\s+"(/[^"]+)"', re.M)


def arguments(entry):
    return shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])


def object_of(args, directory):
    """The object file a compile command writes (its -o argument), or None."""
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return os.path.join(directory, args[i + 1])
    return None


def defines(args, build_dir):
    """The -D flags, with the build directory's path (in e.g.
    TANDEM_BINARY_DIR) replaced, so two builds compare equal."""
    top = os.path.realpath(build_dir)
    return frozenset(a.replace(top, "<build>") for a in args if a.startswith("-D"))


def checked_in(build_dir):
    """source path -> the -D flags build_dir compiled it with, for every
    source it compiled with -Werror=thread-safety (the object file exists);
    a unity translation unit stands for the sources it includes."""
    covered = {}
    for e in json.load(open(os.path.join(build_dir, "compile_commands.json"))):
        args = arguments(e)
        obj = object_of(args, e["directory"])
        if "-Werror=thread-safety" not in args or not obj or not os.path.isfile(obj):
            continue
        f = os.path.realpath(e["file"])
        sources = [f]
        if "/Unity/unity_" in f:
            text = open(f, encoding="utf-8", errors="replace").read()
            sources = [os.path.realpath(inc) for inc in UNITY_INCLUDE.findall(text)]
        for src in sources:
            covered[src] = defines(args, build_dir)
    return covered


def main():
    argv = sys.argv[1:]
    check_all = "--all" in argv
    except_built = None
    if "--except-built" in argv:
        i = argv.index("--except-built")
        if i + 1 >= len(argv):
            print("--except-built needs a build directory", file=sys.stderr)
            return 2
        except_built = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if a != "--all"]
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
    if except_built:
        covered = checked_in(except_built)
        before = len(entries)
        # Same source, same preprocessor definitions (a source built with
        # another -D there, e.g. the CUDA executor's, is checked here).
        here = os.path.dirname(os.path.abspath(path))
        entries = [e for e in entries
                   if covered.get(os.path.realpath(e["file"])) != defines(arguments(e), here)]
        print(f"[thread-safety] {before - len(entries)} of them already compiled with "
              f"-Werror=thread-safety in {except_built}; checking the other {len(entries)}",
              file=sys.stderr)

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
