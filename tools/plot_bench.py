#!/usr/bin/env python3
"""Plots `tandem bench --out` JSON: latency percentiles vs request rate.

usage: .venv/bin/python tools/plot_bench.py BENCH.json OUT.png [MORE.json ...]

One panel per metric (TTFT, TPOT, ITL, e2e), p50 / p90 / p99 vs the request
rate of each run (fixed-concurrency runs use their measured request rate).
Extra JSON files (e.g. colocated vs disaggregated) are drawn with their own
line styles and labelled by file name.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "e2e latency")]
PCTS = [("p50", "-"), ("p90", "--"), ("p99", ":")]


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("schema") != "tandem.bench.v1":
        raise SystemExit(f"{path}: not a tandem.bench.v1 file")
    runs = doc.get("runs") or [doc]
    xs = [r.get("request_rate") or r.get("request_throughput", 0) for r in runs]
    return doc, runs, xs


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    inputs = [argv[1]] + argv[3:]
    out = argv[2]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, path in enumerate(inputs):
        doc, runs, xs = load(path)
        order = sorted(range(len(runs)), key=lambda i: xs[i])
        label = os.path.splitext(os.path.basename(path))[0] if len(inputs) > 1 else ""
        for ax, (key, title) in zip(axes.flat, METRICS):
            for pct, style in PCTS:
                ys = [runs[i].get(f"{pct}_{key}_ms", 0) for i in order]
                ax.plot([xs[i] for i in order], ys, style, marker="o",
                        color=colors[(k * 3 + PCTS.index((pct, style))) % len(colors)],
                        label=f"{label} {pct}".strip())
            ax.set_title(f"{title} (ms)")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel("ms")
            ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    first = load(inputs[0])[0]
    fig.suptitle(f"tandem bench: {first.get('model', '')} via {first.get('backend', '')}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
