#!/usr/bin/env python3
"""The last part of gpu/check.sh: every step's verdict, the ceilings, and each benchmark held
against its floor, as OUT/results.json (everything) and OUT/summary.txt (the table, also printed).

Floors (docs/gpu-check.md, "Method" and "Reading the table"):
  - a decode step reads every weight once (a tied embedding once, as the lm_head; an untied
    one only for its rows) plus the KV cache of its context: bytes / measured copy bandwidth;
    its FLOPs / measured bf16 matmul rate; the floor is the larger.
  - a prefill of P tokens does 2 * linear params * P FLOPs plus causal attention (4 * q_dim *
    layers per (query, key) pair) and one lm_head row; the floor is FLOPs / matmul rate, or the
    weight bytes / bandwidth when that is larger (short prompts).
  - a throughput run is its prefills plus its decode steps, each bounded the same way.
KV bytes count the element size the run actually stored, as its report says
(backend.kv_elem_bytes: 2 for the bf16 cache CUDA keeps by default, 4 for f32); a report that
does not say gets no floor, rather than a guess.

Plain python3, no torch: it runs on any machine.
"""
import argparse
import json
import math
import os
import struct
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def model_facts(d):
    cfg = load_json(os.path.join(d, "config.json"))
    st = os.path.join(d, "model.safetensors")
    if cfg is None or not os.path.exists(st):
        return None
    with open(st, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items() if k != "__metadata__"}
    L, h, inter = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    q, kv, vocab = nh * hd, nkv * hd, cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings"))
    weight_bytes = sum(sizes.values())
    embed = sizes.get("model.embed_tokens.weight", 0)
    return {
        "dir": d,
        "shape": cfg.get("tandem_random_shape"),
        "layers": L,
        "hidden": h,
        "q_dim": q,
        "kv_dim": kv,
        "vocab": vocab,
        "tied": tied,
        "weight_bytes": weight_bytes,
        # Untied: the embedding table is only gathered, one row per token.
        "decode_weight_bytes": weight_bytes - (0 if tied else embed),
        "linear_params": L * (h * q + 2 * h * kv + q * h + 3 * h * inter),
        "lm_head_params": vocab * h,
        # K and V of every layer; times the element size the run reports.
        "kv_elems_per_token": L * 2 * kv,
    }


def kv_elem_bytes(report):
    """Bytes per KV element the benchmark stored (its backend section), or None."""
    b = (report or {}).get("backend") or {}
    v = b.get("kv_elem_bytes")
    return v if isinstance(v, int) and v > 0 else None


def decode_step_floor(m, ctxs, bw, rate, kv_bytes):
    """Floor of one forward that decodes one token for each context length in ctxs."""
    nbytes = m["decode_weight_bytes"] + sum(c * m["kv_elems_per_token"] * kv_bytes for c in ctxs)
    flops = sum(2 * m["linear_params"] + 4 * m["layers"] * m["q_dim"] * c + 2 * m["lm_head_params"] for c in ctxs)
    return max(nbytes / bw, flops / rate), nbytes / bw >= flops / rate


def prefill_floor(m, p, n_seqs, forwards, bw, rate, kv_bytes):
    flops = n_seqs * (2 * m["linear_params"] * p + 4 * m["layers"] * m["q_dim"] * p * (p + 1) / 2 + 2 * m["lm_head_params"])
    nbytes = forwards * m["weight_bytes"] + n_seqs * p * m["kv_elems_per_token"] * kv_bytes
    return max(nbytes / bw, flops / rate), nbytes / bw >= flops / rate


def env_facts(path):
    facts = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return facts
    for i, line in enumerate(lines):
        for key in ("date", "commit", "glibc", "host", "binary", "python", "cpus"):
            if line.startswith(key + ": ") and key not in facts:
                facts[key] = line[len(key) + 2:]
        if line.startswith("name, driver_version") and i + 1 < len(lines):
            vals = [v.strip() for v in lines[i + 1].split(",")]
            for k, v in zip(("gpu", "driver", "gpu_memory", "sm_clock", "sm_clock_max", "mem_clock", "power_limit", "temperature"), vals):
                facts[k] = v
        if "\t" in line:
            k, v = line.split("\t", 1)
            facts[k] = v
    return facts


# latest.json's figure fields in the order the table shows them, each with its target from
# issues 13 and 14 (None: informative, no target): (field, comparison, target, what).
TARGETS = [
    ("decode_b1_tok_s", None, None, "tok/s, batch 1 (about 1340 at 0.80 of the 1B floor)"),
    ("decode_b1_frac", ">=", 0.80, "of the decode floor, batch 1"),
    ("decode_b64_frac", ">=", 0.70, "of the decode floor, batch 64"),
    ("decode_b256_frac", None, None, "of the decode floor, batch 256"),
    ("prefill_2048_frac", ">=", 0.60, "of the prefill floor (bf16 matmul rate), 2048 tokens"),
    ("gemm_prefill_vs_torch", ">=", 0.9, "torch time / ours, GEMMs at m >= 512 (geomean)"),
    ("gemm_prefill_vs_cublaslt", ">=", 0.9, "cuBLASLt time / ours in the same process, GEMMs at m >= 512 (geomean)"),
    ("gemm_decode_vs_cublaslt", None, None, "cuBLASLt time / ours in the same process, GEMMs at m <= 64 (geomean)"),
    ("gemm_decode_frac_min", ">=", 0.85, "least fraction of floor, GEMMs at m <= 64"),
    ("attn_decode_frac_min", ">=", 0.70, "least fraction of floor, decode attention, ctx >= 1024"),
    ("hf_b1_tok_s", None, None, "HF generate, static cache + torch.compile, batch 1, tok/s"),
    ("throughput_vs_hf", ">=", 30.0, "mixed workload, our output tok/s over HF static batches of 64"),
    ("continuous_vs_static_c100", ">=", 3.0, "bench compare, output tok/s, concurrency 100"),
    ("serve_ttft_p99_s", None, None, "bench serve, 512 + 128 tokens, 64 in flight: TTFT p99"),
    ("serve_tpot_p99_s", None, None, "bench serve: TPOT p99"),
    ("decode_launches_per_layer", "<=", 7.0, "kernels per layer of a batch-1 decode step (bench decode's launch count)"),
    ("batch_invariant", "==", True, "32 greedy requests alone and together, with a preemption"),
]


# What marks a latest.json from the fake driver (check.sh on crates/fake-cuda: env.txt's
# fake_driver line), so that it is never mistaken for a measurement.
FAKE_MARK = {
    "fake_driver": True,
    "gpu": "none: the tandem fake driver (crates/fake-cuda), kernels run by the CPU emulator",
    "not_a_measurement": "a rehearsal on the fake driver: these figures time a CPU emulator, not a GPU",
}


def is_fake(env):
    return env.get("fake_driver") == "1"


def meets(op, value, target):
    if op == ">=":
        return value >= target
    if op == "==":
        return value == target
    return None


def latest_fields(env, measured, labs):
    """docs/gpu/latest.json: the run's identity and the figures it measured. A field this run
    did not measure is absent, never guessed (docs/gpu-check.md defines each). `measured` holds
    the figures main() derived from the benchmark reports; None means not measured."""
    out = {k: env.get(k) for k in ("date", "gpu", "driver", "commit") if env.get(k)}
    if is_fake(env):
        # Kernels run by the CPU emulator: every figure below is the fake's. merge_latest.py
        # refuses a file marked so; nothing here is ever a measurement.
        out.update(FAKE_MARK)
    out.update({k: v for k, v in measured.items() if v is not None})
    lab = (labs.get("llama-3.2-1b") or {}).get("results") or []

    def m_of(r):
        return (r.get("torch") or {}).get("m", 0)

    ratios = [r["torch_over_ours"] for r in lab if r["op"].startswith("gemm") and m_of(r) >= 512 and r.get("torch_over_ours")]
    if ratios:
        out["gemm_prefill_vs_torch"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    for field, keep in (("gemm_prefill_vs_cublaslt", lambda m: m >= 512), ("gemm_decode_vs_cublaslt", lambda m: 0 < m <= 64)):
        lt = [r["cublaslt_us"] / r["us"] for r in lab if r["op"].startswith("gemm") and keep(m_of(r)) and r.get("cublaslt_us") and r.get("us")]
        if lt:
            out[field] = math.exp(sum(math.log(x) for x in lt) / len(lt))
    dec = [r["frac_of_floor"] for r in lab if r["op"].startswith("gemm") and 0 < m_of(r) <= 64 and r.get("frac_of_floor") is not None]
    if dec:
        out["gemm_decode_frac_min"] = min(dec)
    att = [r["frac_of_floor"] for r in lab if r["op"] == "attention decode" and (r.get("torch") or {}).get("ctx", 0) >= 1024 and r.get("frac_of_floor") is not None]
    if att:
        out["attn_decode_frac_min"] = min(att)
    return out


def decode_figures(model, report, bw, rate):
    """Per batch size B of a `bench decode` report: (B, measured tok/s, floor tok/s or None,
    bound). A step of batch B reads the weights once and the KV of B contexts of p + j tokens
    (j = 1 .. g - 1), in the element size the report says it stored."""
    s, r = report.get("settings", {}), report.get("results") or {}
    p, g = s.get("prompt_len", 0), s.get("max_tokens", 0)
    kvb = kv_elem_bytes(report)
    by = r.get("decode_by_batch")
    if not isinstance(by, dict):
        # Reports before decode_by_batch: one batch size, in decode_tokens_per_s.
        d = r.get("decode_tokens_per_s") or {}
        by = {str(d.get("batch_size", 1)): d}
    out = []
    for b_text, rate_ in sorted(by.items(), key=lambda kv: int(kv[0])):
        b, tps = int(b_text), (rate_ or {}).get("median")
        if not tps:
            continue
        floor = bound = None
        if model and bw and rate and g > 1 and kvb:
            per = [decode_step_floor(model, [p + j] * b, bw, rate, kvb) for j in range(1, g)]
            floor = b * (g - 1) / sum(t for t, _ in per)
            bound = "memory" if all(m for _, m in per) else "compute"
        out.append((b, tps, floor, bound))
    return out


def p99_s(summary):
    """p99 of a latency summary in ms (bench reports' *_ms), in seconds."""
    v = (summary or {}).get("p99")
    return v / 1e3 if isinstance(v, (int, float)) else None


def batch_invariance(compares):
    """`batch_invariant`: False if any batch check of 32 or more requests failed; True if every
    such check passed and at least one of them preempted and mixed prefill chunks with decodes;
    None (absent) otherwise: a check that did not exercise those proves nothing either way."""
    checks = [c for c in compares.values() if isinstance(c.get("batch"), dict) and c["batch"].get("requests", 0) >= 32]
    if not checks:
        return None, "no batch-invariance check of 32 requests ran"
    if any(c["batch"].get("passed") is False or c["batch"].get("failure") or c["batch"].get("differ") for c in checks):
        return False, "a batch-invariance check failed"
    full = [c for c in checks if c["batch"].get("passed") is True and (c["batch"].get("preemptions") or 0) > 0 and (c["batch"].get("mixed_steps") or 0) > 0]
    if not full:
        return None, "no batch-invariance check showed a preemption and a step mixing prefill with decodes"
    return True, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench-model", required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--compares", help="where compare-*.json and hf-tiny.json are (default: --out)")
    a = ap.parse_args()
    cmp_dir = a.compares or a.out
    raw = os.path.join(a.work, "raw")

    steps = []
    try:
        for line in open(os.path.join(raw, "steps.tsv")):
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 4:
                steps.append({"step": parts[0], "rc": int(parts[1]), "seconds": float(parts[2]), "detail": parts[3]})
    except OSError:
        pass
    env = env_facts(os.path.join(raw, "env.txt"))
    ceil = load_json(os.path.join(raw, "ceilings.json")) or {}
    model = model_facts(a.bench_model)
    dec = load_json(os.path.join(raw, "bench", "decode.json"))
    thr = load_json(os.path.join(raw, "bench", "throughput.json"))

    bw = ceil.get("copy_gbps", 0) * 1e9
    rate = ceil.get("matmul_tflops", 0) * 1e12
    figures = []
    notes = []
    if not (bw and rate):
        notes.append(f"no ceilings measured ({ceil.get('skipped') or ceil.get('error') or 'ceilings.py gave nothing'}): no floors")
    if model is None:
        notes.append(f"no bench model at {a.bench_model}: no floors")

    def fig(name, measured, unit, floor=None, fraction=None, bound=None):
        figures.append({"figure": name, "measured": measured, "unit": unit, "floor": floor, "fraction_of_floor": fraction, "bound": bound})

    if ceil.get("copy_gbps"):
        fig("copy bandwidth (read+write)", ceil["copy_gbps"], "GB/s")
    if ceil.get("matmul_tflops"):
        fig(f"bf16 matmul {ceil.get('matmul_n')}^3", ceil["matmul_tflops"], "TFLOP/s")
    if ceil.get("matmul_f32_tflops"):
        fig(f"f32 matmul {ceil.get('matmul_f32_n')}^3 (no TF32)", ceil["matmul_f32_tflops"], "TFLOP/s")

    label = (model or {}).get("shape") or os.path.basename(a.bench_model)
    bench = os.path.join(raw, "bench")
    measured = {}
    kv_stored = {}
    for run, rep_ in (("decode", dec), ("decode-big", load_json(os.path.join(bench, "decode-big.json")))):
        if not (rep_ and rep_.get("results")):
            if run == "decode" and rep_ is None:
                notes.append("no decode benchmark report")
            continue
        s = rep_.get("settings", {})
        p, g = s.get("prompt_len", 0), s.get("max_tokens", 0)
        kvb = kv_elem_bytes(rep_)
        kv_stored[run] = {"kv_cache_dtype": (rep_.get("backend") or {}).get("kv_cache_dtype"), "kv_elem_bytes": kvb}
        if kvb is None:
            notes.append(f"the {run} report does not say what its KV cache stored (backend.kv_elem_bytes): no decode or prefill floor")
        for bsz, tps, floor, bound in decode_figures(model, rep_, bw, rate):
            frac = tps / floor if floor else None
            fig(f"decode b={bsz} {label} ({p}+{g} tok)", tps, "tok/s", floor, frac, bound)
            if bsz == 1:
                measured["decode_b1_tok_s"] = tps
                measured["decode_b1_frac"] = frac
            if bsz in (64, 256):
                measured[f"decode_b{bsz}_frac"] = frac
        launches = ((rep_.get("results") or {}).get("launches_per_decode_step") or {}).get("1")
        layers = (model or {}).get("layers") if run == "decode" else None
        if isinstance(launches, int) and layers:
            # The step's few launches outside the layers (embedding, final norm, lm_head,
            # sampling) are spread over the layers: an upper bound on a layer's own count.
            measured["decode_launches_per_layer"] = launches / layers
    for run, rep_ in (("decode", dec), ("prefill", load_json(os.path.join(bench, "prefill.json")))):
        if not (rep_ and rep_.get("results")):
            continue
        s = rep_.get("settings", {})
        p = s.get("prompt_len", 0)
        p_tps = (rep_["results"].get("prefill_tokens_per_s") or {}).get("median")
        kvb = kv_elem_bytes(rep_)
        if not p_tps:
            continue
        floor = bound = frac = None
        if model and bw and rate and kvb:
            chunk = s.get("max_num_batched_tokens") or p
            t, mem = prefill_floor(model, p, 1, math.ceil(p / chunk), bw, rate, kvb)
            floor, frac, bound = p / t, p_tps / (p / t), "memory" if mem else "compute"
        fig(f"prefill {label} ({p} tok)", p_tps, "tok/s", floor, frac, bound)
        if p == 2048 and run == "prefill":
            measured["prefill_2048_frac"] = frac
        if run == "decode" and model and kvb and ceil.get("matmul_f32_tflops"):
            t32, _ = prefill_floor(model, p, 1, 1, bw, ceil["matmul_f32_tflops"] * 1e12, kvb)
            notes.append(f"prefill ({p} tok) against the f32 (CUDA-core) matmul rate instead: {p_tps / (p / t32):.1%} of that floor")

    if thr and thr.get("results"):
        s, r = thr.get("settings", {}), thr["results"]
        w, e = s.get("workload", {}), s.get("engine", {})
        n, i_len, o_len = w.get("num_prompts", 0), w.get("input_len", 0), w.get("output_len", 0)
        seqs = e.get("max_num_seqs") or n or 1
        budget = e.get("max_num_batched_tokens") or 512
        tps, wall = r.get("output_tokens_per_s"), r.get("wall_s")
        kvb = kv_elem_bytes(thr)
        kv_stored["throughput"] = {"kv_cache_dtype": (thr.get("backend") or {}).get("kv_cache_dtype"), "kv_elem_bytes": kvb}
        if kvb is None:
            notes.append("the throughput report does not say what its KV cache stored (backend.kv_elem_bytes): no throughput floor")
        floor = frac = bound = None
        if model and bw and rate and n and wall and kvb:
            total, mem_steps, all_steps = 0.0, 0, 0
            left = n
            while left > 0:
                k = min(seqs, left)
                left -= k
                t, _ = prefill_floor(model, i_len, k, math.ceil(k * i_len / budget), bw, rate, kvb)
                total += t
                for j in range(1, o_len):
                    t, mem = decode_step_floor(model, [i_len + j] * k, bw, rate, kvb)
                    total += t
                    mem_steps += mem
                    all_steps += 1
            floor = r.get("output_tokens", n * o_len) / total
            frac = total / wall
            bound = "memory" if mem_steps * 2 > all_steps else "compute"
        if tps:
            fig(f"throughput b={seqs} {label} ({n} x {i_len}+{o_len})", tps, "out tok/s", floor, frac, bound)
        if r.get("preemptions"):
            notes.append(f"throughput run preempted {r['preemptions']} times")

    # The peers (issue 14 item 8). Ours on the mixed workload against HF's static batches of
    # the same prompts (bench/hf_baseline.py, run by check.sh from the prompts ours wrote).
    mixed = load_json(os.path.join(bench, "mixed.json"))
    hf_mixed = load_json(os.path.join(raw, "hf-mixed.json"))
    ours_tps = ((mixed or {}).get("results") or {}).get("output_tokens_per_s")
    if ours_tps:
        w = (mixed.get("settings") or {}).get("workload") or {}
        desc = f"{w.get('num_prompts')} x {w.get('min_len')}..{w.get('max_len')}+{w.get('min_output_len')}..{w.get('max_output_len')}"
        fig(f"mixed {label} ({desc}), ours", ours_tps, "out tok/s")
        if (mixed["results"].get("errors") or 0) > 0:
            notes.append(f"mixed run: {mixed['results']['errors']} requests failed ({mixed['results'].get('first_error')}): no throughput_vs_hf")
            ours_tps = None
    hf_tps = (hf_mixed or {}).get("output_tokens_per_s")
    if hf_tps:
        fig(f"mixed {label}, HF static b={hf_mixed.get('batch_size')} ({hf_mixed.get('batches_run')}/{hf_mixed.get('batches_total')} batches)", hf_tps, "out tok/s")
        if not hf_mixed.get("complete", True):
            notes.append(f"HF ran {hf_mixed.get('batches_run')} of its {hf_mixed.get('batches_total')} static batches (cut by --max-batches or its timeout); its tok/s is over those ({hf_mixed.get('num_prompts')} requests of the same workload)")
    if ours_tps and hf_tps:
        total = (hf_mixed or {}).get("num_prompts_total", hf_mixed.get("num_prompts"))
        if total == ((mixed.get("settings") or {}).get("workload") or {}).get("num_prompts"):
            measured["throughput_vs_hf"] = ours_tps / hf_tps
        else:
            notes.append(f"HF's prompts ({total}) are not ours ({mixed['settings']['workload'].get('num_prompts')}): no throughput_vs_hf")
    hf_b1 = load_json(os.path.join(raw, "hf-b1.json"))
    if hf_b1 and hf_b1.get("decode_tokens_per_s"):
        fig(f"HF generate b=1 ({hf_b1.get('method')}, {hf_b1.get('prompt_len')}+{hf_b1.get('max_tokens')} tok)", hf_b1["decode_tokens_per_s"], "tok/s")
        if hf_b1.get("compiled") and hf_b1.get("cache_implementation") == "static":
            measured["hf_b1_tok_s"] = hf_b1["decode_tokens_per_s"]
            if hf_b1.get("compile_s") is not None:
                notes.append(f"HF batch 1: torch.compile and warm-up took {hf_b1['compile_s']:.1f} s more than a steady generate (not in its rate)")
        else:
            notes.append("HF batch 1 ran without torch.compile: no hf_b1_tok_s")

    # Static against continuous (`bench compare`, one report per concurrency).
    comp = {}
    for name in sorted(os.listdir(bench)) if os.path.isdir(bench) else []:
        if name.startswith("compare-c") and name.endswith(".json"):
            c = load_json(os.path.join(bench, name)) or {}
            for run in (c.get("results") or {}).get("runs", []):
                res = run.get("result") or {}
                comp.setdefault(run.get("concurrency"), {})[run.get("scheduler")] = res
    for conc in sorted(k for k in comp if isinstance(k, int)):
        modes = comp[conc]
        for mode in ("static", "continuous"):
            r = modes.get(mode)
            if r and r.get("output_tokens_per_s"):
                e2e = p99_s(r.get("e2e_ms"))
                fig(f"compare c={conc} {mode} (E2E p99 {e2e:.2f} s)" if e2e is not None else f"compare c={conc} {mode}", r["output_tokens_per_s"], "out tok/s")
        st, co = modes.get("static") or {}, modes.get("continuous") or {}
        ok = st.get("output_tokens_per_s") and co.get("output_tokens_per_s") and not st.get("errors") and not co.get("errors")
        if conc == 100 and ok:
            measured["continuous_vs_static_c100"] = co["output_tokens_per_s"] / st["output_tokens_per_s"]

    serve = load_json(os.path.join(bench, "serve.json"))
    sr = (serve or {}).get("results") or {}
    if sr.get("output_tokens_per_s"):
        fig(f"serve c={(serve.get('settings') or {}).get('max_concurrency')} ({sr.get('completed')} requests)", sr["output_tokens_per_s"], "out tok/s")
        if sr.get("errors"):
            notes.append(f"serve: {sr['errors']} requests failed ({sr.get('first_error')}): no serve latencies")
        else:
            measured["serve_ttft_p99_s"] = p99_s(sr.get("ttft_ms"))
            measured["serve_tpot_p99_s"] = p99_s(sr.get("tpot_ms"))

    compares = {}
    for name in sorted(os.listdir(cmp_dir)):
        if name.startswith("compare-") and name.endswith(".json"):
            c = load_json(os.path.join(cmp_dir, name)) or {}
            nm = [x for p in c.get("prompts", []) for x in (p.get("nmse") or [])]
            compares[name] = {"passed": c.get("passed"), "failed": c.get("failed"), "max_nmse": max(nm) if nm else None, "batch": c.get("batch"), "kv_cache_dtype": c.get("kv_cache_dtype")}
    hf = load_json(os.path.join(cmp_dir, "hf-tiny.json"))
    measured["batch_invariant"], why = batch_invariance(compares)
    if why:
        notes.append(f"batch_invariant not set: {why}")

    doc = {
        "env": env,
        "backend": a.backend,
        "steps": steps,
        "ceilings": ceil,
        "bench_model": model,
        "kv_stored": kv_stored,
        "figures": figures,
        "notes": notes,
        "compares": compares,
        "hf_compare": {"passed": hf.get("passed"), "failed": hf.get("failed"), "device": hf.get("device")} if hf else None,
        "bench_reports": {
            "decode": dec,
            "throughput": thr,
            **{k: load_json(os.path.join(bench, k + ".json")) for k in ("decode-big", "decode-eager", "prefill", "mixed", "serve", "compare-c50", "compare-c100", "compare-c200")},
        },
        "peers": {"hf_b1": hf_b1, "hf_mixed": hf_mixed},
    }
    labs = {}
    for name in sorted(os.listdir(raw)):
        if name.startswith("kernel-lab-") and name.endswith(".json"):
            labs[name[len("kernel-lab-"):-len(".json")]] = load_json(os.path.join(raw, name))
    # Without torch the lab's own report (ours and cuBLASLt, no torch column) stands in.
    for name in sorted(os.listdir(bench)) if os.path.isdir(bench) else []:
        if name.startswith("kernels-") and name.endswith(".json"):
            labs.setdefault(name[len("kernels-"):-len(".json")], load_json(os.path.join(bench, name)))
    doc["kernel_lab"] = labs
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    latest = latest_fields(env, measured, labs)
    with open(os.path.join(a.out, "latest.json"), "w") as f:
        json.dump(latest, f, indent=1)
        f.write("\n")

    out = []
    if is_fake(env):
        out.append("== FAKE DRIVER (crates/fake-cuda): a rehearsal, not a measurement; latest.json is marked fake_driver ==")
    out.append(f"== tandem GPU check: backend {a.backend}, {env.get('gpu', 'no GPU')} (driver {env.get('driver', '-')}), commit {env.get('commit', '?')[:12]}, {env.get('date', '?')} ==")
    out.append(f"{'step':<34} {'result':<8} {'secs':>6}  detail")
    for s in steps:
        res = "ok" if s["rc"] == 0 else ("TIMEOUT" if s["rc"] == 124 else ("SKIPPED" if s["rc"] == 125 else f"FAIL {s['rc']}"))
        out.append(f"{s['step'][:34]:<34} {res:<8} {s['seconds']:>6.1f}  {s['detail'][:110]}")
    out.append("")
    out.append(f"{'figure':<44} {'measured':>20} {'floor':>14} {'of floor':>9}  bound")
    for f_ in figures:
        fl = "-" if f_["floor"] is None else f"{f_['floor']:.1f}"
        fr = "-" if f_["fraction_of_floor"] is None else f"{f_['fraction_of_floor']:.1%}"
        out.append(f"{f_['figure'][:44]:<44} {f_['measured']:>10.1f} {f_['unit']:<9} {fl:>14} {fr:>9}  {f_['bound'] or ''}")
    if model:
        kv = ", ".join(
            f"{run}: {k['kv_elems_per_token'] * v['kv_elem_bytes'] / 1024:.0f} KiB of {v['kv_cache_dtype'] or '?'} KV per token"
            for run, v in kv_stored.items()
            for k in [model]
            if v["kv_elem_bytes"]
        )
        out.append(
            f"bench model {label}: {model['weight_bytes'] / 1e9:.2f} GB of weights, {model['decode_weight_bytes'] / 1e9:.2f} GB read per decode step"
            + (f"; {kv}" if kv else "; KV element size not reported")
        )
    out.append("")
    out.append(f"{'latest.json':<28} {'value':>12}  {'target':<8} {'met':<4} what")
    for key, op, target, what in TARGETS:
        v = latest.get(key)
        if v is None:
            val, met = "absent", ""
        else:
            val = str(v).lower() if isinstance(v, bool) else (f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}")
            m = meets(op, v, target) if op else None
            met = "" if m is None else ("yes" if m else "NO")
        tg = f"{op} {str(target).lower() if isinstance(target, bool) else target}" if op else "-"
        out.append(f"{key:<28} {val:>12}  {tg:<8} {met:<4} {what}")
    for n_ in notes:
        out.append(f"note: {n_}")
    text = "\n".join(out) + "\n"
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
