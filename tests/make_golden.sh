#!/usr/bin/env bash
# Regenerates tests/golden/*.json with HF transformers (float32, CPU). Needs about 3 GB for
# torch; run once by hand when the models or prompts change, then commit the JSON. CI never
# runs this: it compares against the committed files.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HF_VENV:-/tmp/hfvenv}
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install -q torch transformers safetensors gguf sentencepiece accelerate; }
cargo xtask gen-model --shape tiny --seed 1 --out target/golden/tiny --dtype f32
cargo xtask gen-model --shape tiny-tied --seed 2 --out target/golden/tiny-tied --dtype bf16
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny --out tests/golden/tiny.json --raw-ids
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-tied --out tests/golden/tiny-tied.json --raw-ids
# One seeded shape per family beyond Llama (the seed is the one the golden tests pass).
cargo xtask gen-model --shape tiny-qwen3 --seed 3 --out target/golden/tiny-qwen3 --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-qwen3 --out tests/golden/tiny-qwen3.json --raw-ids
cargo xtask gen-model --shape tiny-qwen3-moe --seed 4 --out target/golden/tiny-qwen3-moe --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-qwen3-moe --out tests/golden/tiny-qwen3-moe.json --raw-ids
# The same model as transformers itself saves it (5.x: `num_local_experts`), for the config-key aliases.
"$VENV/bin/python" tests/save_with_transformers.py --model target/golden/tiny-qwen3-moe --out tests/golden/tiny-qwen3-moe-tf5
cargo xtask gen-model --shape tiny-mixtral --seed 5 --out target/golden/tiny-mixtral --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-mixtral --out tests/golden/tiny-mixtral.json --raw-ids
# Sliding windows shorter than the prompts: Mistral (every layer), Qwen2 (layer 1 of 2).
cargo xtask gen-model --shape tiny-mistral --seed 6 --out target/golden/tiny-mistral --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-mistral --out tests/golden/tiny-mistral.json --raw-ids
cargo xtask gen-model --shape tiny-qwen2 --seed 7 --out target/golden/tiny-qwen2 --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-qwen2 --out tests/golden/tiny-qwen2.json --raw-ids
# Gemma 3: a sliding layer and a global one, GeGLU, sandwich norms, the scaled embedding.
cargo xtask gen-model --shape tiny-gemma3 --seed 8 --out target/golden/tiny-gemma3 --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-gemma3 --out tests/golden/tiny-gemma3.json --raw-ids
# Phi-3: q/k/v and gate/up each one weight in the checkpoint (split at load).
cargo xtask gen-model --shape tiny-phi3 --seed 10 --out target/golden/tiny-phi3 --dtype f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-phi3 --out tests/golden/tiny-phi3.json --raw-ids
# FP8 projections (e4m3, 32 x 32 block scales); HF dequantizes them on the CPU (needs accelerate).
cargo xtask gen-model --shape tiny --seed 9 --out target/golden/tiny-fp8 --dtype fp8-f32
"$VENV/bin/python" tests/hf_golden.py --model target/golden/tiny-fp8 --out tests/golden/tiny-fp8.json --raw-ids
# Int4 checkpoints (needs `pip install compressed-tensors`): compressed-tensors' own compressor
# writes tests/golden/int4/ct, the same 4-bit values go to int4/awq and int4/gptq, and HF runs
# compressed-tensors' dequantized weights for int4/ct.json.
cargo xtask gen-model --shape tiny --seed 11 --out target/golden/tiny-int4-src --dtype f32
"$VENV/bin/python" tests/int4_golden.py --model target/golden/tiny-int4-src --out tests/golden/int4
# FP8 as transformers itself writes and loads it: a bf16 Llama whose projections its own FP8
# quantizer stores in e4m3 with 128 x 128 block scales (tests/golden/fp8-block), and its greedy
# ids on its own (dequantizing) load of that directory.
"$VENV/bin/python" tests/fp8_golden.py --out-model tests/golden/fp8-block --out tests/golden/fp8-block.json
# LoRA adapters made by peft itself (B drawn nonzero) over golden models, with peft's greedy ids
# (needs `pip install peft`): tests/golden/lora/NAME/ and NAME.json.
LORA="$VENV/bin/python tests/lora_golden.py"
$LORA --model target/golden/tiny --adapter-out tests/golden/lora/tiny-all --out tests/golden/lora/tiny-all.json --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --rank 8 --alpha 16 --seed 1
$LORA --model target/golden/tiny --adapter-out tests/golden/lora/tiny-rs --out tests/golden/lora/tiny-rs.json --regex --targets '.*\.(q_proj|v_proj|down_proj)' --rank 4 --alpha 8 --rslora --seed 2
$LORA --model target/golden/tiny-phi3 --adapter-out tests/golden/lora/tiny-phi3-fused --out tests/golden/lora/tiny-phi3-fused.json --targets qkv_proj,o_proj,gate_up_proj,down_proj --rank 4 --alpha 8 --seed 3
$LORA --model target/golden/tiny-qwen3 --adapter-out tests/golden/lora/tiny-qwen3-attn --out tests/golden/lora/tiny-qwen3-attn.json --targets q_proj,k_proj,v_proj,o_proj --rank 8 --alpha 8 --seed 4
$LORA --model target/golden/tiny-gemma3 --adapter-out tests/golden/lora/tiny-gemma3-all --out tests/golden/lora/tiny-gemma3-all.json --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --rank 4 --alpha 8 --seed 5
rm -f tests/golden/lora/*/README.md
MODEL=$(cargo xtask fetch-model | tail -n 1)
GGUF=$(find "${TANDEM_CACHE:-$HOME/.cache/tandem}" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)
"$VENV/bin/python" tests/hf_golden.py --model "$MODEL" --out tests/golden/smollm2-135m.json ${GGUF:+--gguf "$GGUF"}
