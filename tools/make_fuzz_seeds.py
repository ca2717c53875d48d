#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets in tests/fuzz/corpus/<target>/.

json, tokenizer and prompt_file seeds are text; validate seeds are
tandem.v1.GenerateRequest messages and kv_push seeds are KvChunk streams
([u16 length][KvChunk]...), both encoded with `protoc --encode` from the
project's .proto files. Run from the repository root:
    python3 tools/make_fuzz_seeds.py
"""
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def encode(message, text):
    return subprocess.run(
        ["protoc", "-I", os.path.join(ROOT, "proto"), f"--encode={message}",
         "tandem/v1/generation.proto", "tandem/v1/worker.proto"],
        input=text.encode(), capture_output=True, check=True).stdout


def main():
    # JSON
    for i, s in enumerate([
            '{"prompt": "hello", "max_tokens": 8, "stop": ["\\n"]}',
            '[1, 2.5e-3, -0, true, false, null, "a\\u00e9\\ud83d\\ude00"]',
            '{"a": {"b": {"c": [[[[]]]]}}}', '"\\uD800"', '{"x":1,"x":2}',
            '1e400', '{"k": "\x01"}', '[' * 40 + ']' * 40]):
        write("json", f"seed{i}", s)
    # Tokenizer
    for i, s in enumerate([
            "Hello, world!", "<|im_start|>user\nhi<|im_end|>", "  leading and trailing  ",
            "naïve café 東京 🎉", "\xff\xfe invalid \xc0\x80", "a" * 300, "\n\n\t \r\n",
            "12345 67.89 -0x1F", "<s> [INST] hi [/INST]"]):
        write("tokenizer", f"seed{i}", s)
    # Prompt files
    for i, s in enumerate([
            "one prompt\nanother prompt\n",
            '{"prompt": "hi", "max_tokens": 4, "temperature": 0.5, "top_k": 3, "top_p": 0.9}\n',
            '{"prompt": "x", "stop": ["a", "b"], "seed": 7, "ignore_eos": true, "min_p": 0.1}\n',
            '{"prompt": 5}\n', '{"prompt": "x", "max_tokens": -1}\n', '{not json\n',
            "\n\n   \n", '{"prompt": "x", "unknown": 1}\n']):
        write("prompt_file", f"seed{i}", s)
    # GenerateRequest
    for i, t in enumerate([
            'text: "Hello" stop { max_tokens: 8 }',
            'token_ids { ids: [1, 2, 3] } sampling { temperature: 0.7 top_k: 5 seed: 9 }',
            'messages { messages { role: "user" content: "hi" } } logprobs { enabled: true top_logprobs: 3 }',
            'text: "x" stop { stop: ["a", "bb"] stop_token_ids: [2] min_tokens: 1 max_tokens: 4 }',
            'text: "x" sampling { logit_bias { key: 5 value: 10 } repetition_penalty: 1.2 }',
            'token_ids { ids: [-1, 99999999] }', 'request_id: "r" cache_salt: "s" text: ""']):
        write("validate", f"seed{i}", encode("tandem.v1.GenerateRequest", t))
    # KV push streams: header + data chunks.
    def stream(*chunks, flag=0):
        out = bytes([flag])
        for c in chunks:
            out += struct.pack("<H", len(c)) + c
        return out
    # hash 0 is wrong; kv_push_fuzz replaces the compat with the worker's
    # own when the flag byte's bit 0 is clear, so both paths get exercised.
    compat = ('compat { model_name: "fuzz" model_fingerprint: 42 kv_dtype: "f32" block_size: 16 '
              'num_layers: 2 num_kv_heads: 1 head_dim: 4 hash: 0 }')
    header = encode("tandem.v1.KvChunk",
                    f'header {{ kv_handle: "h" request_id: "r" {compat} num_tokens: 2 '
                    'total_bytes: 128 bytes_per_token: 64 token_ids: [1, 2] }')
    data64 = encode("tandem.v1.KvChunk", 'data: "' + "\\000" * 64 + '"')
    write("kv_push", "header_only", stream(header))
    write("kv_push", "two_chunks", stream(header, data64, data64))
    write("kv_push", "too_much", stream(header, data64, data64, data64))
    write("kv_push", "data_first", stream(data64, header))
    write("kv_push", "second_header", stream(header, data64, header))
    write("kv_push", "foreign_compat", stream(header, data64, data64, flag=1))

    # `tandem perplexity` KLD base files (services/cli/kld_base.h, version 1):
    # n_vocab 5, n_ctx 8, 2 chunks x 3 scored tokens, top-2.
    def kld_base(n_chunks=2, scored=3, top_k=2, name=b"tiny.gguf", records=None):
        head = struct.pack("<II3Q6I", 1, 64 + len(name), 0x1234, 0x5678, 0x9ABC,
                           5, 8, n_chunks, scored, top_k, len(name))
        body = b"".join(struct.pack("<f", 0.5 + i) +
                        b"".join(struct.pack("<If", (i + j) % 5, -0.7 * (j + 1))
                                 for j in range(top_k))
                        for i in range(n_chunks * scored if records is None else records))
        return b"TNDMKLDB" + head + name + body
    good = kld_base()
    write("kld_base", "valid", good)
    write("kld_base", "valid_top1_one_chunk", kld_base(n_chunks=1, top_k=1))
    write("kld_base", "truncated", good[:-5])
    write("kld_base", "trailing", good + b"x")
    write("kld_base", "header_only", good[:73])
    write("kld_base", "wrong_magic", b"XXXXXXXX" + good[8:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
