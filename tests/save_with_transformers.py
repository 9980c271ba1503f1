#!/usr/bin/env python3
"""A model directory as transformers itself saves it: loads DIR (a seeded random model from
`cargo xtask gen-model`) and writes it back with `save_pretrained`, so that its config.json has
the keys the installed transformers writes (5.x: Qwen3-MoE's `num_local_experts` for the
released files' `num_experts`). The weights are DIR's, so DIR's golden file holds for the copy.

    python tests/save_with_transformers.py --model target/golden/tiny-qwen3-moe \
        --out tests/golden/tiny-qwen3-moe-tf5
"""
import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.save_pretrained(a.out)
    # Only what a load reads: the config and the weights (the tokenizer is the source's).
    for f in os.listdir(a.out):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(a.out, f))
    cfg = json.load(open(os.path.join(a.out, "config.json")))
    print(f"transformers {transformers.__version__} wrote {a.out}: {sorted(k for k in cfg if 'expert' in k)}")


if __name__ == "__main__":
    main()
