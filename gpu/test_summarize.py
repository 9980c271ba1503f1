#!/usr/bin/env python3
"""Checks gpu/summarize.py's floors on made-up inputs (no GPU, no torch): the KV bytes a floor
counts follow the element size the benchmark reports (bf16: 2, f32: 4), and a report that does
not say gets no floor. Run: python3 gpu/test_summarize.py (also run by crates/cli/tests/cli/gpu_scripts.rs).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import summarize  # noqa: E402


def write_model(d):
    """A model directory: config.json and a safetensors header (data bytes are not read)."""
    os.makedirs(d, exist_ok=True)
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": True}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    hdr = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [100, 64], "data_offsets": [0, 12800]},
           "model.layers.0.mlp.up_proj.weight": {"dtype": "BF16", "shape": [128, 64], "data_offsets": [12800, 29184]}}
    raw = json.dumps(hdr).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)


def run(tmp, decode_backend, thr_backend):
    work, out, model = (os.path.join(tmp, x) for x in ("work", "out", "model"))
    raw = os.path.join(work, "raw")
    os.makedirs(os.path.join(raw, "bench"), exist_ok=True)
    os.makedirs(out, exist_ok=True)
    write_model(model)
    open(os.path.join(raw, "steps.tsv"), "w").write("ceilings\t0\t1.0\tok\n")
    json.dump({"copy_gbps": 1.0, "matmul_tflops": 1000.0}, open(os.path.join(raw, "ceilings.json"), "w"))
    dec = {"backend": decode_backend, "settings": {"prompt_len": 1000, "max_tokens": 3, "max_num_batched_tokens": 1000},
           "results": {"decode_tokens_per_s": {"median": 10.0}, "prefill_tokens_per_s": {"median": 100.0}}}
    thr = {"backend": thr_backend, "settings": {"workload": {"num_prompts": 2, "input_len": 100, "output_len": 3}, "engine": {"max_num_seqs": 2, "max_num_batched_tokens": 512}},
           "results": {"output_tokens_per_s": 5.0, "wall_s": 1.0, "output_tokens": 6}}
    json.dump(dec, open(os.path.join(raw, "bench", "decode.json"), "w"))
    json.dump(thr, open(os.path.join(raw, "bench", "throughput.json"), "w"))
    r = subprocess.run([sys.executable, os.path.join(HERE, "summarize.py"), "--work", work, "--out", out, "--bench-model", model, "--backend", "cuda"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.load(open(os.path.join(out, "results.json"))), r.stdout


def floors(doc):
    return {f["figure"].split(" ")[0]: f["floor"] for f in doc["figures"] if f["unit"] != "GB/s" and f["unit"] != "TFLOP/s"}


def main():
    m = {"decode_weight_bytes": 29184, "kv_elems_per_token": 2 * 2 * 32, "linear_params": 0, "layers": 2, "q_dim": 64, "lm_head_params": 0}
    with tempfile.TemporaryDirectory() as tmp:
        bf16, text = run(tmp, {"name": "cuda", "kv_cache_dtype": "bf16", "kv_elem_bytes": 2}, {"name": "cuda", "kv_cache_dtype": "bf16", "kv_elem_bytes": 2})
        assert "of bf16 KV per token" in text, text
    with tempfile.TemporaryDirectory() as tmp:
        f32, _ = run(tmp, {"name": "cuda", "kv_cache_dtype": "f32", "kv_elem_bytes": 4}, {"name": "cuda", "kv_cache_dtype": "f32", "kv_elem_bytes": 4})
    with tempfile.TemporaryDirectory() as tmp:
        unknown, _ = run(tmp, {"name": "cuda"}, {"name": "cuda"})
    fb, ff, fu = floors(bf16), floors(f32), floors(unknown)
    # Memory-bound decode at 1 GB/s: the floor is 1 / (weights + context x KV bytes) per token.
    for name, kvb, got in (("bf16", 2, fb["decode"]), ("f32", 4, ff["decode"])):
        per = [summarize.decode_step_floor(dict(m), [1000 + j], 1e9, 1e15, kvb)[0] for j in (1, 2)]
        want = 2 / sum(per)
        assert abs(got - want) < 1e-9 * want, (name, got, want)
        by_hand = 2 / sum((29184 + c * 128 * kvb) / 1e9 for c in (1001, 1002))
        assert abs(got - by_hand) < 1e-9 * by_hand, (name, got, by_hand)
    assert fb["decode"] > ff["decode"] and fb["throughput"] > ff["throughput"] and fb["prefill"] >= ff["prefill"], (fb, ff)
    assert bf16["kv_stored"]["decode"] == {"kv_cache_dtype": "bf16", "kv_elem_bytes": 2}, bf16["kv_stored"]
    assert all(v is None for v in fu.values()), fu
    assert any("does not say what its KV cache stored" in n for n in unknown["notes"]), unknown["notes"]
    print("test_summarize: ok (decode floors bf16 %.1f vs f32 %.1f tok/s; unreported element size: no floors)" % (fb["decode"], ff["decode"]))


if __name__ == "__main__":
    main()
