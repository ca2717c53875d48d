#!/usr/bin/env python3
"""Consistency checks on rendered kustomize output that schemas cannot see.

  check_manifests.py [--tandem BUILD/tandem] RENDERED.yaml...

For every rendered overlay:
- drain timing: terminationGracePeriodSeconds >= preStop sleep + drain
  (--drain-seconds, default 30) + 5 s;
- every $(VAR) in a container's args is defined by its env / envFrom
  (an undefined one reaches the binary as the literal text "$(VAR)");
- every `--flag` given to `tandem <command>` exists in `tandem <command> --help`
  (with --tandem; flags of later issues are listed in PENDING_FLAGS and only
  reported);
- non-root, read-only root file system, no privilege escalation, all
  capabilities dropped, liveness + readiness probes on the serving container;
- Services select pods and name container ports that exist; NetworkPolicy
  named ports exist on the selected pods;
- HPAs target a rendered Deployment that sets no `replicas`, and ask only for
  custom metrics deploy/k8s/prometheus-adapter/config.yaml defines;
- engine pods (prefill, decode): `--device=cuda` exactly when the container
  has an nvidia.com/gpu limit; `--kv-cache-memory` (its $(VAR)s expanded) a
  valid size, and on a GPU a fraction in (0, 1] of the free device memory
  (a byte size fits one GPU model only), on the CPU a byte size (a fraction
  there is of the node's MemAvailable, not of the pod's memory limit);
- the init container fetches the package / file / SHA-256 of scripts/fetch_model.sh;
- the PodMonitor selects the Tandem pods' `metrics` port.
"""
import argparse
import pathlib
import re
import subprocess
import sys

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
ADAPTER = REPO / "deploy/k8s/prometheus-adapter/config.yaml"
PODMONITOR = REPO / "deploy/prometheus/operator/podmonitor.yaml"
FETCH_SH = REPO / "scripts/fetch_model.sh"
DEFAULT_DRAIN_SECONDS = 30
DRAIN_MARGIN_SECONDS = 5
# Flags the manifests use that later issues add (none left: --kv-transport,
# the gpu overlay's NCCL transport flag, exists since docs/nccl.md).
PENDING_FLAGS = set()


def pods(objs):
    for o in objs:
        if o["kind"] == "Deployment":
            yield o, o["spec"]["template"]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        (labels.get(e["key"]) in e.get("values", [])) == (e["operator"] == "In")
        for e in selector.get("matchExpressions", []))


def flag_value(args, flag, default):
    """The last value of --flag=V / --flag V in args, else default."""
    value = default
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}="):
            value = a.split("=", 1)[1]
        elif a == f"--{flag}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def kv_memory(text):
    """('fraction', f) / ('bytes', None) / ('bad', why) as `tandem` parses
    --kv-cache-memory (engine/memory_size.cc): a bare number with a '.' or
    <= 1 is a fraction, which must be in (0, 1]."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m:
        return "bad", f"not a size or fraction: {text!r}"
    try:
        value = float(m.group(1))
    except ValueError:
        return "bad", f"not a number: {text!r}"
    unit = m.group(2).lower()
    if not unit and ("." in m.group(1) or value <= 1):
        return ("fraction", value) if 0 < value <= 1 else ("bad", f"fraction {text!r} not in (0, 1]")
    if unit not in ("", "b", "k", "m", "g", "kib", "mib", "gib", "tib", "kb", "mb", "gb", "tb"):
        return "bad", f"unknown unit in {text!r}"
    return ("bytes", None) if value > 0 else ("bad", f"zero size {text!r}")


def check_engine_device(name, c, env, err):
    """--device and --kv-cache-memory of a prefill / decode container."""
    args = c.get("args", [])
    if not args or args[0] not in ("prefill", "decode"):
        return
    device = flag_value(args, "device", "cpu")
    gpus = int(str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)))
    if device == "cuda" and gpus < 1:
        err(f"{name}: --device=cuda without an nvidia.com/gpu limit")
    if gpus >= 1 and device != "cuda":
        err(f"{name}: holds {gpus} nvidia.com/gpu but runs on --device={device} (want --device=cuda)")
    raw = flag_value(args, "kv-cache-memory", "1GiB")
    kv = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), raw)
    kind, detail = kv_memory(kv)
    if kind == "bad":
        err(f"{name}: --kv-cache-memory={kv}: {detail}")
    elif device == "cuda" and kind != "fraction":
        err(f"{name}: --kv-cache-memory={kv} on a GPU: give a fraction of the free device memory "
            f"(e.g. 0.9, docs/gpu.md), a byte size fits one GPU model only")
    elif device != "cuda" and kind == "fraction":
        err(f"{name}: --kv-cache-memory={kv} on the CPU is a fraction of the node's MemAvailable, "
            f"not of the pod's memory limit: give a byte size")


def help_flags(tandem, command, cache={}):
    if command not in cache:
        out = subprocess.run([tandem, command, "--help"], capture_output=True, text=True,
                             timeout=30).stdout
        cache[command] = set(re.findall(r"^\s+--([a-z0-9-]+)", out, re.M))
    return cache[command]


def check(path, objs, tandem, errors, notes):
    def err(msg):
        errors.append(f"{path}: {msg}")

    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    for dep, tpl in pods(objs):
        name = dep["metadata"]["name"]
        spec = tpl["spec"]
        psc = spec.get("securityContext", {})
        if not psc.get("runAsNonRoot"):
            err(f"{name}: pod securityContext.runAsNonRoot is not true")
        if spec.get("automountServiceAccountToken") is not False:
            err(f"{name}: automountServiceAccountToken should be false")
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            if not sc.get("readOnlyRootFilesystem"):
                err(f"{name}/{c['name']}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                err(f"{name}/{c['name']}: allowPrivilegeEscalation is not false")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                err(f"{name}/{c['name']}: capabilities are not all dropped")
            if "limits" not in c.get("resources", {}) or "requests" not in c.get("resources", {}):
                err(f"{name}/{c['name']}: resource requests and limits must be set")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    err(f"{name}/{c['name']}: volumeMount {m['name']} has no volume")
            defined = {e["name"] for e in c.get("env", [])}
            for ef in c.get("envFrom", []):
                ref = ef.get("configMapRef", {}).get("name")
                if ref not in configmaps:
                    err(f"{name}/{c['name']}: envFrom ConfigMap {ref} is not rendered")
                defined |= set(configmaps.get(ref, {}))
            for a in c.get("args", []) + c.get("command", []):
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                    if var not in defined:
                        err(f"{name}/{c['name']}: $({var}) in {a!r} is not defined")
        main = spec["containers"][0]
        args = main.get("args", [])
        main_env = {e["name"]: e["value"] for e in main.get("env", []) if "value" in e}
        for ef in main.get("envFrom", []):
            main_env = {**configmaps.get(ef.get("configMapRef", {}).get("name"), {}), **main_env}
        check_engine_device(name, main, main_env, err)
        for probe in ("livenessProbe", "readinessProbe"):
            if probe not in main:
                err(f"{name}: serving container has no {probe}")
        # Drain timing.
        prestop = main.get("lifecycle", {}).get("preStop", {})
        cmd = prestop.get("exec", {}).get("command", [])
        sleep = int(cmd[1]) if len(cmd) == 2 and cmd[0] == "sleep" else \
            prestop.get("sleep", {}).get("seconds", 0)
        if not prestop:
            err(f"{name}: no preStop hook")
        drain = DEFAULT_DRAIN_SECONDS
        for a in args:
            if a.startswith("--drain-seconds="):
                drain = int(a.split("=", 1)[1])
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if grace < sleep + drain + DRAIN_MARGIN_SECONDS:
            err(f"{name}: terminationGracePeriodSeconds {grace} < preStop {sleep} s + drain "
                f"{drain} s + {DRAIN_MARGIN_SECONDS} s")
        # Flags against the binary.
        if tandem and args and not args[0].startswith("-"):
            known = help_flags(tandem, args[0])
            for a in args[1:]:
                flag = a[2:].split("=", 1)[0]
                if not a.startswith("--"):
                    continue
                if flag in PENDING_FLAGS:
                    if flag not in known:
                        notes.append(f"{path}: {name}: --{flag} is not in `tandem {args[0]}` yet")
                elif flag not in known:
                    err(f"{name}: `tandem {args[0]}` has no flag --{flag}")
        # Model fetch matches scripts/fetch_model.sh.
        for ic in spec.get("initContainers", []):
            if ic["name"] == "fetch-model":
                cfg = {}
                for ef in ic.get("envFrom", []):
                    cfg.update(configmaps.get(ef.get("configMapRef", {}).get("name"), {}))
                sh = FETCH_SH.read_text()
                sha = re.search(r"^SHA256=(\w+)", sh, re.M).group(1)
                pkg = re.search(r"(llm-[\w-]+==[\w.]+)", sh).group(1)
                fname = re.search(r"^NAME=(\S+)", sh, re.M).group(1)
                if cfg.get("TANDEM_MODEL_SHA256") != sha:
                    err(f"{name}: TANDEM_MODEL_SHA256 differs from scripts/fetch_model.sh")
                if cfg.get("TANDEM_MODEL_PACKAGE") != pkg:
                    err(f"{name}: TANDEM_MODEL_PACKAGE differs from scripts/fetch_model.sh")
                if not cfg.get("TANDEM_MODEL", "").endswith("/" + fname) or \
                        not cfg.get("TANDEM_MODEL_MEMBER", "").endswith("/" + fname):
                    err(f"{name}: TANDEM_MODEL / TANDEM_MODEL_MEMBER do not name {fname}")

    def ports_of(labels):
        out = set()
        for _, tpl in pods(objs):
            if all(tpl["metadata"]["labels"].get(k) == v for k, v in labels.items()):
                for c in tpl["spec"]["containers"]:
                    out |= {p.get("name") for p in c.get("ports", [])}
                    out |= {p["containerPort"] for p in c.get("ports", [])}
        return out

    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "Service":
            sel = o["spec"].get("selector", {})
            matched = [t for _, t in pods(objs)
                       if all(t["metadata"]["labels"].get(k) == v for k, v in sel.items())]
            if not matched:
                err(f"Service {name} selects no pod")
            for p in o["spec"]["ports"]:
                if p.get("targetPort", p["port"]) not in ports_of(sel):
                    err(f"Service {name}: targetPort {p.get('targetPort')} is not a container port")
        if kind == "NetworkPolicy":
            sel = o["spec"]["podSelector"]
            targets = [t for _, t in pods(objs) if selects(sel, t["metadata"]["labels"])]
            if not targets:
                err(f"NetworkPolicy {name} selects no pod")
            names = set()
            for t in targets:
                for c in t["spec"]["containers"]:
                    names |= {p.get("name") for p in c.get("ports", [])}
            for rule in o["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    if isinstance(p.get("port"), str) and p["port"] not in names:
                        err(f"NetworkPolicy {name}: port {p['port']} is not named on its pods")
                for peer in rule.get("from", []):
                    if "podSelector" in peer and "namespaceSelector" not in peer and not any(
                            selects(peer["podSelector"], t["metadata"]["labels"])
                            for _, t in pods(objs)):
                        err(f"NetworkPolicy {name}: a `from` podSelector selects no pod")
        if kind == "HorizontalPodAutoscaler":
            ref = o["spec"]["scaleTargetRef"]["name"]
            if ref not in deployments:
                err(f"HPA {name}: target Deployment {ref} is not rendered")
            elif "replicas" in deployments[ref]["spec"]:
                err(f"HPA {name}: Deployment {ref} sets replicas (every apply would reset the HPA)")
            adapter = {r["name"]["as"] for r in yaml.safe_load(ADAPTER.read_text())["rules"]}
            for m in o["spec"].get("metrics", []):
                if m["type"] == "Pods" and m["pods"]["metric"]["name"] not in adapter:
                    err(f"HPA {name}: custom metric {m['pods']['metric']['name']} is not defined "
                        f"in {ADAPTER.relative_to(REPO)}")

    pm = yaml.safe_load(PODMONITOR.read_text())
    tandem_pods = [t for _, t in pods(objs) if selects(pm["spec"]["selector"], t["metadata"]["labels"])]
    if len(tandem_pods) != 3:
        err(f"PodMonitor selects {len(tandem_pods)} pod templates, want router, prefill, decode")
    for ep in pm["spec"]["podMetricsEndpoints"]:
        for t in tandem_pods:
            if ep["port"] not in {p.get("name") for c in t["spec"]["containers"]
                                  for p in c.get("ports", [])}:
                err(f"PodMonitor port {ep['port']} missing on {t['metadata']['labels']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", help="tandem binary: check container flags against --help")
    ap.add_argument("rendered", nargs="+")
    args = ap.parse_args()
    errors, notes = [], []
    for path in args.rendered:
        objs = [o for o in yaml.safe_load_all(open(path)) if o]
        check(path, objs, args.tandem, errors, notes)
        print(f"  {path}: {len(objs)} objects checked")
    for n in sorted(set(notes)):
        print(f"  NOTE {n}")
    for e in errors:
        print(f"  FAIL {e}")
    if not args.tandem:
        print("  (no tandem binary: container flags not checked against --help)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
