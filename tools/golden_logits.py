#!/usr/bin/env python3
"""Reference logits for Tandem's forward-pass tests (tests/engine/llama_model_test.cc).

Produces, under tests/data/:
  logits_smollm2.json    HF transformers (float32, weights dequantized from the
                         GGUF by transformers' own GGUF loader) on the bundled
                         SmolLM2 GGUF: for each prompt the token ids (HF
                         tokenizer read from the same GGUF), the teacher-forced
                         top-20 logits (ids + values) and the full-vocab
                         logsumexp at every prompt position, and a 64-token
                         greedy continuation (EOS ignored) with the top-2 margin
                         of each greedy step.
  tiny_llama_mha.gguf    a tiny random HF LlamaForCausalLM (MHA, untied head,
                         rope theta 500000) written as llama.cpp's converter
                         would (tensor names, metadata, Q/K row permutation for
                         adjacent-pair rope), F32.
  tiny_llama_mha_logits.json  that model's full teacher-forced logits on random
                         token ids.

Usage: /work/refvenv/bin/python tools/golden_logits.py [--model PATH] [--out DIR]
"""
import argparse
import json
import math
import os

import numpy as np
import torch

TOP_K = 20
NUM_GREEDY = 64

LONG_PARAGRAPH = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg, a goldsmith from Mainz, combined several existing technologies into a "
    "practical system for mass-producing books. Movable type had been invented earlier in "
    "East Asia, where artisans carved characters from wood or cast them in ceramic and "
    "bronze, but the enormous number of characters in those writing systems limited its "
    "spread. Gutenberg's innovation was an adjustable hand mould that let a typesetter cast "
    "large quantities of uniform metal letters quickly, together with an oil-based ink that "
    "adhered to metal and a screw press adapted from those used to make wine and olive oil. "
    "Within fifty years of his first Bible, printing shops had opened in more than two "
    "hundred cities across Europe, and millions of volumes were in circulation. Prices of "
    "books fell dramatically, literacy rose, and scholars could compare identical copies of "
    "a text for the first time. Historians still debate how much the press caused the "
    "Reformation and the Scientific Revolution, but few doubt that it changed how ideas "
    "travelled."
)

PROMPTS = [
    ("capital", "The capital of France is"),
    ("chatml", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the tallest mountain in the "
               "world?<|im_end|>\n<|im_start|>assistant\n"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"),
    ("paragraph", LONG_PARAGRAPH),
    ("list", "Here are three tips for staying healthy:\n1."),
    ("numbers", "1, 2, 3, 5, 8, 13, 21,"),
    ("unicode", "Le café coûte 3€ à Paris — très cher! 日本語も少し。"),
    ("story", "Once upon a time, in a small village at the edge of a forest, there lived"),
]


def log(*a):
    print(*a, flush=True)


def smollm2_goldens(model_path, out_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(os.path.abspath(model_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    cases = []
    for name, text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            x = torch.tensor([ids])
            out = model(x, use_cache=True)
            logits = out.logits[0].double()  # [T, vocab]
            lse = torch.logsumexp(logits, dim=-1)
            top = torch.topk(logits, TOP_K, dim=-1)
            # Greedy continuation, EOS ignored, with the margin of each choice.
            past = out.past_key_values
            last = out.logits[0, -1]
            greedy, margins = [], []
            for _ in range(NUM_GREEDY):
                t2 = torch.topk(last, 2)
                nxt = int(t2.indices[0])
                greedy.append(nxt)
                margins.append(float(t2.values[0] - t2.values[1]))
                o = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, last = o.past_key_values, o.logits[0, -1]
        cases.append({
            "name": name,
            "text": text,
            "token_ids": ids,
            "top_ids": top.indices.tolist(),
            "top_logits": [[round(float(v), 5) for v in row] for row in top.values],
            "logsumexp": [round(float(v), 6) for v in lse],
            "greedy": greedy,
            "greedy_margins": [round(m, 5) for m in margins],
            "greedy_text": tok.decode(greedy),
        })
        log(f"{name}: {len(ids)} tokens -> {tok.decode(greedy)[:60]!r}")
    doc = {
        "model": os.path.basename(model_path),
        "reference": "HF transformers %s, torch %s, float32, GGUF dequantized by transformers"
                     % (__import__("transformers").__version__, torch.__version__),
        "top_k": TOP_K,
        "cases": cases,
    }
    with open(os.path.join(out_dir, "logits_smollm2.json"), "w") as fp:
        json.dump(doc, fp, separators=(",", ":"))


def permute_for_gguf(w, n_head):
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF rotates halves
    # (NeoX); the GGUF layout rotates adjacent pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def tiny_goldens(out_dir):
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    hidden, heads, layers, ff, vocab, ctx = 64, 4, 2, 160, 128, 256
    theta, eps = 500000.0, 1e-6
    kw = dict(hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
              max_position_embeddings=ctx, rms_norm_eps=eps, tie_word_embeddings=False,
              initializer_range=0.15, attention_bias=False, mlp_bias=False)
    try:
        cfg = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)
    except TypeError:
        cfg = LlamaConfig(rope_theta=theta, **kw)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    path = os.path.join(out_dir, "tiny_llama_mha.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama-mha")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_rope_dimension_count(hidden // heads)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_freq_base(theta)
    w.add_file_type(0)  # ALL_F32
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", permute_for_gguf(sd[p + "self_attn.q_proj.weight"], heads))
        w.add_tensor(b + "attn_k.weight", permute_for_gguf(sd[p + "self_attn.k_proj.weight"], heads))
        w.add_tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, vocab, size=n).tolist() for n in (37, 5)]
    cases = []
    for ids in seqs:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        cases.append({"token_ids": ids,
                      "logits": [[round(float(v), 6) for v in row] for row in logits]})
    with open(os.path.join(out_dir, "tiny_llama_mha_logits.json"), "w") as fp:
        json.dump({"model": "tiny_llama_mha.gguf", "cases": cases}, fp, separators=(",", ":"))
    log(f"wrote {path}")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests/data"))
    ap.add_argument("--only", choices=["smollm2", "tiny"], default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.only != "smollm2":
        tiny_goldens(a.out)
    if a.only != "tiny":
        smollm2_goldens(a.model, a.out)


if __name__ == "__main__":
    main()
