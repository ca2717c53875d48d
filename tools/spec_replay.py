#!/usr/bin/env python3
"""Offline replay of n-gram speculative decoding: how fast could it be?

Greedy output does not depend on speculation, so one plain run fixes the
token sequence and the rest is arithmetic. For each workload of
tools/spec_workloads/ this runs `tandem generate --chat --json` once
(spec off), measures the cost of a forward of 1..k+1 tokens with
`tandem_bench --verify` (or takes --costs), then replays the sequence
through a mirror of the engine's policy (engine/spec/ngram_proposer.cc:
ProposeNgram; engine/scheduler.cc: WantedDrafts' adaptive k and the
back-off after a step with nothing accepted) and prints:

  accept %, len  the mirror's acceptance; equal to the [spec] line of a real
                 `--spec-method ngram` run when the mirror is in sync
  replay         speedup the policy gets at the measured forward costs
                 (a real run adds scheduling and sampling, and noise)
  free verify    the same policy if verifying k drafts cost no more than one
                 token: what the proposer alone can give
  tree M         (with --tree M) the same policy drafting up to M distinct
                 continuations (longest context first, then the most recent)
                 and verifying them as one token tree (SpecInfer / Medusa
                 style: one forward of 1 + the tree's nodes, the longest
                 accepted branch wins); Tandem has no tree attention, so this
                 only says whether one would pay here
  oracle         drafts of the true next tokens wherever they occur earlier
                 in the sequence (no n-gram context needed), best split by
                 dynamic programming at the measured costs: a bound for any
                 copy-based proposer

  python3 tools/spec_replay.py [--tandem build/tandem] [--bench build/bench/tandem_bench]
                               [--costs 4.2,4.8,5.5,6.6,7.6] [--spec-tokens 4] [--tree 3]
"""
import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("grounded", "code_edit", "open_chat")
MAX_MATCH = 16  # ngram_proposer.cc kMaxMatch


def suffix_matches(tokens, length):
    """(context length, end) of every earlier occurrence of the last `length`
    tokens, most recent first; the context counts the matching tokens before
    the end, up to MAX_MATCH (ProposeNgram's scan)."""
    n = len(tokens)
    suffix = tokens[n - length:]
    for j in range(n - length - 1, -1, -1):
        if tokens[j] != suffix[0] or tokens[j:j + length] != suffix:
            continue
        m, end = length, j + length
        while m < MAX_MATCH and end - m - 1 >= 0 and tokens[end - m - 1] == tokens[n - m - 1]:
            m += 1
        yield m, end


def propose_ngram(tokens, nmin, nmax, max_tokens):
    """Mirror of ProposeNgram: the longest suffix, its occurrence with the
    longest context (the most recent of equals), drafts capped by that context."""
    n = len(tokens)
    if max_tokens <= 0:
        return []
    for length in range(min(nmax, n - 1), nmin - 1, -1):
        best = max(suffix_matches(tokens, length), key=lambda x: x[0], default=None)
        if best is not None:
            m, end = best
            return tokens[end:min(n, end + max_tokens, end + m)]
    return []


def propose_tree(tokens, nmin, nmax, max_tokens, branches):
    """Up to `branches` distinct continuations of the suffix matches: longest
    suffix first, within one the longest context, then the most recent."""
    n, out = len(tokens), []
    for length in range(min(nmax, n - 1), nmin - 1, -1):
        # sorted() is stable: the most recent first among equal contexts.
        for _, end in sorted(suffix_matches(tokens, length), key=lambda x: -x[0]):
            c = tuple(tokens[end:min(n, end + max_tokens)])
            if c and c not in out:
                out.append(c)
            if len(out) >= branches:
                return out
    return out


def tree_nodes(branches):
    return len({tuple(b[:i]) for b in branches for i in range(1, len(b) + 1)})


def replay(prompt, out, cost, limit, nmin, nmax, max_tokens, branches=0):
    """Mirror of the scheduler's draft loop; returns (speedup, accept %, len).
    branches > 0: a token tree of that many continuations (see --tree)."""
    p, total, steps, drafts, accepted = 1, 0.0, 0, 0, 0  # token 0 comes from the prefill
    ema, skip, misses = None, 0, 0
    while p < len(out):
        cands = []
        if skip > 0:
            skip -= 1
        else:
            wanted = (math.ceil(min(ema, limit)) if ema is not None else limit) + 1
            k = min(limit, wanted, max_tokens - p - 1)
            if k > 0 and branches > 0:
                cands = propose_tree(prompt + out[:p], nmin, nmax, k, branches)
            elif k > 0:
                cands = [propose_ngram(prompt + out[:p], nmin, nmax, k)]
        cands = [c for c in cands if c]
        a = 0
        for d in cands:
            x = 0
            while x < len(d) and p + x < len(out) and d[x] == out[p + x]:
                x += 1
            a = max(a, x)
        nodes = tree_nodes(cands)  # a single chain: its length
        total += cost(1 + nodes)
        if cands:
            steps += 1
            drafts += nodes
            accepted += a
            misses = misses + 1 if a == 0 else 0
            ema = a if ema is None else 0.7 * ema + 0.3 * a
            skip = 0 if misses == 0 else min(16, 1 << (misses - 1))
        p += a + 1
    base = cost(1) * (len(out) - 1)
    return base / total, 100.0 * accepted / max(drafts, 1), (accepted + steps) / max(steps, 1)


def oracle(prompt, out, cost, limit):
    n = len(out)
    best = [0.0] * (n + 1)
    for p in range(n - 1, 0, -1):
        seq = prompt + out[:p]
        best[p] = cost(1) + best[p + 1]
        for a in range(1, min(limit, n - p - 1) + 1):
            target = out[p:p + a]
            if not any(seq[j:j + a] == target for j in range(len(seq) - a + 1)):
                break
            best[p] = min(best[p], cost(1 + a) + best[p + a + 1])
    return cost(1) * (n - 1) / best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "tandem_bench"))
    ap.add_argument("--model", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=1)
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--costs", default="", help="ms of a forward of 1, 2, ... tokens (default: measure)")
    ap.add_argument("--tree", type=int, default=0,
                    help="also replay token trees of up to this many continuations")
    a = ap.parse_args()
    k1 = 1 + a.spec_tokens * max(1, a.tree)  # the largest forward the replays verify
    model = ["--model", a.model] if a.model else []
    if a.costs:
        costs = [float(x) for x in a.costs.split(",")]
    else:
        print(f"measuring forwards of 1..{k1} tokens (tandem_bench --verify)", file=sys.stderr)
        r = subprocess.run([a.bench, "--verify", ",".join(map(str, range(1, k1 + 1))), "--context",
                            "400", "--steps", "25", "--threads", str(a.threads)] + model,
                           capture_output=True, text=True, check=True, cwd=ROOT)
        ms = json.loads(r.stdout.strip().splitlines()[-1])["verify_ms"]
        costs = [ms[str(i)] for i in range(1, k1 + 1)]
    if len(costs) < k1:
        sys.exit(f"--costs: need {k1} values for --spec-tokens {a.spec_tokens}")
    cost = lambda n: costs[n - 1]
    print("forward ms by tokens: " + " ".join(f"{i + 1}:{c:.2f}" for i, c in enumerate(costs[:k1])))
    print(f"{'workload':10s} {'tokens':>6s} {'accept %':>8s} {'len':>5s} {'replay':>7s} "
          f"{'free verify':>11s} {'oracle':>7s}" + (f" {'tree ' + str(a.tree):>8s}" if a.tree else ""))
    for w in WORKLOADS:
        prompt = open(os.path.join(ROOT, "tools", "spec_workloads", w + ".txt")).read().strip()  # as tools/bench_spec.py
        print(f"  {w}: generating", file=sys.stderr)
        r = subprocess.run([a.tandem, "generate", "--chat", "--json", "--prompt", prompt,
                            "--max-tokens", str(a.max_tokens), "--threads", str(a.threads)] + model,
                           capture_output=True, text=True, check=True, cwd=ROOT)
        g = json.loads(r.stdout)
        pr, out = g["prompt_token_ids"], g["token_ids"]
        args = (a.spec_tokens, a.ngram_min, a.ngram_max, a.max_tokens)
        speed, acc, length = replay(pr, out, cost, *args)
        free, _, _ = replay(pr, out, lambda n: 1.0, *args)
        tree = f" {replay(pr, out, cost, *args, a.tree)[0]:7.2f}x" if a.tree else ""
        print(f"{w:10s} {len(out):6d} {acc:8.1f} {length:5.2f} {speed:6.2f}x {free:10.2f}x "
              f"{oracle(pr, out, cost, a.spec_tokens):6.2f}x{tree}")


if __name__ == "__main__":
    main()
