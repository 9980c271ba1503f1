#!/usr/bin/env python3
"""A tiny bf16 checkpoint whose projections are FP8 e4m3 with 128 x 128 block scales (the
layout of Qwen3-*-FP8 and DeepSeek-V3, `quant_method: "fp8"`), written with HF transformers'
own FP8 tooling, and transformers' greedy ids on it as loaded.

    python tests/fp8_golden.py --out-model tests/golden/fp8-block --out tests/golden/fp8-block.json

1. A seeded Llama (hidden 256, 8 heads of 32, 4 KV heads, MLP 256, 2 layers: every projection's
   dims are multiples of 128) is made by transformers in bf16; its weights are drawn wider than
   the default init so that the greedy steps are not near ties.
2. Each projection goes through transformers' own quantizer op
   (`integrations.finegrained_fp8.Fp8Quantize`, what `FineGrainedFP8Config` saves with): e4m3
   values and a `weight_scale_inv` [rows / 128, cols / 128] in f32. The rest stays bf16. The
   config's `quantization_config` is `FineGrainedFP8Config(weight_block_size=[128, 128])`.
3. transformers loads that directory itself (on a CPU it dequantizes the FP8 weights into the
   model's bf16, value times scale in f32 then rounded), every tensor read; the loaded weights
   must equal the quantizer's values times their scales. The model is then widened to f32 and
   tests/hf_golden.py's greedy run on four seeded id prompts writes OUT.
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, LlamaConfig
from transformers.integrations.finegrained_fp8 import Fp8Quantize
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_golden import run  # noqa: E402

BLOCK = 128
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=12)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p, dtype=torch.float32))
            else:
                p.copy_(torch.randn_like(p, dtype=torch.float32) * (0.1 if "embed" not in name else 1.0))

    fp8 = FineGrainedFP8Config(weight_block_size=[BLOCK, BLOCK])
    quantize = Fp8Quantize(FineGrainedFP8HfQuantizer(fp8))
    tensors, expect = {}, {}
    for name, p in model.state_dict().items():
        if name.endswith(".weight") and name.rsplit(".", 2)[-2] in PROJ:
            out = quantize.convert({name: p})
            q, s = out[name], out[name[: -len(".weight")] + ".weight_scale_inv"]
            assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == (p.shape[0] // BLOCK, p.shape[1] // BLOCK), name
            tensors.update(out)
            blocks = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
            expect[name] = (q.float() * blocks).to(torch.bfloat16)
        else:
            tensors[name] = p.contiguous()
    shutil.rmtree(a.out_model, ignore_errors=True)
    os.makedirs(a.out_model)
    save_file(tensors, os.path.join(a.out_model, "model.safetensors"), metadata={"format": "pt"})
    doc = cfg.to_dict()
    doc["dtype"] = "bfloat16"
    doc["architectures"] = ["LlamaForCausalLM"]
    doc["quantization_config"] = fp8.to_dict()
    with open(os.path.join(a.out_model, "config.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    hf, info = AutoModelForCausalLM.from_pretrained(a.out_model, dtype=torch.bfloat16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit(f"{a.out_model}: transformers did not read the checkpoint as written: {bad}")
    for name, w in expect.items():
        got = hf.get_parameter(name)
        assert got.dtype == torch.bfloat16 and torch.equal(got, w), f"{name}: transformers' dequantized weight differs"
    hf = hf.float()
    hf.eval()
    cases = []
    for n, seed in [(1, 1), (7, 2), (23, 3), (40, 4)]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
        out, top5, gaps = run(hf, ids, 12)
        cases.append({"kind": "ids", "prompt_ids": ids, "greedy": out, "top5": top5, "gap": gaps})
    with open(a.out, "w") as f:
        json.dump({"model": "fp8-block", "steps": 12, "cases": cases}, f)
        f.write("\n")
    gaps = sorted(g for c in cases for g in c["gap"])
    print(f"wrote {a.out_model} ({len(expect)} FP8 weights) and {a.out}; smallest gaps {gaps[:3]}", file=sys.stderr)


if __name__ == "__main__":
    main()
