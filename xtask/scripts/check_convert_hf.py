"""Checks a converted SmolLM2 directory against Hugging Face's own GGUF loader.

Usage: PYTHONPATH=<dir with the `gguf` package> python check_convert_hf.py GGUF CONVERTED_DIR

Needs torch, transformers and tokenizers (a CPU install is enough). Compares
1. every tensor: transformers' dequantised + un-permuted weights, rounded to bf16, against ours;
2. token ids of tricky strings: transformers' GGUF tokenizer against our tokenizer.json;
3. the chat template rendering, and a short greedy answer from our directory.
Exits non-zero on the first mismatch.
"""
import sys

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf_path, ours = sys.argv[1], sys.argv[2]
gguf_dir, gguf_name = gguf_path.rsplit("/", 1)

ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
ref_sd = ref.state_dict()
our_sd = load_file(f"{ours}/model.safetensors")
missing = [k for k in ref_sd if k not in our_sd and k != "lm_head.weight"]
extra = [k for k in our_sd if k not in ref_sd]
assert not missing and not extra, f"missing {missing[:5]} extra {extra[:5]}"
worst = 0.0
for name, t in our_sd.items():
    r = ref_sd[name].to(torch.bfloat16)
    assert r.shape == t.shape, f"{name}: {tuple(r.shape)} vs {tuple(t.shape)}"
    diff = (r.float() - t.float()).abs().max().item()
    worst = max(worst, diff)
    if diff != 0.0:
        print(f"MISMATCH {name}: max abs diff {diff}")
        sys.exit(1)
print(f"weights: {len(our_sd)} tensors identical to transformers' GGUF loader (bf16-rounded)")

ref_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
# transformers' GGUF tokenizer ignores `tokenizer.ggml.pre` and uses plain ByteLevel. The original
# SmolLM2 tokenizer.json (and llama.cpp's `smollm` pre-tokenizer) first isolates every numeric
# character; give the reference that, so the comparison is against the original behaviour
# (it matters for characters such as "½" or "Ⅻ").
from tokenizers import pre_tokenizers as pt
ref_tok.backend_tokenizer.pre_tokenizer = pt.Sequence(
    [pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)]
)
our_tok = Tokenizer.from_file(f"{ours}/tokenizer.json")
cases = [
    "Hello, world! 12345",
    "What is the capital of France?",
    "  leading spaces and\ttabs\n\nnewlines",
    "数字 123 和中文，日本語のテキスト",
    "emoji 🤗🚀 and accents: café naïve",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "3.14159 1,000,000 ½ ² Ⅻ",
]
bad = 0
for s in cases:
    a = ref_tok.encode(s, add_special_tokens=False)
    b = our_tok.encode(s, add_special_tokens=False).ids
    status = "ok" if a == b else "DIFF"
    bad += a != b
    print(f"{status:4} {s!r:50} {b[:16]}")
    if a != b:
        print(f"     transformers: {a[:16]}")
assert bad == 0, f"{bad} tokenization mismatches"

from transformers import AutoTokenizer as AT
mine = AT.from_pretrained(ours)
msgs = [{"role": "user", "content": "What is the capital of France?"}]
text = mine.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
print(repr(text))
model = AutoModelForCausalLM.from_pretrained(ours, dtype=torch.float32)
ids = torch.tensor([mine(text, add_special_tokens=False)["input_ids"]])
out = model.generate(ids, max_new_tokens=16, do_sample=False)
answer = mine.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
print("greedy answer:", repr(answer))
assert "Paris" in answer, answer
print("ALL CHECKS PASSED")
