#!/usr/bin/env python3
"""promtool check config + a relabeling test of deploy/prometheus/prometheus.yml.

  check_prometheus.py RENDERED.yaml

Debian's promtool (bookworm, 2.42) is built without Kubernetes service
discovery, so `kubernetes_sd_configs` is an unknown field to it. When that is
the only complaint, the job's discovery is swapped for file_sd with targets
made from the rendered Deployments exactly as Kubernetes pod discovery would
(one target per container port, with the __meta_kubernetes_pod_* labels of
each pod template), and then:
- `promtool check config` validates everything else (relabel rules, regexes,
  rule files);
- `promtool check service-discovery` applies the relabeling; each Tandem pod
  must give exactly one target, on its `metrics` port, labelled job=tandem,
  namespace, pod, component (router | prefill | decode) and node.
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy/prometheus/prometheus.yml"


def sanitize(s):
    return "".join(ch if ch.isalnum() else "_" for ch in s)


def targets(objs):
    out, expected = [], {}
    for o in objs:
        if o["kind"] != "Deployment":
            continue
        tpl = o["spec"]["template"]
        pod = o["metadata"]["name"] + "-7d9f8-abcde"
        ns = o["metadata"].get("namespace", "default")
        ip = f"10.1.0.{len(expected) + 10}"
        meta = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_pod_name": pod,
                "__meta_kubernetes_pod_node_name": "node-1", "__meta_kubernetes_pod_ip": ip}
        for k, v in tpl["metadata"].get("labels", {}).items():
            meta[f"__meta_kubernetes_pod_label_{sanitize(k)}"] = v
        for k, v in tpl["metadata"].get("annotations", {}).items():
            meta[f"__meta_kubernetes_pod_annotation_{sanitize(k)}"] = v
        metrics_port = None
        for c in tpl["spec"]["containers"]:
            for p in c.get("ports", []):
                out.append({"targets": [f"{ip}:{p['containerPort']}"], "labels": dict(
                    meta, __meta_kubernetes_pod_container_name=c["name"],
                    __meta_kubernetes_pod_container_port_name=p.get("name", ""),
                    __meta_kubernetes_pod_container_port_number=str(p["containerPort"]))})
                if p.get("name") == "metrics":
                    metrics_port = p["containerPort"]
        expected[pod] = {"__address__": f"{ip}:{metrics_port}", "job": "tandem", "namespace": ns,
                         "pod": pod, "node": "node-1",
                         "component": tpl["metadata"]["labels"]["app.kubernetes.io/component"]}
    return out, expected


def run(*cmd, stdout_only=False):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout if stdout_only else r.stdout + r.stderr


def main():
    rendered = sys.argv[1]
    rc, out = run("promtool", "check", "config", str(CONFIG))
    if rc == 0:
        print("  promtool check config: ok (with Kubernetes discovery)")
    elif "field kubernetes_sd_configs not found" not in out:
        print(out)
        return 1
    else:
        print("  promtool has no Kubernetes discovery (Debian build): testing with file_sd")
    objs = [o for o in yaml.safe_load_all(open(rendered)) if o]
    tgts, expected = targets(objs)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "targets.json").write_text(json.dumps(tgts))
        cfg = yaml.safe_load(CONFIG.read_text())
        cfg["rule_files"] = [str(CONFIG.parent / r) for r in cfg.get("rule_files", [])]
        for job in cfg["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["file_sd_configs"] = [{"files": [str(tmp / "targets.json")]}]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        rc, out = run("promtool", "check", "config", str(tmp / "prometheus.yml"))
        if rc != 0:
            print(out)
            return 1
        print(f"  promtool check config: ok ({len(cfg['rule_files'])} rule files)")
        rc, out = run("promtool", "check", "service-discovery", "--timeout=3s",
                      str(tmp / "prometheus.yml"), "tandem",
                      stdout_only=True)
        if rc != 0:
            print(out)
            return 1
        result = json.loads(out)
    got = [t["labels"] for t in result if t["labels"]]
    errors = []
    for pod, want in expected.items():
        mine = [g for g in got if g.get("pod") == pod]
        if len(mine) != 1:
            errors.append(f"{pod}: {len(mine)} scrape targets, want 1")
            continue
        for k, v in want.items():
            if mine[0].get(k) != v:
                errors.append(f"{pod}: label {k}={mine[0].get(k)!r}, want {v!r}")
    if len(got) != len(expected):
        errors.append(f"{len(got)} targets kept for {len(expected)} pods")
    for e in errors:
        print(f"  FAIL {e}")
    if errors:
        return 1
    print(f"  relabeling: {len(tgts)} discovered container ports -> {len(got)} targets "
          f"({', '.join(sorted(w['component'] for w in expected.values()))}) with "
          f"job, namespace, pod, component, node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
