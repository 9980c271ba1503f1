#!/usr/bin/env python3
"""The kernel lab's torch half: times, on the same GPU, each case of a `tandem bench kernels`
report through torch (GEMM: bf16 `x @ w.T` through cuBLAS; attention: SDPA, decode as one
query per sequence over its context with GQA, prefill causal over the prompt), with CUDA
events, and prints ours beside torch's: microseconds, torch/ours (above 1: we are faster) and
our fraction of the floor when the report has one.

Usage: kernel_lab.py REPORT.json [--out MERGED.json] [--min-ms 100] [--allow-cpu]
"""

import argparse
import json
import sys
import time


def timed_us(torch, fn, min_ms, cuda):
    fn()
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 0
        start.record()
        t0 = time.perf_counter()
        while True:
            fn()
            n += 1
            if n % 8 == 0 and (time.perf_counter() - t0) * 1e3 >= min_ms:
                break
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / n
    t0 = time.perf_counter()
    n = 0
    while (time.perf_counter() - t0) * 1e3 < min_ms or n == 0:
        fn()
        n += 1
    return (time.perf_counter() - t0) * 1e6 / n


def case_fn(torch, spec, dev):
    F = torch.nn.functional
    dt = torch.bfloat16
    if spec["kind"] == "gemm":
        x = torch.randn(spec["m"], spec["k"], device=dev, dtype=dt)
        w = torch.randn(spec["n"], spec["k"], device=dev, dtype=dt) * 0.05
        return lambda: x @ w.T
    if spec["kind"] == "argmax":
        x = torch.randn(spec["batch"], spec["vocab"], device=dev) * 4
        return lambda: torch.argmax(x, dim=-1).cpu()
    if spec["kind"] == "sample":
        # vLLM's top-k/top-p without FlashInfer: sort, mask by the sorted cumulative mass,
        # softmax, one exponential race (q), the ids to the host, as ours are.
        x = torch.randn(spec["batch"], spec["vocab"], device=dev) * 4
        top_k, top_p = spec["top_k"], spec["top_p"]

        def sample():
            s, idx = x.sort(dim=-1, descending=False)
            if top_k:
                kth = s[:, -top_k].unsqueeze(1)
                s = s.masked_fill(s < kth, float("-inf"))
            p = s.softmax(dim=-1)
            s = s.masked_fill(p.cumsum(dim=-1) <= 1 - top_p, float("-inf"))
            p = s.softmax(dim=-1)
            q = torch.empty_like(p).exponential_()
            return idx.gather(1, (p / q).argmax(dim=-1, keepdim=True)).cpu()

        return sample
    if spec["kind"] == "lora":
        # Each row's adapter gathered and applied by batched matmuls (what a framework without
        # segmented kernels runs): shrink x A[idx]^T, expand by B[idx]^T, added to y.
        m, n_in, n_out, slots, r = (spec[k] for k in ("m", "in", "out", "slots", "rank"))
        x = torch.randn(m, n_in, device=dev, dtype=dt)
        a = torch.randn(slots, r, n_in, device=dev, dtype=dt) * 0.05
        bw = torch.randn(slots, n_out, r, device=dev, dtype=dt) * 0.05
        idx = torch.arange(m, device=dev) % slots
        y = torch.zeros(m, n_out, device=dev, dtype=dt)

        def lora():
            u = torch.bmm(x.unsqueeze(1), a[idx].transpose(1, 2))
            y.add_(torch.bmm(u, bw[idx].transpose(1, 2)).squeeze(1), alpha=2.0)

        return lora
    b, ctx, ql, h, kvh, d = (spec[k] for k in ("batch", "ctx", "q_len", "heads", "kv_heads", "head_dim"))
    q = torch.randn(b, h, ql, d, device=dev, dtype=dt)
    k = torch.randn(b, kvh, ctx, d, device=dev, dtype=dt)
    v = torch.randn(b, kvh, ctx, d, device=dev, dtype=dt)
    causal = ql > 1
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--out")
    ap.add_argument("--min-ms", type=float, default=100.0)
    ap.add_argument("--allow-cpu", action="store_true", help="dry runs without a GPU")
    a = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not a.allow_cpu:
        sys.exit("kernel_lab.py: no CUDA device (pass --allow-cpu for a dry run)")
    dev = "cuda" if cuda else "cpu"
    rep = json.load(open(a.report))
    rows = []
    print(f"### kernel lab: ours ({rep['backend'].get('device', '?')}) against torch {torch.__version__} on {torch.cuda.get_device_name() if cuda else 'CPU'}\n")
    print("| op | case | ours us | torch us | torch/ours | ours of floor |")
    print("|---|---|---|---|---|---|")
    for r in rep["results"]:
        try:
            t_us = timed_us(torch, case_fn(torch, r["torch"], dev), a.min_ms, cuda)
        except Exception as e:  # one case torch cannot run must not hide the others
            t_us = None
            r["torch_error"] = str(e)
        r["torch_us"] = t_us
        r["torch_over_ours"] = t_us / r["us"] if t_us else None
        frac = r.get("frac_of_floor")
        torch_cell = "-" if t_us is None else "%.1f" % t_us
        ratio_cell = "-" if t_us is None else "%.2f" % (t_us / r["us"])
        frac_cell = "-" if frac is None else "%.0f%%" % (100 * frac)
        print("| %s | %s | %.1f | %s | %s | %s |" % (r["op"], r["case"], r["us"], torch_cell, ratio_cell, frac_cell))
        rows.append(r)
    rep["results"] = rows
    rep["torch"] = {"version": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
