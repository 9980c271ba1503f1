#!/usr/bin/env python3
"""The two ceilings every benchmark is held against, measured on this GPU with torch.

- copy: device-to-device copy of a large buffer (default 2 GiB, far past the 60 MB L2),
  counting bytes read plus bytes written, timed with CUDA events; median of many.
- matmul: bf16 (8192 x 8192) @ (8192 x 8192) through torch (cuBLAS) on random normal data
  (never zeros: they run faster than real data), 2 * n^3 FLOPs; median of many. Also the same
  product in float32 with TF32 off (the CUDA-core rate), for kernels without tensor cores.

    python3 gpu/ceilings.py [--copy-mib 2048] [--n 8192] [--reps 30]

Prints one JSON object on stdout. Without a GPU it prints {"skipped": "..."} and exits 0, so
the dry run of gpu/check.sh goes on.
"""
import argparse
import json
import statistics
import sys
import time


def timed(torch, fn, reps, warmup):
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        # --allow-cpu dry runs only: a host clock around synchronous CPU work.
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return times
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copy-mib", type=int, default=2048)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--allow-cpu", action="store_true", help="dry runs: measure the CPU when there is no GPU (small sizes!)")
    a = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"skipped": f"no torch: {e}"}))
        return 0
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(0)
        res = {"gpu": props.name, "sms": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1)}
    elif a.allow_cpu:
        dev = torch.device("cpu")
        res = {"gpu": None, "device": "cpu (dry run: these are not GPU ceilings)"}
    else:
        print(json.dumps({"skipped": "no CUDA device visible to torch", "torch": torch.__version__}))
        return 0
    res.update({"torch": torch.__version__, "cuda": torch.version.cuda})

    n_bytes = a.copy_mib << 20
    src = torch.randn(n_bytes // 4, device=dev)
    dst = torch.empty_like(src)
    t = timed(torch, lambda: dst.copy_(src), a.reps * 2, 5)
    med = statistics.median(t)
    if not torch.equal(dst, src):
        print(json.dumps({**res, "error": "copy check failed: dst != src"}))
        return 1
    res["copy_bytes"] = 2 * n_bytes
    res["copy_median_s"] = med
    res["copy_gbps"] = 2 * n_bytes / med / 1e9
    res["copy_spread"] = (max(t) - min(t)) / med
    del src, dst

    n = a.n
    # Two sets of inputs in turn: the second product does not start from the first's cache.
    xs = [(torch.randn(n, n, device=dev, dtype=torch.bfloat16), torch.randn(n, n, device=dev, dtype=torch.bfloat16)) for _ in range(2)]
    out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    k = [0]

    def mm():
        x, y = xs[k[0] % 2]
        k[0] += 1
        torch.mm(x, y, out=out)

    t = timed(torch, mm, a.reps, 5)
    med = statistics.median(t)
    # A wrong product would make the rate meaningless: check one against float32.
    ref = xs[0][0][:64].float() @ xs[0][1].float()
    got = torch.mm(xs[0][0][:64], xs[0][1]).float()
    rel = float((got - ref).norm() / ref.norm())
    res["matmul_n"] = n
    res["matmul_median_s"] = med
    res["matmul_tflops"] = 2 * n**3 / med / 1e12
    res["matmul_spread"] = (max(t) - min(t)) / med
    res["matmul_rel_err"] = rel
    del xs, out

    # The same product in float32 with TF32 off: the CUDA-core rate, the ceiling of kernels
    # that multiply in f32 without tensor cores (matmul.cu for f32 weights). Informative only.
    torch.backends.cuda.matmul.allow_tf32 = False
    x32 = torch.randn(n, n, device=dev)
    y32 = torch.randn(n, n, device=dev)
    o32 = torch.empty(n, n, device=dev)
    t = timed(torch, lambda: torch.mm(x32, y32, out=o32), max(5, a.reps // 3), 2)
    res["matmul_f32_n"] = n
    res["matmul_f32_tflops"] = 2 * n**3 / statistics.median(t) / 1e12
    print(json.dumps(res))
    print(
        f"ceilings: copy {res['copy_gbps']:.1f} GB/s, bf16 matmul {res['matmul_tflops']:.1f} TFLOP/s, "
        f"f32 matmul {res['matmul_f32_tflops']:.1f} TFLOP/s on {res['gpu'] or res['device']}"
    )
    return 0 if rel < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
