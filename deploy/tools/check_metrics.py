#!/usr/bin/env python3
"""Every PromQL expression in the Grafana dashboard, the Prometheus rules and
the prometheus-adapter config parses (promtool) and uses only metric names,
and label names, that Tandem's services actually export.

The reference is a LIVE scrape: --serve BUILD/tandem starts `tandem serve` on
free loopback ports (one router, one prefill and one decode worker, the
default model), sends one good and one invalid request (so the series that
are created on first use, such as tandem_request_errors_total{code}, exist),
and scrapes every process's /metrics. --metrics-url / --metrics-file take a
scrape from elsewhere. Without any of them (no binary built) the metric
names documented in docs/metrics.md stand in, and the output says so.

With a live scrape it also checks that docs/metrics.md documents exactly the
families the services export, and lints the scrape with `promtool check
metrics`.
"""
import argparse
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import promql  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/tandem-dashboard.json"
RULES = sorted((REPO / "deploy/prometheus/rules").glob("*.yml"))
ADAPTER = REPO / "deploy/k8s/prometheus-adapter/config.yaml"
METRICS_DOC = REPO / "docs/metrics.md"

# Series Prometheus makes itself, and labels it attaches to every Tandem
# target (deploy/prometheus/prometheus.yml and the PodMonitor).
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                     "scrape_samples_post_metric_relabeling", "scrape_series_added",
                     "ALERTS", "ALERTS_FOR_STATE"}
TARGET_LABELS = {"job", "instance", "namespace", "pod", "component", "node",
                 "container", "endpoint", "service"}


class Exposition:
    def __init__(self):
        self.families = {}  # name -> type
        self.labels = {}    # sample name -> label names
        self.source = ""

    def sample_names(self):
        names = set(self.labels)
        for fam, typ in self.families.items():
            if typ in ("histogram", "summary"):
                names |= {f"{fam}_sum", f"{fam}_count"}
                if typ == "histogram":
                    names.add(f"{fam}_bucket")
            else:
                names.add(fam)
        return names

    def labels_of(self, name):
        out = set(self.labels.get(name, set()))
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix):
                out |= self.labels.get(name[: -len(suffix)], set())
        if name.endswith("_bucket"):
            out.add("le")
        return out

    def parse(self, text):
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, typ = line.split(None, 3)
                self.families[name] = typ.strip()
            elif line and not line.startswith("#"):
                m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
                if not m:
                    raise ValueError(f"bad sample line: {line!r}")
                labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
                self.labels.setdefault(m.group(1), set()).update(labels)
                self.labels[m.group(1)].discard("le")
                self.labels[m.group(1)].discard("quantile")


def documented_families():
    """Metric family names from the tables of docs/metrics.md, with types."""
    fams = {}
    section = None
    for line in METRICS_DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip().lower()
        m = re.match(r"\|\s*`(tandem_[a-z0-9_]+)(?:\{[^}]*\})?`\s*\|", line)
        if m and section in ("histograms", "counters", "gauges"):
            fams[m.group(1)] = {"histograms": "histogram", "counters": "counter",
                                "gauges": "gauge"}[section]
    return fams


def from_docs():
    exp = Exposition()
    exp.source = f"REFERENCE {METRICS_DOC.relative_to(REPO)} (not a live scrape)"
    labels_doc = METRICS_DOC.read_text()
    for name, typ in documented_families().items():
        exp.families[name] = typ
        labels = {"phase", "model"}
        if name == "tandem_request_success_total":
            labels.add("finish_reason")
        if name == "tandem_request_errors_total":
            labels.add("code")
        exp.labels[name] = labels
    assert "finish_reason" in labels_doc
    return exp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def live_serve(binary, timeout):
    """Starts `tandem serve`, exercises it, returns {address: scrape text}."""
    tmp = tempfile.mkdtemp(prefix="tandem-metrics-check-")
    endpoints = os.path.join(tmp, "endpoints.json")
    log_path = os.path.join(tmp, "serve.log")
    cmd = [binary, "serve", f"--port={free_port()}", f"--metrics-port={free_port()}",
           f"--endpoints-file={endpoints}", "--kv-cache-memory=64MiB", "--threads=1",
           "--prefill-workers=1", "--decode-workers=1"]
    print(f"  starting: {' '.join(cmd)}")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(endpoints):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tandem serve did not get ready; log:\n{open(log_path).read()}")
            time.sleep(0.2)
        eps = json.load(open(endpoints))
        router = next(e["grpc_address"] for e in eps if e["role"] == "router")
        client = [binary, "client", f"--server={router}", "--prompt=The capital of France is",
                  "--timeout-ms=30000", "--json"]
        ok = subprocess.run(client + ["--max-tokens=8"], capture_output=True, text=True, timeout=60)
        if ok.returncode != 0:
            raise RuntimeError(f"request failed: {ok.stderr}")
        # Invalid on purpose (over the context): creates tandem_request_errors_total.
        bad = subprocess.run(client + ["--max-tokens=1000000"], capture_output=True, text=True,
                             timeout=60)
        if bad.returncode == 0:
            raise RuntimeError("an over-context request succeeded")
        time.sleep(0.6)  # worker stats refresh every 250 ms
        scrapes = {}
        for e in eps:
            scrapes[f"{e['role']} {e['metrics_address']}"] = fetch(
                f"http://{e['metrics_address']}/metrics")
        return scrapes
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def expressions(dashboard):
    """[(where, promql)] from the dashboard, the rules and the adapter config."""
    out = []
    dash = json.loads(pathlib.Path(dashboard).read_text())

    def walk_panels(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"dashboard panel {p.get('title')!r} {t.get('refId')}",
                                promql.from_grafana(t["expr"])))
            walk_panels(p.get("panels", []))
    walk_panels(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            e = promql.from_grafana(q)
            if e:
                out.append((f"dashboard variable {v['name']}", e))
    recorded = set()
    for f in RULES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                what = r.get("record") or r.get("alert")
                out.append((f"{f.name} {what}", r["expr"]))
                if "record" in r:
                    recorded.add(r["record"])
    for r in yaml.safe_load(ADAPTER.read_text())["rules"]:
        out.append((f"adapter seriesQuery {r['name']['as']}", r["seriesQuery"]))
        series = promql.selectors(r["seriesQuery"])[0][0]
        out.append((f"adapter metricsQuery {r['name']['as']}",
                    promql.from_adapter(r["metricsQuery"], series)))
    return out, recorded


def promtool_parse(exprs):
    """Every expression through promtool's parser (as recording rules)."""
    rules = {"groups": [{"name": "check", "rules": [
        {"record": f"check:expr_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
    try:
        r = subprocess.run(["promtool", "check", "rules", "--lint=none", f.name],
                           capture_output=True, text=True)
        if r.returncode != 0:
            out = r.stdout + r.stderr
            print("  " + out.strip().replace("\n", "\n  "))
            for i in sorted({int(n) for n in re.findall(r"check:expr_(\d+)", out)}):
                print(f"  check:expr_{i} is {exprs[i][0]}: {exprs[i][1]}")
            return False
        return True
    finally:
        os.unlink(f.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", metavar="TANDEM", help="start `TANDEM serve` and scrape it")
    ap.add_argument("--metrics-url", action="append", default=[], help="scrape this URL")
    ap.add_argument("--metrics-file", action="append", default=[], help="read a scrape")
    ap.add_argument("--require-live", action="store_true",
                    help="fail instead of falling back to docs/metrics.md")
    ap.add_argument("--dashboard", default=str(DASHBOARD), help="dashboard JSON to check")
    ap.add_argument("--timeout", type=float, default=90, help="seconds for serve to get ready")
    args = ap.parse_args()

    exp = Exposition()
    scrapes = {}
    if args.serve:
        scrapes.update(live_serve(args.serve, args.timeout))
        exp.source = "LIVE scrape of `tandem serve`: " + ", ".join(scrapes)
    for url in args.metrics_url:
        scrapes[url] = fetch(url)
        exp.source = exp.source or "LIVE scrape: " + ", ".join(args.metrics_url)
    for path in args.metrics_file:
        scrapes[path] = pathlib.Path(path).read_text()
        exp.source = exp.source or "scrape files: " + ", ".join(args.metrics_file)
    live = bool(scrapes)
    errors = []
    if live:
        for where, text in scrapes.items():
            exp.parse(text)
            lint = subprocess.run(["promtool", "check", "metrics"], input=text,
                                  capture_output=True, text=True)
            if lint.returncode != 0:
                errors.append(f"promtool check metrics ({where}): {lint.stdout}{lint.stderr}")
    elif args.require_live:
        print("FAIL: no live scrape (--serve / --metrics-url / --metrics-file) and --require-live")
        return 1
    else:
        exp = from_docs()
    print(f"  reference: {exp.source}")
    print(f"  {len(exp.families)} metric families")

    if live:
        doc = documented_families()
        tandem = {n: t for n, t in exp.families.items() if n.startswith("tandem_")}
        for n in sorted(set(tandem) - set(doc)):
            errors.append(f"{n} is exported but not documented in docs/metrics.md")
        for n in sorted(set(doc) - set(tandem)):
            errors.append(f"{n} is documented in docs/metrics.md but not exported")
        for n in sorted(set(doc) & set(tandem)):
            if doc[n] != tandem[n]:
                errors.append(f"{n}: docs/metrics.md says {doc[n]}, the scrape says {tandem[n]}")

    exprs, recorded = expressions(args.dashboard)
    names = exp.sample_names()
    used = set()
    for where, e in exprs:
        try:
            sels = promql.selectors(e)
        except promql.PromQLError as err:
            errors.append(f"{where}: {err}")
            continue
        for name, labels in sels:
            used.add(name)
            if name in recorded or name in PROMETHEUS_SERIES:
                continue
            if name not in names:
                errors.append(f"{where}: metric {name} is not exported by Tandem")
                continue
            unknown = labels - exp.labels_of(name) - TARGET_LABELS
            if unknown:
                errors.append(f"{where}: {name} has no label(s) {sorted(unknown)}")
    if not promtool_parse(exprs):
        errors.append("promtool could not parse some expressions (above)")
    tandem_used = sorted(n for n in used if n in names)
    print(f"  {len(exprs)} PromQL expressions (dashboard, rules, adapter), "
          f"{len(tandem_used)} exported series names used, {len(recorded)} recording rules")
    dash_names = {n for w, e in exprs if w.startswith("dashboard")
                  for n, _ in promql.selectors(e)}
    for family in ("tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
                   "tandem_request_queue_time_seconds", "tandem_kv_transfer_seconds"):
        if f"{family}_bucket" not in dash_names:
            errors.append(f"dashboard has no percentile panel for {family}")
    for e in errors:
        print(f"  FAIL {e}")
    if errors:
        return 1
    print("  OK every metric and label used exists in the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
