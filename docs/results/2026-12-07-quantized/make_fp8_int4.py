#!/usr/bin/env python3
"""FP8 and int4 twins of a bf16 Hugging Face directory, for the bench, each written by the
tooling of the format's own project:

    python make_fp8_int4.py SRC OUT_FP8 OUT_INT4

- OUT_FP8: every projection through transformers' own FP8 quantizer op
  (`integrations.finegrained_fp8.Fp8Quantize`, what `FineGrainedFP8Config` saves with): e4m3
  with 64 x 64 block scales (SmolLM2's 576 is not a multiple of 128), `quant_method: "fp8"`;
  the rest stays bf16.
- OUT_INT4: compressed-tensors' own `ModelCompressor` in `pack-quantized` format: every
  projection int4, asymmetric, groups of 32 (as tests/int4_golden.py), the rest bf16.
The tokenizer files are copied into both.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import Fp8Quantize
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def copy_tokenizer(src, out):
    for f in TOKENIZER:
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out)


def write_fp8(src, out, block=64):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    fp8 = FineGrainedFP8Config(weight_block_size=[block, block])
    quantize = Fp8Quantize(FineGrainedFP8HfQuantizer(fp8))
    tensors, n = {}, 0
    for name, p in model.state_dict().items():
        if name.endswith(".weight") and name.rsplit(".", 2)[-2] in PROJ:
            got = quantize.convert({name: p})
            assert got[name].dtype == torch.float8_e4m3fn, f"{name}: not quantized (shape {tuple(p.shape)})"
            tensors.update(got)
            n += 1
        elif name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        else:
            tensors[name] = p.contiguous()
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = fp8.to_dict()
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    copy_tokenizer(src, out)
    print(f"{out}: {n} FP8 projections", file=sys.stderr)


def write_int4(src, out, group=32):
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format="pack-quantized")
    apply_quantization_config(model, config)
    with torch.no_grad():
        for name, m in model.named_modules():
            if not name.endswith(PROJ):
                continue
            w = m.weight.float().reshape(m.weight.shape[0], -1, group)
            scale, zp = calculate_qparams(w.amin(-1), w.amax(-1), args)
            m.weight_scale.data.copy_(scale.reshape(m.weight_scale.shape).to(m.weight_scale.dtype))
            m.weight_zero_point.data.copy_(zp.reshape(m.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    compressor.update_config(out)
    copy_tokenizer(src, out)
    print(f"{out}: int4 groups of {group}", file=sys.stderr)


if __name__ == "__main__":
    src, fp8_out, int4_out = sys.argv[1:4]
    write_fp8(src, fp8_out)
    write_int4(src, int4_out)
