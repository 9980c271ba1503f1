#!/usr/bin/env python3
"""Golden data for LoRA adapters from HF transformers + peft, which we did not write.

Makes a random LoRA adapter with peft itself over a model directory (B drawn nonzero,
`init_lora_weights=False`, so that the adapter changes the answers), saves it as peft saves
(adapter_config.json + adapter_model.safetensors), and writes the same JSON as hf_golden.py
(prompt ids, greedy ids, top-5 logprobs, gaps) for the model with the adapter applied. The
base model's own greedy ids are kept beside each case (`base_greedy`), so the test can check
that the adapter changes something.

    python tests/lora_golden.py --model DIR --adapter-out tests/golden/lora/NAME \
        --out tests/golden/lora/NAME.json --targets q_proj,v_proj --rank 8 --alpha 16 [--rslora] [--regex]
"""
import argparse
import json
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from hf_golden import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter-out", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", required=True, help="comma-separated module names, or a regex with --regex")
    ap.add_argument("--regex", action="store_true")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    prompts = []
    for n, seed in [(1, 11), (6, 12), (19, 13), (33, 14)]:
        g = torch.Generator().manual_seed(seed)
        prompts.append(torch.randint(0, vocab, (n,), generator=g).tolist())
    base = [run(model, ids, a.steps)[0] for ids in prompts]
    torch.manual_seed(a.seed)
    targets = a.targets if a.regex else a.targets.split(",")
    cfg = LoraConfig(
        r=a.rank,
        lora_alpha=a.alpha,
        use_rslora=a.rslora,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, cfg)
    peft_model.eval()
    peft_model.save_pretrained(a.adapter_out, safe_serialization=True)
    cases = []
    for ids, base_ids in zip(prompts, base):
        out, top5, gaps = run(peft_model, ids, a.steps)
        cases.append({"kind": "ids", "prompt_ids": ids, "greedy": out, "top5": top5, "gap": gaps, "base_greedy": base_ids})
    changed = sum(c["greedy"] != c["base_greedy"] for c in cases)
    if changed == 0:
        raise SystemExit(f"{a.adapter_out}: the adapter changes no answer; draw it larger")
    doc = {"model": a.model.rstrip("/").split("/")[-1], "adapter": os.path.basename(a.adapter_out.rstrip("/")), "steps": a.steps, "cases": cases}
    with open(a.out, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"wrote {a.out}: {len(cases)} cases, {changed} changed by the adapter")


if __name__ == "__main__":
    main()
