#!/usr/bin/env python3
"""Soak test of a Tandem cluster (not run in CI; docs/faults.md#soak).

Runs a router, prefill workers and decode workers as separate `tandem`
processes (the way Kubernetes runs them), drives a mixed streaming load
through the public gRPC API for --minutes, kills a worker with SIGKILL every
--kill-every seconds and starts a replacement (as a Deployment would), and
cancels a share of the requests from the client side. Every --report-every
seconds it prints the RSS of every process, the KV blocks / leases / running /
waiting of every worker and the finished requests by outcome. At the end it
stops the load, waits for the workers to go idle and prints a verdict:

  * RSS flat: every process that lived through the run ends within
    --rss-tolerance (default 10 %) of its RSS at the end of the warm-up;
  * no unexpected errors: every request finished normally, or was cancelled by
    this client (worker kills are absorbed by the router's migration);
  * nothing left: 0 blocks in use, 0 leases, 0 running and 0 waiting on every
    worker once the load stops.

Exit code 0 when all hold, 1 otherwise.

    .venv/bin/python tools/soak.py                    # 30 minutes
    .venv/bin/python tools/soak.py --minutes 3 --kill-every 40
"""
import argparse
import importlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten-year-old.",
    "List five ways to reduce the memory used by a large language model server.",
    "Summarize the plot of a detective novel set in a snowy mountain village. " * 6,
    "Translate to French: The weather is lovely today and the market is busy.",
    "def fibonacci(n):\n    # return the n-th Fibonacci number\n",
    "What is the difference between prefill and decode in LLM inference? " * 3,
    "Give a recipe for pancakes.",
]
SYSTEM = "You are a helpful assistant. Answer carefully and at length. " * 8


def load_stubs():
    out = tempfile.mkdtemp(prefix="tandem_soak_stubs_")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    proto = os.path.join(ROOT, "proto")
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto}", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(proto, "tandem/v1/generation.proto"),
                      os.path.join(proto, "tandem/v1/worker.proto")])
    if rc != 0:
        sys.exit(f"protoc failed ({rc})")
    sys.path.insert(0, out)
    return (importlib.import_module("tandem.v1.generation_pb2"),
            importlib.import_module("tandem.v1.generation_pb2_grpc"),
            importlib.import_module("tandem.v1.worker_pb2"),
            importlib.import_module("tandem.v1.worker_pb2_grpc"))


class Proc:
    """One `tandem` process; its ports are read from its start-up log line."""

    LINE = re.compile(r"gRPC on [^:]+:(\d+), /metrics on port (\d+)")

    def __init__(self, binary, role, args, log_dir):
        self.role = role
        self.log_path = os.path.join(log_dir, f"{role}-{time.time_ns()}.log")
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen([binary, role] + args, stdout=self.log, stderr=self.log,
                                      stdin=subprocess.DEVNULL)
        self.start = time.monotonic()
        self.port = None
        self.warm_rss = None

    def wait_ready(self, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.role} exited ({self.popen.returncode}); see {self.log_path}")
            with open(self.log_path, "rb") as f:
                m = self.LINE.search(f.read().decode("utf-8", "replace"))
            if m:
                self.port = int(m.group(1))
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.role} not ready in {timeout} s; see {self.log_path}")

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def rss_mb(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            pass
        return None

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.alive():
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()


class Load:
    """Client threads streaming Generate calls; some are cancelled mid-stream."""

    def __init__(self, gen_pb, gen_grpc, target, threads, cancel_share, seed):
        self.gen_pb, self.target = gen_pb, target
        self.stub = gen_grpc.GenerationStub(grpc.insecure_channel(target))
        self.cancel_share = cancel_share
        self.outcomes = Counter()
        self.unexpected = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(300)

    def note(self, outcome, detail=None):
        with self.lock:
            self.outcomes[outcome] += 1
            if detail is not None and len(self.unexpected) < 20:
                self.unexpected.append(detail)

    def request(self, rng):
        pb = self.gen_pb
        prompt = rng.choice(PROMPTS)
        if rng.random() < 0.3:
            prompt = SYSTEM + prompt  # shared prefix: exercises the prefix cache
        req = pb.GenerateRequest(text=prompt)
        req.stop.max_tokens = rng.choice([8, 32, 64, 128])
        req.stop.ignore_eos = rng.random() < 0.5
        if rng.random() < 0.5:
            req.sampling.temperature = 0.8
            req.sampling.top_p = 0.95
            req.sampling.seed = rng.randrange(1 << 32)
        else:
            req.sampling.temperature = 0
        return req

    def run(self, index):
        rng = random.Random(self.rng.random() + index)
        while not self.stop_event.is_set():
            req = self.request(rng)
            cancel_after = rng.randint(1, 16) if rng.random() < self.cancel_share else None
            call = self.stub.Generate(req, timeout=300)
            tokens = 0
            try:
                finished = None
                for resp in call:
                    tokens += len(resp.token_ids)
                    if resp.finish_reason:
                        finished = resp.finish_reason
                    if cancel_after is not None and tokens >= cancel_after:
                        call.cancel()
                        break
                if cancel_after is not None and tokens >= cancel_after:
                    self.note("cancelled by client")
                elif finished:
                    self.note("ok " + self.gen_pb.FinishReason.Name(finished))
                else:
                    self.note("unexpected: stream ended without a finish reason",
                              "stream ended without a finish reason")
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and cancel_after is not None:
                    self.note("cancelled by client")
                else:
                    self.note(f"unexpected: {e.code().name}", f"{e.code().name}: {e.details()}")


def worker_stats(wk_pb, wk_grpc, proc):
    channel = grpc.insecure_channel(f"127.0.0.1:{proc.port}")
    stub = (wk_grpc.PrefillWorkerStub if proc.role == "prefill" else wk_grpc.DecodeWorkerStub)(channel)
    try:
        return stub.GetStats(wk_pb.WorkerStatsRequest(), timeout=10)
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--warmup-minutes", type=float, default=None,
                    help="RSS baseline taken this long after a process starts (default: "
                         "min(5, minutes / 6))")
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8, help="concurrent client streams")
    ap.add_argument("--cancel-share", type=float, default=0.2)
    ap.add_argument("--kill-every", type=float, default=120, help="seconds; 0 = never")
    ap.add_argument("--report-every", type=float, default=30)
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--worker-args", default="", help="extra flags for every worker")
    args = ap.parse_args()
    warmup = 60 * (args.warmup_minutes if args.warmup_minutes is not None
                   else min(5.0, args.minutes / 6))
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"soak: no tandem binary at {args.binary} (bash scripts/build.sh)")

    gen_pb, gen_grpc, wk_pb, wk_grpc = load_stubs()
    log_dir = tempfile.mkdtemp(prefix="tandem_soak_")
    print(f"[soak] logs in {log_dir}", flush=True)
    rng = random.Random(args.seed)
    router = Proc(args.binary, "router", ["--port", "0", "--metrics-port", "0", "--host", "127.0.0.1",
                                          "--remote-prefill-min-tokens", "0"], log_dir)
    procs = [router]
    killed = []
    load = None
    try:
        router.wait_ready()
        target = f"127.0.0.1:{router.port}"
        extra = args.worker_args.split()

        def start_worker(role):
            p = Proc(args.binary, role, ["--router", target, "--port", "0", "--metrics-port", "0",
                                         "--host", "127.0.0.1"] + extra, log_dir)
            p.wait_ready()
            return p

        workers = [start_worker("prefill") for _ in range(args.prefill)]
        workers += [start_worker("decode") for _ in range(args.decode)]
        procs += workers
        # The router counts a worker once it has registered: wait until every
        # worker answers GetStats and the first request succeeds.
        probe = gen_grpc.GenerationStub(grpc.insecure_channel(target))
        deadline = time.monotonic() + 120
        while True:
            try:
                req = gen_pb.GenerateRequest(text="hello")
                req.stop.max_tokens = 1
                list(probe.Generate(req, timeout=30))
                break
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster not serving: {e.code().name} {e.details()}")
                time.sleep(0.5)

        load = Load(gen_pb, gen_grpc, target, args.clients, args.cancel_share, args.seed)
        t0 = time.monotonic()
        end = t0 + 60 * args.minutes
        next_kill = t0 + args.kill_every if args.kill_every > 0 else float("inf")
        next_report = t0
        load.start()
        print(f"[soak] {args.minutes:g} min, {args.prefill} prefill + {args.decode} decode workers, "
              f"{args.clients} client streams, {args.cancel_share:.0%} cancelled, a worker killed "
              f"every {args.kill_every:g} s", flush=True)
        while time.monotonic() < end:
            now = time.monotonic()
            for p in procs:
                if p.warm_rss is None and now - p.start >= warmup:
                    p.warm_rss = p.rss_mb()
            if now >= next_kill:
                victim = rng.choice([p for p in procs if p.role != "router" and p.alive()])
                print(f"[soak] {now - t0:7.0f} s  kill -9 {victim.role} pid {victim.pid}", flush=True)
                victim.stop(signal.SIGKILL)
                procs.remove(victim)
                killed.append(victim)
                replacement = start_worker(victim.role)
                procs.append(replacement)
                print(f"[soak] {time.monotonic() - t0:7.0f} s  started {replacement.role} pid "
                      f"{replacement.pid}", flush=True)
                next_kill += args.kill_every
            if now >= next_report:
                report(gen_pb, wk_pb, wk_grpc, procs, load, now - t0)
                next_report += args.report_every
            time.sleep(1)
        load.stop()
        print(f"[soak] load stopped after {time.monotonic() - t0:.0f} s; waiting for idle workers",
              flush=True)
        final = wait_idle(wk_pb, wk_grpc, [p for p in procs if p.role != "router"])
        report(gen_pb, wk_pb, wk_grpc, procs, load, time.monotonic() - t0)
        return verdict(procs, load, final, args.rss_tolerance, killed)
    finally:
        if load is not None:
            load.stop_event.set()
        for p in reversed(procs):
            p.stop()


def report(gen_pb, wk_pb, wk_grpc, procs, load, t):
    rss = "  ".join(f"{p.role}:{p.pid}={p.rss_mb() or 0:.0f}MB" for p in procs)
    print(f"[soak] {t:7.0f} s  RSS {rss}", flush=True)
    for p in procs:
        if p.role == "router":
            continue
        s = worker_stats(wk_pb, wk_grpc, p)
        if s is None:
            print(f"[soak]           {p.role} pid {p.pid}: no stats", flush=True)
            continue
        print(f"[soak]           {p.role} pid {p.pid}: blocks {s.num_blocks_used}/{s.num_blocks_total}, "
              f"leases {s.num_leases} ({s.num_leased_blocks} blocks), running {s.num_running}, "
              f"waiting {s.num_waiting}, steps {s.num_steps}", flush=True)
    with load.lock:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(load.outcomes.items()))
    print(f"[soak]           requests: {outcomes or 'none yet'}", flush=True)


def wait_idle(wk_pb, wk_grpc, workers, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        stats = {p.pid: worker_stats(wk_pb, wk_grpc, p) for p in workers}
        idle = all(s is not None and s.num_blocks_used == 0 and s.num_leases == 0 and
                   s.num_running == 0 and s.num_waiting == 0 for s in stats.values())
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def verdict(procs, load, final, tolerance, killed):
    ok = True
    print("[soak] verdict", flush=True)
    for p in procs:
        end_rss = p.rss_mb()
        if p.warm_rss is None or end_rss is None:
            print(f"  RSS {p.role} pid {p.pid}: younger than the warm-up, not judged")
            continue
        growth = end_rss / p.warm_rss - 1
        good = growth <= tolerance
        ok &= good
        print(f"  RSS {p.role} pid {p.pid}: {p.warm_rss:.0f} MB after warm-up -> {end_rss:.0f} MB "
              f"({growth:+.1%}) {'ok' if good else 'GROWS'}")
    unexpected = sum(v for k, v in load.outcomes.items() if k.startswith("unexpected"))
    total = sum(load.outcomes.values())
    print(f"  requests: {total} finished, {unexpected} unexpected errors "
          f"({len(killed)} workers killed)")
    for d in load.unexpected:
        print(f"    {d}")
    ok &= unexpected == 0 and total > 0
    for pid, s in final.items():
        left = s is None or s.num_blocks_used or s.num_leases or s.num_running or s.num_waiting
        ok &= not left
        desc = "no stats" if s is None else (
            f"blocks {s.num_blocks_used}, leases {s.num_leases}, running {s.num_running}, "
            f"waiting {s.num_waiting}")
        print(f"  worker pid {pid} after the load: {desc} {'LEFT' if left else 'ok'}")
    print(f"[soak] {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
