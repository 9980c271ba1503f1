#!/usr/bin/env python3
"""Checks gpu/summarize.py on made-up inputs (no GPU, no torch): the KV bytes a floor counts
follow the element size the benchmark reports (bf16: 2, f32: 4), and a report that does not say
gets no floor; and latest.json holds every field of issue 14 item 9 whose input is in the work
folder, computed from it, and none whose input is missing or does not qualify.
Run: python3 gpu/test_summarize.py (also run by crates/cli/tests/cli/gpu_scripts.rs).
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


BF16 = {"name": "cuda", "kv_cache_dtype": "bf16", "kv_elem_bytes": 2}
ENV = """date: 2026-12-01T12:00:00Z
commit: 0123456789abcdef
name, driver_version, memory.total [MiB], clocks.sm [MHz], clocks.max.sm [MHz], clocks.mem [MHz], power.limit [W], temperature.gpu
NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz, 1980 MHz, 3201 MHz, 700.00 W, 30
"""


def lat(p99_ms):
    return {"n": 10, "mean": p99_ms / 2, "median": p99_ms / 2, "p90": p99_ms * 0.9, "p99": p99_ms}


def full_inputs():
    """Every input summarize.py reads, by path under the work folder (or "out/..." for the
    output folder), each with made-up figures."""
    w = {"workload": "mixed", "num_prompts": 8, "min_len": 16, "max_len": 1024, "min_output_len": 16, "max_output_len": 512}
    batch = {"requests": 32, "passed": True, "differ": [], "preemptions": 3, "mixed_steps": 5}
    return {
        "raw/bench/decode.json": {"backend": BF16, "settings": {"prompt_len": 1000, "max_tokens": 3, "max_num_batched_tokens": 1000},
                                  "results": {"decode_tokens_per_s": {"median": 10.0, "batch_size": 1}, "prefill_tokens_per_s": {"median": 100.0},
                                              "decode_by_batch": {"1": {"median": 10.0}, "64": {"median": 200.0}},
                                              "launches_per_decode_step": {"1": 19, "64": 19}}},
        "raw/bench/decode-big.json": {"backend": BF16, "settings": {"prompt_len": 1000, "max_tokens": 3, "max_num_batched_tokens": 1000},
                                      "results": {"decode_by_batch": {"8": {"median": 50.0}, "256": {"median": 400.0}}}},
        "raw/bench/prefill.json": {"backend": BF16, "settings": {"prompt_len": 2048, "max_tokens": 2, "max_num_batched_tokens": 2048},
                                   "results": {"prefill_tokens_per_s": {"median": 300.0}, "decode_by_batch": {"1": {"median": 9.0}}}},
        "raw/bench/mixed.json": {"backend": BF16, "settings": {"workload": w}, "results": {"output_tokens_per_s": 900.0, "errors": 0}},
        "raw/hf-mixed.json": {"batch_size": 64, "num_prompts": 8, "num_prompts_total": 8, "batches_run": 1, "batches_total": 1, "complete": True, "output_tokens_per_s": 30.0},
        "raw/hf-b1.json": {"method": "generate, static cache, torch.compile reduce-overhead", "compiled": True, "cache_implementation": "static", "prompt_len": 512, "max_tokens": 128,
                           "decode_tokens_per_s": 700.0, "compile_s": 40.0},
        "raw/bench/compare-c100.json": {"results": {"runs": [
            {"concurrency": 100, "scheduler": "static", "result": {"output_tokens_per_s": 100.0, "errors": 0, "e2e_ms": lat(9000.0)}},
            {"concurrency": 100, "scheduler": "continuous", "result": {"output_tokens_per_s": 350.0, "errors": 0, "e2e_ms": lat(4000.0)}}]}},
        "raw/bench/serve.json": {"settings": {"max_concurrency": 64}, "results": {"completed": 8, "errors": 0, "output_tokens_per_s": 80.0, "ttft_ms": lat(250.0), "tpot_ms": lat(12.5)}},
        "out/compare-tiny.json": {"passed": 5, "failed": 0, "prompts": [], "batch": batch},
        "raw/kernel-lab-llama-3.2-1b.json": {"results": [
            {"op": "gemm qkv", "torch": {"m": 512}, "torch_over_ours": 0.5, "frac_of_floor": 0.3, "us": 10.0, "cublaslt_us": 5.0},
            {"op": "gemm down", "torch": {"m": 2048}, "torch_over_ours": 2.0, "frac_of_floor": 0.6, "us": 10.0, "cublaslt_us": 40.0},
            {"op": "gemm qkv", "torch": {"m": 1}, "torch_over_ours": 1.0, "frac_of_floor": 0.8, "us": 4.0, "cublaslt_us": 2.0},
            {"op": "gemm o", "torch": {"m": 64}, "torch_over_ours": 1.0, "frac_of_floor": 0.7, "us": 4.0, "cublaslt_us": 2.0},
            {"op": "attention decode", "torch": {"ctx": 1024}, "frac_of_floor": 0.4},
            {"op": "attention decode", "torch": {"ctx": 256}, "frac_of_floor": 0.1}]},
    }


# Which latest.json fields each input gives (the identity fields come from env.txt).
GIVES = {
    "raw/bench/decode.json": ["decode_b1_tok_s", "decode_b1_frac", "decode_b64_frac", "decode_launches_per_layer"],
    "raw/bench/decode-big.json": ["decode_b256_frac"],
    "raw/bench/prefill.json": ["prefill_2048_frac"],
    "raw/bench/mixed.json": ["throughput_vs_hf"],
    "raw/hf-mixed.json": ["throughput_vs_hf"],
    "raw/hf-b1.json": ["hf_b1_tok_s"],
    "raw/bench/compare-c100.json": ["continuous_vs_static_c100"],
    "raw/bench/serve.json": ["serve_ttft_p99_s", "serve_tpot_p99_s"],
    "out/compare-tiny.json": ["batch_invariant"],
    "raw/kernel-lab-llama-3.2-1b.json": ["gemm_prefill_vs_torch", "gemm_decode_frac_min", "attn_decode_frac_min",
                                         "gemm_prefill_vs_cublaslt", "gemm_decode_vs_cublaslt"],
}


def run_full(tmp, inputs):
    """summarize.py over a work folder holding `inputs`; returns (latest.json, results.json, stdout)."""
    work, out, model = (os.path.join(tmp, x) for x in ("work", "out", "model"))
    os.makedirs(os.path.join(work, "raw", "bench"), exist_ok=True)
    os.makedirs(out, exist_ok=True)
    write_model(model)
    open(os.path.join(work, "raw", "steps.tsv"), "w").write("ceilings\t0\t1.0\tok\n")
    open(os.path.join(work, "raw", "env.txt"), "w").write(ENV)
    json.dump({"copy_gbps": 1.0, "matmul_tflops": 1000.0}, open(os.path.join(work, "raw", "ceilings.json"), "w"))
    for rel, doc in inputs.items():
        path = os.path.join(out, rel[4:]) if rel.startswith("out/") else os.path.join(work, rel)
        json.dump(doc, open(path, "w"))
    r = subprocess.run([sys.executable, os.path.join(HERE, "summarize.py"), "--work", work, "--out", out, "--bench-model", model, "--backend", "cuda"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.load(open(os.path.join(out, "latest.json"))), json.load(open(os.path.join(out, "results.json"))), r.stdout


def check_latest():
    fields = [k for k, *_ in summarize.TARGETS]
    assert sorted(fields) == sorted({f for fs in GIVES.values() for f in fs}), "every field has an input in this test"
    m = {"decode_weight_bytes": 29184, "kv_elems_per_token": 2 * 2 * 32, "linear_params": 0, "layers": 2, "q_dim": 64, "lm_head_params": 0}
    with tempfile.TemporaryDirectory() as tmp:
        latest, doc, text = run_full(tmp, full_inputs())
    assert {k: latest[k] for k in ("date", "gpu", "driver", "commit")} == {"date": "2026-12-01T12:00:00Z", "gpu": "NVIDIA H200", "driver": "580.159.04", "commit": "0123456789abcdef"}, latest
    missing = [f for f in fields if f not in latest]
    assert not missing, (missing, latest)
    # Each figure from its input, by hand.
    step64 = [summarize.decode_step_floor(dict(m), [1000 + j] * 64, 1e9, 1e15, 2)[0] for j in (1, 2)]
    assert abs(latest["decode_b64_frac"] - 200.0 / (64 * 2 / sum(step64))) < 1e-9, latest
    step256 = [summarize.decode_step_floor(dict(m), [1000 + j] * 256, 1e9, 1e15, 2)[0] for j in (1, 2)]
    assert abs(latest["decode_b256_frac"] - 400.0 / (256 * 2 / sum(step256))) < 1e-9, latest
    assert latest["decode_b1_tok_s"] == 10.0
    assert latest["decode_launches_per_layer"] == 19 / 2, latest
    assert abs(latest["throughput_vs_hf"] - 30.0) < 1e-12 and abs(latest["continuous_vs_static_c100"] - 3.5) < 1e-12, latest
    assert latest["hf_b1_tok_s"] == 700.0 and latest["batch_invariant"] is True, latest
    assert abs(latest["serve_ttft_p99_s"] - 0.25) < 1e-12 and abs(latest["serve_tpot_p99_s"] - 0.0125) < 1e-12, latest
    assert abs(latest["gemm_prefill_vs_torch"] - 1.0) < 1e-12 and latest["gemm_decode_frac_min"] == 0.7 and latest["attn_decode_frac_min"] == 0.4, latest
    assert 0 < latest["prefill_2048_frac"], latest
    # cuBLASLt time over ours: geomean of 0.5 and 4 at m >= 512, of 0.5 and 0.5 at m <= 64.
    assert abs(latest["gemm_prefill_vs_cublaslt"] - 2 ** 0.5) < 1e-12 and abs(latest["gemm_decode_vs_cublaslt"] - 0.5) < 1e-12, latest
    # The table shows each field beside its target, and whether it met it.
    row = next(line for line in text.splitlines() if line.startswith("continuous_vs_static_c100"))
    assert ">= 3.0" in row and " yes " in row, row
    row = next(line for line in text.splitlines() if line.startswith("decode_b1_frac"))
    assert ">= 0.8" in row and " NO " in row, row
    assert doc["bench_reports"]["serve"]["results"]["completed"] == 8, doc["bench_reports"].keys()

    # One input missing: exactly its fields are absent (a field two inputs share goes with either).
    for rel, gives in GIVES.items():
        inputs = full_inputs()
        del inputs[rel]
        with tempfile.TemporaryDirectory() as tmp:
            latest, _, text = run_full(tmp, inputs)
        absent = sorted(f for f in fields if f not in latest)
        assert absent == sorted(gives), (rel, absent)
        assert all(any(line.startswith(f) and "absent" in line for line in text.splitlines()) for f in gives), (rel, text)

    # Inputs that do not qualify give no field, never a guess.
    cases = [
        ("out/compare-tiny.json", lambda d: d["batch"].update(preemptions=0), "batch_invariant", None),
        ("out/compare-tiny.json", lambda d: d["batch"].update(mixed_steps=0), "batch_invariant", None),
        ("out/compare-tiny.json", lambda d: d["batch"].update(requests=8), "batch_invariant", None),
        ("out/compare-tiny.json", lambda d: d["batch"].update(passed=False, differ=[3]), "batch_invariant", False),
        ("raw/hf-b1.json", lambda d: d.update(compiled=False), "hf_b1_tok_s", None),
        ("raw/bench/prefill.json", lambda d: d["settings"].update(prompt_len=1024), "prefill_2048_frac", None),
        ("raw/bench/mixed.json", lambda d: d["results"].update(errors=2), "throughput_vs_hf", None),
        ("raw/hf-mixed.json", lambda d: d.update(num_prompts_total=256), "throughput_vs_hf", None),
        ("raw/bench/serve.json", lambda d: d["results"].update(errors=1), "serve_ttft_p99_s", None),
        ("raw/bench/compare-c100.json", lambda d: [r.update(concurrency=50) for r in d["results"]["runs"]], "continuous_vs_static_c100", None),
    ]
    for rel, change, field, want in cases:
        inputs = full_inputs()
        change(inputs[rel])
        with tempfile.TemporaryDirectory() as tmp:
            latest, _, _ = run_full(tmp, inputs)
        assert latest.get(field, "absent") == ("absent" if want is None else want), (rel, field, latest.get(field))
    # HF cut short (a timeout or --max-batches): still its rate over what ran, said in a note.
    inputs = full_inputs()
    inputs["raw/hf-mixed.json"].update(num_prompts=4, batches_run=1, batches_total=2, complete=False)
    with tempfile.TemporaryDirectory() as tmp:
        latest, doc, _ = run_full(tmp, inputs)
    assert abs(latest["throughput_vs_hf"] - 30.0) < 1e-12 and any("1 of its 2 static batches" in n for n in doc["notes"]), doc["notes"]


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
    check_latest()
    print("test_summarize: ok (decode floors bf16 %.1f vs f32 %.1f tok/s; unreported element size: no floors; latest.json: every field from its input, absent without it)" % (fb["decode"], ff["decode"]))


if __name__ == "__main__":
    main()
