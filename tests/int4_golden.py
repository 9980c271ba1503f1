#!/usr/bin/env python3
"""Tiny int4 checkpoints in the three formats vLLM serves (compressed-tensors `pack-quantized`,
AWQ gemm, GPTQ), all holding the same 4-bit weights, and HF transformers' greedy ids on them.

    python tests/int4_golden.py --model target/golden/tiny-int4-src --out tests/golden/int4

DIR is `cargo xtask gen-model --shape tiny --seed 11 --dtype f32` (tests/make_golden.sh).

1. compressed-tensors' own tooling quantizes every projection of DIR (asymmetric, groups of 32:
   `calculate_qparams` on each group's min and max, then `ModelCompressor.compress_model`) and
   writes OUT/ct.
2. The 4-bit values, zero points and scales are read back from OUT/ct with compressed-tensors'
   own `unpack_from_int32` and dequantized with its own `dequantize`; HF transformers runs DIR's
   model with those weights in place of its projections, and tests/hf_golden.py's greedy run on
   id prompts writes OUT/ct.json. (transformers 5.25 cannot load an asymmetric pack-quantized
   checkpoint itself: it expects the zero points unpacked, [out, groups], and reinitializes the
   packed [out/8, groups] ones, so it would run random zero points.)
3. The same values are written again in AWQ's layout (AutoAWQ `WQLinear_GEMM.from_linear`'s
   packing) to OUT/awq and GPTQ's (AutoGPTQ `QuantLinear.pack`, zeros stored minus one) to
   OUT/gptq. The AWQ and GPTQ packages need a GPU, so transformers does not load those two
   here: the golden file holds for them because the values are the same, which the Rust test
   checks by loading all three and comparing the weights bit for bit.
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.lifecycle.forward import dequantize
from compressed_tensors.quantization.utils import calculate_qparams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_golden import run  # noqa: E402

GROUP = 32
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def write_ct(src, out):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=GROUP)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format="pack-quantized")
    apply_quantization_config(model, config)
    with torch.no_grad():
        for name, m in model.named_modules():
            if not name.endswith(PROJ):
                continue
            w = m.weight.reshape(m.weight.shape[0], -1, GROUP)
            scale, zp = calculate_qparams(w.amin(-1), w.amax(-1), args)
            # Rounded to f16 so that AWQ and GPTQ (f16 scales) hold them exactly too.
            m.weight_scale.data.copy_(scale.half().float().reshape(m.weight_scale.shape))
            m.weight_zero_point.data.copy_(zp.reshape(m.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    for f in os.listdir(out):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out, f))


def unpacked(sd, stem):
    """The 4-bit values q [out, in] and zero points z [out, groups] as unsigned ints, and the
    scales s [out, groups], from compressed-tensors' own unpacking."""
    rows, cols = sd[f"{stem}.weight_shape"].tolist()
    groups = cols // GROUP
    q = unpack_from_int32(sd[f"{stem}.weight_packed"], 4, torch.Size([rows, cols])).to(torch.int32) + 8
    z = unpack_from_int32(sd[f"{stem}.weight_zero_point"], 4, torch.Size([rows, groups]), packed_dim=0).to(torch.int32) + 8
    s = sd[f"{stem}.weight_scale"].float()
    return q, z, s


def pack_cols(v, order):
    """AutoAWQ's packing of v [r, c] along c: word k holds column 8k + order[i] at bits 4i."""
    r, c = v.shape
    out = torch.zeros(r, c // 8, dtype=torch.int64)
    for k in range(c // 8):
        for i, o in enumerate(order):
            out[:, k] |= v[:, 8 * k + o].to(torch.int64) << (4 * i)
    return out


def to_i32(words):
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ct, awq, gptq = (os.path.join(a.out, n) for n in ("ct", "awq", "gptq"))
    for d in (ct, awq, gptq):
        shutil.rmtree(d, ignore_errors=True)
    write_ct(a.model, ct)

    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    hf.eval()
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=GROUP)
    sd = load_file(os.path.join(ct, "model.safetensors"))
    awq_sd, gptq_sd = {}, {}
    stems = sorted(k[: -len(".weight_packed")] for k in sd if k.endswith(".weight_packed"))
    for stem in stems:
        q, z, s = unpacked(sd, stem)
        assert int(z.min()) >= 1, f"{stem}: a zero point of 0 cannot be stored minus one (GPTQ)"
        # compressed-tensors' own dequantization is (q - z) * s.
        w = dequantize((q - 8).to(torch.int8), s, (z - 8).to(torch.int8), args, dtype=torch.float32)
        mine = (q - z.repeat_interleave(GROUP, 1)).float() * s.repeat_interleave(GROUP, 1)
        assert torch.equal(w, mine), f"{stem}: compressed-tensors does not dequantize as (q - z) * s"
        with torch.no_grad():
            hf.get_parameter(f"{stem}.weight").copy_(w)
        qt, zt, st = q.t().contiguous(), z.t().contiguous(), s.t().contiguous().half()
        awq_sd[f"{stem}.qweight"] = to_i32(pack_cols(qt, AWQ_ORDER))
        awq_sd[f"{stem}.qzeros"] = to_i32(pack_cols(zt, AWQ_ORDER))
        awq_sd[f"{stem}.scales"] = st
        gptq_sd[f"{stem}.qweight"] = to_i32(pack_cols(q, range(8)).t().contiguous())
        gptq_sd[f"{stem}.qzeros"] = to_i32(pack_cols(zt - 1, range(8)))
        gptq_sd[f"{stem}.scales"] = st
        gptq_sd[f"{stem}.g_idx"] = torch.arange(q.shape[1], dtype=torch.int32) // GROUP
        # f16 scales (as AWQ and GPTQ store them) must hold compressed-tensors' exactly.
        assert torch.equal(st.float().t(), s), f"{stem}: scales are not exact in f16"
    rest = {k: v for k, v in sd.items() if not k.rsplit(".", 1)[0] in stems}
    base = json.load(open(os.path.join(ct, "config.json")))
    base.pop("quantization_config")
    for d, tensors, q in (
        (awq, awq_sd, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}),
        (gptq, gptq_sd, {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False, "checkpoint_format": "gptq"}),
    ):
        os.makedirs(d)
        save_file({**rest, **tensors}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        json.dump({**base, "quantization_config": q}, open(os.path.join(d, "config.json"), "w"), indent=2)
    # As tests/hf_golden.py --raw-ids: four seeded id prompts, 12 greedy steps each.
    cases = []
    for n, seed in [(1, 1), (7, 2), (23, 3), (40, 4)]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist()
        out, top5, gaps = run(hf, ids, 12)
        cases.append({"kind": "ids", "prompt_ids": ids, "greedy": out, "top5": top5, "gap": gaps})
    with open(os.path.join(a.out, "ct.json"), "w") as f:
        json.dump({"model": "int4/ct", "steps": 12, "cases": cases}, f)
        f.write("\n")
    print(f"wrote {ct}, {awq}, {gptq}: {len(stems)} int4 weights each; {a.out}/ct.json", file=sys.stderr)


if __name__ == "__main__":
    main()
