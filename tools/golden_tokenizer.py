#!/usr/bin/env python3
"""Tokenizer goldens for tests/common/tokenizer*_test.cc.

Writes, under tests/data/:
  tokenizer_smollm2.jsonl  SmolLM2 (byte-level BPE, pre "smollm") ids from two
                           independent references: llama.cpp (llama-cpp-python,
                           vocab_only) and HF transformers (tokenizer rebuilt
                           from the GGUF). Where they disagree, a third
                           reference decides: HF `tokenizers` configured as
                           SmolLM2's original tokenizer.json (Digits(individual)
                           + ByteLevel), and the line records why.
  tiny_spm.gguf            a tiny SentencePiece BPE model (byte fallback),
                           trained here, as a vocab-only GGUF written the way
                           llama.cpp's converter writes one.
  tokenizer_tiny_spm.jsonl ids from sentencepiece itself and from llama.cpp on
                           tiny_spm.gguf.
  chat_templates.json      ChatML (SmolLM2's template from the GGUF), Llama 3
                           and Llama 2 templates rendered with jinja2.

Everything is deterministic: the strings come from fixed lists and a seeded
PRNG. Run with the reference env (tools/setup_ref_env.sh):
  /work/refvenv/bin/python tools/golden_tokenizer.py [--model PATH]
"""

import argparse
import io
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# ----------------------------------------------------------------------------
# Test strings
# ----------------------------------------------------------------------------

HAND_WRITTEN = [
    "",
    " ",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello world ",
    "  leading two spaces",
    "trailing two spaces  ",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
    "Tokenization is the process of splitting text into tokens.",
    "What is the capital of France? The capital of France is Paris.",
    "I'm sure you're right; they've said it's fine, we'll see, he'd know.",
    "I'M SURE YOU'RE RIGHT, IT'S FINE",
    "don't can't won't shouldn't",
    "'s 're 've 'm 'll 'd 't",
    "rock 'n' roll",
    "\"Quoted\" and 'single quoted' text",
    "e.g. i.e. etc. Mr. Dr. St.",
    "email@example.com https://example.com/path?q=1&r=2#frag",
    "C:\\Users\\name\\file.txt",
    "/usr/local/bin/python3 --version",
    "Price: $1,299.99 (20% off!)",
    "3.14159265358979",
    "1,000,000",
    "2024-12-31T23:59:59Z",
    "+1 (555) 123-4567",
    "0x1F 0b1010 0o777 1e-9 6.02e23",
    "version 1.2.3-rc.4+build.5",
    "Tab\tseparated\tvalues",
    "Line one\nLine two\nLine three",
    "Windows\r\nline\r\nendings",
    "Mixed \t \n whitespace \r\n  end",
    "\n\n\nthree newlines first",
    "ends with newline\n",
    "a\u00a0b non-breaking space",
    "zero\u200bwidth space",
    "ideographic\u3000space",
    # Accents and combining marks.
    "café naïve résumé coöperate",
    "cafe\u0301 (combining acute)",
    "Ångström Øresund Ærø",
    "Straße Größe Fußgänger",
    "Việt Nam, tiếng Việt",
    "Zdravo, kako ste? Čćžšđ",
    "Ελληνικά: Καλημέρα κόσμε",
    "Русский: Привет, мир!",
    "Українська мова",
    # CJK, Hangul, other scripts.
    "你好，世界！",
    "我喜欢学习中文。",
    "日本語のテキストです。カタカナ、ひらがな、漢字。",
    "東京タワーは333メートルです",
    "안녕하세요, 세계!",
    "한국어 텍스트 토큰화",
    "ภาษาไทย สวัสดีครับ",
    "हिन्दी में नमस्ते दुनिया",
    "বাংলা ভাষা",
    "தமிழ் மொழி",
    "ქართული ენა",
    "Հայերեն լեզու",
    "አማርኛ ቋንቋ",
    # RTL.
    "مرحبا بالعالم",
    "العربية: ١٢٣٤٥٦٧٨٩٠",
    "שלום עולם",
    "English then עברית then English",
    "فارسی: سلام دنیا",
    # Emoji.
    "😀",
    "😀😃😄😁",
    "I love 🍕 and 🍣!",
    "👨‍👩‍👧‍👦 family (ZWJ)",
    "👩🏽‍💻 technologist with skin tone",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "Flags: 🇺🇸 🇯🇵 🇫🇷 🇧🇷",
    "🏳️‍🌈 and 🏴‍☠️",
    "❤️ ❤ ♥ ✨ ☃️",
    "keycaps 1️⃣ 2️⃣ #️⃣",
    "emoji at end 🎉",
    # Symbols and math.
    "∀x ∈ ℝ: x² ≥ 0",
    "½ ¼ ¾ ² ³ ⁴ ₁ ₂ Ⅻ",
    "→ ← ↑ ↓ ⇒ ⇔ ∞ ≈ ≠",
    "© ® ™ § ¶ † ‡ • …",
    "€100 £50 ¥1000 ₹500 ₿0.01",
    "----- ===== ***** ##### _____",
    "!!!???...,,,;;;:::",
    "(((nested))) [[[brackets]]] {{{braces}}}",
    "<html><body><p>Hello</p></body></html>",
    "<div class=\"x\">&amp; &lt; &gt; &quot;</div>",
    # Special-token text.
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|>",
    "a<|im_end|>b",
    " <|im_start|> ",
    "<<|im_start|>>",
    "<|im_start|>user<|im_start|>user",
    "<|im_sta",
    "<|im_start|",
    "|im_end|>",
    "<|im_end",
    "<|IM_START|>",
    "< |im_start| >",
    "<repo_name>tandem<file_sep>main.cc",
    "<filename>src/main.rs<gh_stars>100",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "text before<|endoftext|>text after",
    "<s> </s> <unk> [INST] <<SYS>>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
    # Bytes SmolLM2 has no byte-level token for (both references drop them).
    "a\x04b", "x\x1dy", "\x13\x14\x16", "\U00050000 plane 5", "\U00090000",
    "control \x01\x02\x07\x1b[0m",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\nx = np.arange(10).reshape(2, 5)\nprint(x.T @ x)",
    "class Foo(Base):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n",
    "for (int i = 0; i < n; ++i) {\n  sum += a[i] * b[i];\n}",
    "#include <iostream>\nint main() {\n    std::cout << \"Hello, world!\" << std::endl;\n    return 0;\n}\n",
    "template <typename T>\nstd::vector<T> Map(const std::vector<T>& v) { return v; }",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);",
    "function hello() { return 'world'; } // comment",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<root attr=\"1\"/>",
    "x = [i**2 for i in range(100) if i % 3 == 0]",
    "if (a && b || !c) { x |= 0xFF; y <<= 2; z ^= ~w; }",
    "    indented with four spaces\n\tindented with a tab\n        eight spaces",
    "// TODO(user): fix this\n/* block\n   comment */",
    "public static void main(String[] args) { System.out.println(args.length); }",
    "$ git commit -m \"Fix bug #1234\" && git push origin main",
    "matrix[i][j] = matrix[i-1][j-1] + 1;",
    "λx.λy.x  -- lambda calculus",
    "df.groupby('col').agg({'val': ['mean', 'std']}).reset_index()",
    "<script>alert('xss')</script>",
    "a==b!=c<=d>=e->f=>g::h",
    "snake_case camelCase PascalCase SCREAMING_CASE kebab-case",
    "@decorator\ndef f(): pass",
    "```python\nprint('markdown code block')\n```",
    "| col1 | col2 |\n|------|------|\n| a    | b    |",
    "# Heading\n\n- item 1\n- item 2\n\n**bold** _italic_ `code`",
]


def programmatic_strings():
    out = []
    # Digit runs of every length 1..24, bare, after a space and inside words.
    digits = "12345678901234567890123456789"
    for n in range(1, 25):
        out.append(digits[:n])
    for n in (1, 2, 3, 4, 5, 7, 10, 16):
        out.append(" " + digits[:n])
        out.append("x" + digits[:n] + "y")
        out.append("abc " + digits[:n] + " def")
    out += ["0", "00", "000", "0000", "007", "1 2 3 4 5", "10 100 1000 10000", "3.0", "-42", "+7"]
    out += ["١٢٣", "०१२३", "一二三", "１２３", "Ⅳ"]
    # Whitespace runs.
    for n in range(1, 9):
        out.append(" " * n)
        out.append("a" + " " * n + "b")
    for n in (1, 2, 3, 5):
        out.append("\t" * n)
        out.append("\n" * n)
        out.append("x" + "\n" * n + "y")
        out.append("x" + "\t" * n + "y")
    out += ["\r\n", "\r\n\r\n", "a\r\nb", "\r", " \n", "\n ", " \t \n ", "word \n\n  next", "  \t\t  "]
    # Repetitions.
    for ch in ("a", "ab", "-", "=", ".", "é", "中", "😀", "!?"):
        out.append(ch * 17)
    # Leading / trailing spaces around various words.
    for w in ("hello", "Hello", "HELLO", "123", "中文", "émigré", "😀"):
        out.append(" " + w)
        out.append(w + " ")
        out.append("  " + w + "  ")
    # Seeded random mixtures from a pool covering the categories above.
    pool = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        + list("0123456789") * 2
        + list(" " * 12)
        + list("\n\t\r")
        + list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`")
        + list("éèêëàâäöüßçñøåæœ")
        + list("中文日本語한국어")
        + ["😀", "🎉", "👍🏽", "🇯🇵", "👨‍👩‍👧", "\u0301", "\u200d", "ـ", "א", "ب"]
        + ["<|im_start|>", "<|im_end|>", "'s", "'ll", "<|im_"]
    )
    rng = random.Random(1234)
    for _ in range(120):
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(pool) for _ in range(n)))
    # Random words joined with assorted separators.
    words = ["the", "model", "token", "cache", "GPU", "prefill", "decode", "batch", "KV",
             "latency", "throughput", "naïve", "中文", "データ", "😀", "2048", "x86_64"]
    for _ in range(40):
        n = rng.randint(2, 10)
        seps = [" ", "  ", "\n", "\t", ", ", ". ", "-", "_", "/", " \n"]
        s = rng.choice(words)
        for _ in range(n):
            s += rng.choice(seps) + rng.choice(words)
        out.append(s)
    return out


def all_strings():
    seen = set()
    out = []
    for s in HAND_WRITTEN + CODE + programmatic_strings():
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


# Strings with characters the tiny SPM model has never seen, to exercise
# byte fallback (on top of the CJK / emoji in the common set).
SPM_EXTRA = [
    "Ωmega ∑ sum ∫ integral",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙",
    "\U0001F9EC DNA \U0001FAE0",
    "ǅ ǈ ǋ ǲ titlecase digraphs",
    "Ꭰ Ꭱ Ꭲ Cherokee",
    "unseen: ꙮ ᚠᚢᚦ ᠮᠣᠩᠭᠣᠯ",
    "mixed ascii and 漢字 and 😀 and ü",
    "\u00ff\u0100\u0101 latin extended",
]

# ----------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------


def llama_cpp_vocab(path):
    from llama_cpp import Llama

    return Llama(model_path=path, vocab_only=True, verbose=False)


def llama_cpp_ids(llm, text):
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))


def original_smollm2_tokenizer(path):
    """SmolLM2's tokenizer.json, rebuilt from the GGUF vocab and merges.

    SmolLM2 (HuggingFaceTB/SmolLM2-*-Instruct) ships pre_tokenizer =
    Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
    use_regex=True)] and ByteLevel decoding; its control tokens are added
    special tokens. transformers' GGUF loader does not restore the Digits
    step (GGUF only says pre = "smollm"), so it is rebuilt here to arbitrate.
    """
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.merges"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    return tok


def smollm2_goldens(model_path):
    from transformers import AutoTokenizer

    llm = llama_cpp_vocab(model_path)
    hf = AutoTokenizer.from_pretrained(os.path.dirname(model_path),
                                       gguf_file=os.path.basename(model_path))
    orig = original_smollm2_tokenizer(model_path)
    rows, disagreements = [], 0
    for text in all_strings():
        a = llama_cpp_ids(llm, text)
        b = hf.encode(text, add_special_tokens=False)
        row = {"text": text}
        if a == b:
            row["ids"] = a
        else:
            disagreements += 1
            o = orig.encode(text, add_special_tokens=False).ids
            row["llama_cpp"] = a
            row["hf_gguf"] = b
            row["original"] = o
            if o == a:
                row["ids"] = a
                row["chosen"] = "llama_cpp"
                row["why"] = diagnose(text, a, b, orig)
            elif o == b:
                row["ids"] = b
                row["chosen"] = "hf_gguf"
                row["why"] = "hf_gguf matches SmolLM2's original tokenizer; llama.cpp differs"
            else:
                row["ids"] = o
                row["chosen"] = "original"
                row["why"] = "neither reference matches the original tokenizer"
        rows.append(row)
    return rows, disagreements


def diagnose(text, a, b, orig):
    if any(c.isdigit() or c.isnumeric() for c in text):
        return ("HF's GGUF loader drops SmolLM2's Digits(individual_digits=True) "
                "pre-tokenizer (pre='smollm'); llama.cpp splits every digit as the "
                "original tokenizer does")
    return "llama.cpp matches SmolLM2's original tokenizer; HF's GGUF rebuild differs"


# ----------------------------------------------------------------------------
# Tiny SentencePiece model
# ----------------------------------------------------------------------------

SPM_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Tokenizers split text into pieces; a model reads the pieces as numbers and predicts the next one.
In the beginning the prefill phase reads the whole prompt, then the decode phase makes one token per step.
Paged attention keeps the key and value cache in fixed blocks, so memory is not wasted on padding.
Continuous batching lets new requests join the running batch as soon as others finish.
She said: "It's not what you look at that matters, it's what you see." They've been there, we'll go too.
def main():
    print("hello, world")
    for i in range(10):
        total += i * 2
    return total
int main(int argc, char** argv) { return argc > 1 ? 0 : 1; }
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 1,000,000 99.9% $5.00
Le café est très bon, naïve façon, à bientôt! Über die Brücke gehen wir früh.
El niño comió una manzana en la mañana. ¿Dónde está la biblioteca?
Questions? Answers! Lists: apples, oranges, pears; colors - red, green, blue.
The weather today is sunny with a chance of rain in the evening and wind from the west.
Machine learning models learn patterns from data and generalize to new examples they have not seen.
Every sequence has a block table that maps its token positions to physical cache blocks.
Latency and throughput trade off: bigger batches raise throughput but each step takes longer.
Time to first token measures the prefill, and time per output token measures each decode step.
    indented line with spaces
\tindented line with a tab
Email me at someone@example.com or visit https://example.org/docs/index.html for details.
"""


def train_tiny_spm():
    import sentencepiece as spm

    lines = SPM_CORPUS.splitlines() * 4
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="bpe",
        vocab_size=600,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",  # as Llama 2: no NFKC
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def write_spm_gguf(sp, path):
    """Vocab-only GGUF, as llama.cpp's convert_hf_to_gguf writes a SPM vocab."""
    import gguf

    n = sp.get_piece_size()
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        else:
            t = gguf.TokenType.NORMAL
        types.append(t)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-spm")
    # Hyperparameters llama.cpp reads even with vocab_only.
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_goldens(gguf_path, sp):
    llm = llama_cpp_vocab(gguf_path)
    specials = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                if sp.is_control(i) or sp.is_unknown(i)]
    rows, disagreements = [], 0
    for text in all_strings() + SPM_EXTRA:
        a = llama_cpp_ids(llm, text)
        b = sp.encode(text, out_type=int)
        row = {"text": text}
        if a == b:
            row["ids"] = a
        else:
            disagreements += 1
            row["llama_cpp"] = a
            row["sentencepiece"] = b
            # sentencepiece never parses special-token text, and llama.cpp also
            # re-adds the space prefix after every special token. Tandem follows
            # llama.cpp there (the engine must see <s> as BOS, as llama.cpp does).
            if any(s in text for s in specials):
                row["ids"] = a
                row["chosen"] = "llama_cpp"
                row["why"] = ("special-token text: sentencepiece encodes it as plain text; "
                              "llama.cpp (special=True) maps it to the token and adds a "
                              "space prefix after it")
            else:
                row["ids"] = b
                row["chosen"] = "sentencepiece"
                row["why"] = "sentencepiece is the model's own tokenizer"
        rows.append(row)
    return rows, disagreements


# ----------------------------------------------------------------------------
# Chat templates
# ----------------------------------------------------------------------------

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  And 3+3?\n"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell me a joke."},
     {"role": "assistant", "content": " Why did the chicken cross the road? "},
     {"role": "user", "content": "Why? 中文 😀"}],
]


def chat_goldens(model_path):
    import jinja2
    from gguf import GGUFReader

    r = GGUFReader(model_path)
    field = r.fields["tokenizer.chat_template"]
    smol = bytes(field.parts[field.data[0]]).decode("utf-8")

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    templates = {
        "chatml": (smol, "<|im_start|>", "<|im_end|>"),
        "llama3": (LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
        "llama2": (LLAMA2_TEMPLATE, "<s>", "</s>"),
    }
    out = {"templates": {k: v[0] for k, v in templates.items()}, "cases": []}
    for name, (tmpl, bos, eos) in templates.items():
        t = env.from_string(tmpl)
        for msgs in CONVERSATIONS:
            for gen in (False, True):
                text = t.render(messages=msgs, add_generation_prompt=gen,
                                bos_token=bos, eos_token=eos)
                out["cases"].append({"format": name, "messages": msgs,
                                     "add_generation_prompt": gen, "text": text})
    return out


# ----------------------------------------------------------------------------


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args()
    os.makedirs(DATA, exist_ok=True)

    rows, dis = smollm2_goldens(args.model)
    write_jsonl(os.path.join(DATA, "tokenizer_smollm2.jsonl"), rows)
    print(f"smollm2: {len(rows)} strings, {dis} reference disagreements")
    for r in rows:
        if "chosen" in r:
            print("  ", repr(r["text"])[:60], "->", r["chosen"], ":", r["why"][:80])

    sp = train_tiny_spm()
    gguf_path = os.path.join(DATA, "tiny_spm.gguf")
    write_spm_gguf(sp, gguf_path)
    rows, dis = spm_goldens(gguf_path, sp)
    write_jsonl(os.path.join(DATA, "tokenizer_tiny_spm.jsonl"), rows)
    print(f"tiny_spm: vocab {sp.get_piece_size()}, {len(rows)} strings, "
          f"{dis} reference disagreements")
    for r in rows:
        if "chosen" in r:
            print("  ", repr(r["text"])[:60], "->", r["chosen"])

    chat = chat_goldens(args.model)
    with open(os.path.join(DATA, "chat_templates.json"), "w", encoding="utf-8") as f:
        json.dump(chat, f, ensure_ascii=False, indent=1)
    print(f"chat: {len(chat['cases'])} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
