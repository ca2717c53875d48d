#!/usr/bin/env python3
"""A minimal Python client of Tandem's public gRPC API (tandem.v1.Generation).

Stubs are generated from proto/tandem/v1/*.proto with grpcio-tools at run time
into a temporary directory, so nothing generated is checked in.

    .venv/bin/python examples/python/client.py --server 127.0.0.1:50051 \
        --prompt "The capital of France is" --max-tokens 32

Streams the text deltas to stdout, then prints the finish reason, usage and
timings of the final message on stderr. Exit code 1 on a gRPC error (the
status code and message are printed).

A router started with --api-key-file needs --api-key (or $TANDEM_API_KEY);
one on TLS needs --tls-ca, and on mTLS also --tls-cert / --tls-key
(docs/security.md).
"""
import argparse
import importlib
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(ROOT, "proto")


def load_stubs():
    out = tempfile.mkdtemp(prefix="tandem_stubs_")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
        f"--grpc_python_out={out}", os.path.join(PROTO_DIR, "tandem/v1/generation.proto"),
    ])
    if rc != 0:
        sys.exit(f"protoc failed ({rc})")
    sys.path.insert(0, out)
    pb2 = importlib.import_module("tandem.v1.generation_pb2")
    pb2_grpc = importlib.import_module("tandem.v1.generation_pb2_grpc")
    return pb2, pb2_grpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--chat", action="store_true", help="send as a user chat message")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="gRPC deadline in seconds")
    ap.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY", ""),
                    help="sent as 'authorization: Bearer <key>' (default $TANDEM_API_KEY)")
    ap.add_argument("--tls-ca", help="PEM CA of the router's certificate (turns TLS on)")
    ap.add_argument("--tls-cert", help="PEM client certificate (router on mTLS)")
    ap.add_argument("--tls-key", help="PEM private key of --tls-cert")
    args = ap.parse_args()
    if bool(args.tls_cert) != bool(args.tls_key):
        ap.error("--tls-cert and --tls-key go together")

    pb2, pb2_grpc = load_stubs()
    req = pb2.GenerateRequest(
        sampling=pb2.SamplingParams(temperature=args.temperature, seed=args.seed),
        stop=pb2.StopConditions(max_tokens=args.max_tokens),
    )
    if args.chat:
        req.messages.messages.add(role="user", content=args.prompt)
    else:
        req.text = args.prompt

    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    if args.tls_ca or args.tls_cert:
        def read(path):
            with open(path, "rb") as f:
                return f.read()
        creds = grpc.ssl_channel_credentials(
            root_certificates=read(args.tls_ca) if args.tls_ca else None,
            private_key=read(args.tls_key) if args.tls_key else None,
            certificate_chain=read(args.tls_cert) if args.tls_cert else None)
        channel = grpc.secure_channel(args.server, creds)
    else:
        channel = grpc.insecure_channel(args.server)
    with channel:
        stub = pb2_grpc.GenerationStub(channel)
        try:
            for resp in stub.Generate(req, timeout=args.timeout, metadata=metadata):
                sys.stdout.write(resp.text)
                sys.stdout.flush()
                if resp.finish_reason != pb2.FINISH_REASON_UNSPECIFIED:
                    u, t = resp.usage, resp.timings
                    print(file=sys.stdout)
                    print(f"[{resp.request_id}] finish {pb2.FinishReason.Name(resp.finish_reason)}; "
                          f"tokens prompt {u.prompt_tokens} cached {u.cached_tokens} "
                          f"completion {u.completion_tokens}; TTFT {t.ttft_seconds * 1e3:.1f} ms, "
                          f"TPOT {t.mean_tpot_seconds * 1e3:.2f} ms, e2e {t.e2e_seconds * 1e3:.1f} ms",
                          file=sys.stderr)
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
