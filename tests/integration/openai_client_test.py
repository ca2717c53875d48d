#!/usr/bin/env python3
"""The official `openai` Python package against a real `tandem serve` on loopback.

Run by ctest (tests/CMakeLists.txt) with the project's .venv:
  .venv/bin/python tests/integration/openai_client_test.py --tandem build/tandem

Checks what an SDK user does: list models; completions and chat, streamed and
not, greedy, the streamed text equal to the whole response and usage equal to
the tokens received; the speculative-decoding body field through extra_body
(the server runs n-gram drafts: off, k = 2 and the server's k give one text);
errors raised as the SDK's typed exceptions (400 / 404) with the server still
serving after them; a stream closed mid-way frees its call (the router's
running-requests gauge returns to 0); SIGTERM drains and exits 0.
Exit status 0 when every check passed; each check prints one line.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai


def wait_for(pred, timeout_s, what):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def gauge(metrics_address, name):
    body = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, fn):
        try:
            fn()
            self.passed += 1
            print(f"[ok] {name}", flush=True)
        except Exception as e:  # one failed check must not hide the others
            self.failed += 1
            print(f"[FAILED] {name}: {type(e).__name__}: {e}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tandem", required=True)
    p.add_argument("--model", default=None)
    a = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="tandem_openai_py_")
    endpoints = os.path.join(tmp, "endpoints.json")
    cmd = [a.tandem, "serve", "--colocated", "--port", "0", "--http-port", "0",
           "--threads", "2", "--spec-method", "ngram", "--endpoints-file", endpoints]
    if a.model:
        cmd += ["--model", a.model]
    log = open(os.path.join(tmp, "serve.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        eps = wait_for(lambda: os.path.exists(endpoints) and json.load(open(endpoints)), 180,
                       "serve's endpoints file")
        router = next(e for e in eps if e["role"] == "router")
        http = router["http_address"]
        metrics = router["metrics_address"]
        client = openai.OpenAI(base_url=f"http://{http}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        checks = Checks()
        state = {}

        def models():
            ids = [m.id for m in client.models.list().data]
            assert len(ids) == 1, ids
            state["model"] = ids[0]

        def completion():
            prompt = "The three primary colors are"
            # Speculation off for this one request (the server runs n-gram drafts).
            whole = client.completions.create(model=state["model"], prompt=prompt, max_tokens=24,
                                              temperature=0,
                                              extra_body={"ignore_eos": True,
                                                          "num_speculative_tokens": 0})
            assert whole.choices[0].finish_reason == "length", whole.choices[0].finish_reason
            assert whole.usage.completion_tokens == 24, whole.usage
            assert whole.usage.prompt_tokens > 0, whole.usage
            text = whole.choices[0].text
            assert text.strip(), "empty completion"
            parts, usage = [], None
            for chunk in client.completions.create(
                    model=state["model"], prompt=prompt, max_tokens=24, temperature=0,
                    stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True}):
                if chunk.choices:
                    parts.append(chunk.choices[0].text)
                if chunk.usage is not None:
                    usage = chunk.usage
            assert "".join(parts) == text, ("".join(parts), text)
            assert usage is not None and usage.completion_tokens == 24, usage
            assert usage.prompt_tokens == whole.usage.prompt_tokens, (usage, whole.usage)
            # Greedy with the server's k (4, the streamed one above) or k = 2: the same text.
            spec = client.completions.create(model=state["model"], prompt=prompt, max_tokens=24,
                                             temperature=0,
                                             extra_body={"ignore_eos": True,
                                                         "num_speculative_tokens": 2})
            assert spec.choices[0].text == text, (spec.choices[0].text, text)

        def chat():
            messages = [{"role": "system", "content": "You are a concise assistant."},
                        {"role": "user", "content": "Name a fruit that is yellow."}]
            whole = client.chat.completions.create(model=state["model"], messages=messages,
                                                   max_tokens=20, temperature=0)
            msg = whole.choices[0].message
            assert msg.role == "assistant" and msg.content, msg
            assert whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0]
            parts = []
            for chunk in client.chat.completions.create(model=state["model"], messages=messages,
                                                        max_tokens=20, temperature=0,
                                                        stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            assert "".join(parts) == msg.content, ("".join(parts), msg.content)

        def errors():
            cases = [
                ("temperature -1", dict(temperature=-1), openai.BadRequestError),
                ("n = 2", dict(n=2), openai.BadRequestError),
                ("top_p 2", dict(top_p=2), openai.BadRequestError),
                ("max_tokens 10^9", dict(max_tokens=10**9), openai.BadRequestError),
                ("spec k 99", dict(extra_body={"num_speculative_tokens": 99}),
                 openai.BadRequestError),
                ("logit_bias key", dict(logit_bias={"not-a-token": 1}), openai.BadRequestError),
            ]
            for name, kw, exc in cases:
                args = dict(model=state["model"], prompt="hi", max_tokens=4)
                args.update(kw)
                try:
                    client.completions.create(**args)
                except exc as e:
                    assert e.body is None or isinstance(e.body, dict), e.body
                    continue
                raise AssertionError(f"{name}: no {exc.__name__}")
            try:
                client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
                raise AssertionError("unknown model accepted")
            except openai.NotFoundError:
                pass
            # Still serving.
            ok = client.completions.create(model=state["model"], prompt="hi", max_tokens=2)
            assert ok.usage.completion_tokens >= 1, ok.usage

        def disconnect():
            stream = client.completions.create(model=state["model"], prompt="Count: one, two,",
                                               max_tokens=4000, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True})
            got = 0
            for chunk in stream:
                got += 1
                if got == 3:
                    assert gauge(metrics, "tandem_num_requests_running") >= 1, "not counted"
                    break
            stream.close()  # the connection goes away mid-stream
            wait_for(lambda: gauge(metrics, "tandem_num_requests_running") == 0, 30,
                     "the abandoned stream's call to end")

        checks.run("models.list", models)
        checks.run("completions: whole == streamed, usage, per-request speculation", completion)
        checks.run("chat.completions: whole == streamed", chat)
        checks.run("errors as typed exceptions, server still serving", errors)
        checks.run("a stream closed mid-way ends its call", disconnect)

        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        if rc == 0:
            checks.passed += 1
            print("[ok] SIGTERM: serve exits 0", flush=True)
        else:
            checks.failed += 1
            print(f"[FAILED] SIGTERM: serve exited {rc}", flush=True)
        print(f"{checks.passed} passed, {checks.failed} failed")
        if checks.failed:
            log.flush()
            print(open(os.path.join(tmp, "serve.log")).read()[-4000:], file=sys.stderr)
        return 1 if checks.failed else 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
