#!/usr/bin/env python3
"""Cross-checks `tandem tokenize` against llama.cpp (llama-cpp-python) on fresh
random strings (a different generator from the committed goldens).

Usage: .venv-ref/bin/python tools/crosscheck_tokenizer.py [--n 300] [--seed 1]
       [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--tandem build/tandem]
Prints each mismatch and a summary; exits 1 if any string differs.
"""
import argparse
import json
import random
import subprocess
import sys

RANGES = [
    (0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E),  # ASCII, weighted
    (0x00C0, 0x017F),  # Latin-1 supplement / Extended-A
    (0x0370, 0x03FF),  # Greek
    (0x0400, 0x04FF),  # Cyrillic
    (0x0590, 0x05FF),  # Hebrew
    (0x0600, 0x06FF),  # Arabic
    (0x0900, 0x097F),  # Devanagari
    (0x3040, 0x30FF),  # Kana
    (0x4E00, 0x9FFF),  # CJK
    (0xAC00, 0xD7A3),  # Hangul
    (0x1F300, 0x1FAFF),  # emoji
    (0x0300, 0x036F),  # combining marks
]
PIECES = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'ll", "123", "4567890", "0.5", "-",
          "<|im_start|>", "<|im_end|>", "<|endoftext|>", "def ", "()", "{}", "=>", "    ",
          "https://x.org/a?b=c", "ÿ", "\u200d", "\ufeff"]


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.35:
            parts.append(rng.choice(PIECES))
        elif r < 0.5:
            parts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9))))
        else:
            lo, hi = rng.choice(RANGES)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tandem", default="build/tandem")
    args = ap.parse_args()
    from llama_cpp import Llama
    llm = Llama(model_path=args.model, vocab_only=True, verbose=False)
    rng = random.Random(args.seed)
    bad = 0
    for i in range(args.n):
        s = random_string(rng)
        if "\x00" in s:
            continue
        want = llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
        out = subprocess.run([args.tandem, "tokenize", "--json", "--model", args.model, "--prompt", s],
                             capture_output=True, text=True, check=True).stdout
        got = json.loads(out)["token_ids"]
        if got != want:
            bad += 1
            print(f"MISMATCH {s!r}\n  llama.cpp {want}\n  tandem    {got}")
        if (i + 1) % 50 == 0:
            print(f"[{i + 1}/{args.n}] mismatches so far: {bad}", file=sys.stderr)
    print(f"{args.n - bad}/{args.n} identical")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
