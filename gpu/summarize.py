#!/usr/bin/env python3
"""The last part of gpu/check.sh: every step's verdict, the ceilings, and each benchmark held
against its floor, as OUT/results.json (everything) and OUT/summary.txt (the table, also printed).

Floors (docs/gpu-check.md; GPU.md "Correct first, then fast"):
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


def latest_fields(env, figures, labs):
    """docs/gpu/latest.json: the run's identity and the figures it measured. A field this run
    did not measure is absent, never guessed (docs/gpu-check.md defines each)."""
    out = {k: env.get(k) for k in ("date", "gpu", "driver", "commit") if env.get(k)}
    for f in figures:
        if f["figure"].startswith("decode b=1 ") and f["measured"]:
            out["decode_b1_tok_s"] = f["measured"]
            if f["fraction_of_floor"] is not None:
                out["decode_b1_frac"] = f["fraction_of_floor"]
        if f["figure"].startswith("throughput b=64 ") and f["fraction_of_floor"] is not None:
            out["decode_b64_frac"] = f["fraction_of_floor"]
    lab = (labs.get("llama-3.2-1b") or {}).get("results") or []

    def m_of(r):
        return (r.get("torch") or {}).get("m", 0)

    ratios = [r["torch_over_ours"] for r in lab if r["op"].startswith("gemm") and m_of(r) >= 512 and r.get("torch_over_ours")]
    if ratios:
        out["gemm_prefill_vs_torch"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    dec = [r["frac_of_floor"] for r in lab if r["op"].startswith("gemm") and 0 < m_of(r) <= 64 and r.get("frac_of_floor") is not None]
    if dec:
        out["gemm_decode_frac_min"] = min(dec)
    att = [r["frac_of_floor"] for r in lab if r["op"] == "attention decode" and (r.get("torch") or {}).get("ctx", 0) >= 1024 and r.get("frac_of_floor") is not None]
    if att:
        out["attn_decode_frac_min"] = min(att)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench-model", required=True)
    ap.add_argument("--backend", required=True)
    a = ap.parse_args()
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
    kv_stored = {}
    if dec and dec.get("results"):
        s, r = dec.get("settings", {}), dec["results"]
        p, g = s.get("prompt_len", 0), s.get("max_tokens", 0)
        d_tps = r.get("decode_tokens_per_s", {}).get("median")
        p_tps = r.get("prefill_tokens_per_s", {}).get("median")
        kvb = kv_elem_bytes(dec)
        kv_stored["decode"] = {"kv_cache_dtype": (dec.get("backend") or {}).get("kv_cache_dtype"), "kv_elem_bytes": kvb}
        if kvb is None:
            notes.append("the decode report does not say what its KV cache stored (backend.kv_elem_bytes): no decode or prefill floor")
        if d_tps:
            floor = bound = frac = None
            if model and bw and rate and g > 1 and kvb:
                per = [decode_step_floor(model, [p + j], bw, rate, kvb) for j in range(1, g)]
                floor = (g - 1) / sum(t for t, _ in per)
                frac = d_tps / floor
                bound = "memory" if all(m for _, m in per) else "compute"
            fig(f"decode b=1 {label} ({p}+{g} tok)", d_tps, "tok/s", floor, frac, bound)
        if p_tps:
            floor = bound = frac = None
            if model and bw and rate and kvb:
                chunk = s.get("max_num_batched_tokens") or p
                t, mem = prefill_floor(model, p, 1, math.ceil(p / chunk), bw, rate, kvb)
                floor, frac, bound = p / t, p_tps / (p / t), "memory" if mem else "compute"
            fig(f"prefill {label} ({p} tok)", p_tps, "tok/s", floor, frac, bound)
            if model and kvb and ceil.get("matmul_f32_tflops"):
                t32, _ = prefill_floor(model, p, 1, 1, bw, ceil["matmul_f32_tflops"] * 1e12, kvb)
                notes.append(f"prefill against the f32 (CUDA-core) matmul rate instead: {p_tps / (p / t32):.1%} of that floor")
    elif dec is None:
        notes.append("no decode benchmark report")

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
    elif thr is None:
        notes.append("no throughput benchmark report")

    compares = {}
    for name in sorted(os.listdir(a.out)):
        if name.startswith("compare-") and name.endswith(".json"):
            c = load_json(os.path.join(a.out, name)) or {}
            nm = [x for p in c.get("prompts", []) for x in (p.get("nmse") or [])]
            compares[name] = {"passed": c.get("passed"), "failed": c.get("failed"), "max_nmse": max(nm) if nm else None, "batch": c.get("batch"), "kv_cache_dtype": c.get("kv_cache_dtype")}
    hf = load_json(os.path.join(a.out, "hf-tiny.json"))

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
        "bench_reports": {"decode": dec, "throughput": thr},
    }
    labs = {}
    for name in sorted(os.listdir(raw)):
        if name.startswith("kernel-lab-") and name.endswith(".json"):
            labs[name[len("kernel-lab-"):-len(".json")]] = load_json(os.path.join(raw, name))
    doc["kernel_lab"] = labs
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    latest = latest_fields(env, figures, labs)
    with open(os.path.join(a.out, "latest.json"), "w") as f:
        json.dump(latest, f, indent=1)
        f.write("\n")

    out = []
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
    for n_ in notes:
        out.append(f"note: {n_}")
    text = "\n".join(out) + "\n"
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
