#!/usr/bin/env python3
"""HF transformers' strongest batch-1 decode, for the GPU check's `hf_b1_tok_s` (issue 14 item 8):
`model.generate` with a static cache (`cache_implementation="static"`) and its decode forward
compiled by torch.compile (transformers' own auto-compile with its default `CompileConfig`:
inductor, mode "reduce-overhead", i.e. CUDA graphs on a GPU).

- warm-up: `--warmup` full generates; the first includes the compile, and its time minus a
  steady generate's is reported apart as `compile_s` (never inside a rate);
- each timed run: one generate of 1 new token (the prefill alone) and one of `--max-tokens`,
  greedy, `min_new_tokens = max_new_tokens` so EOS cannot end it early; decode tokens/s =
  (max_tokens - 1) / (t_full - t_prefill), the same count `tandem bench decode` times (the first
  token comes out of the prefill). Medians over `--runs`.

Prints one JSON line at the end; `compiled` says whether generate really took the compiled path
(transformers compiles only on devices it trusts, CUDA among them; on the CPU the check asks for
it explicitly so a dry run exercises the same path).

    python bench/hf_generate.py --model DIR --prompt-len 512 --max-tokens 128 --runs 3
"""

import argparse
import json
import statistics
import sys
import time

import hf_common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per generate; the first comes from the prefill")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="untimed generates first (compile, CUDA graph capture)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true", help="static cache without torch.compile (for comparison)")
    hf_common.add_model_args(ap)
    a = ap.parse_args()
    if a.prompt_len < 1 or a.max_tokens < 2 or a.runs < 1 or a.warmup < 1:
        sys.exit("need --prompt-len >= 1, --max-tokens >= 2, --runs >= 1 and --warmup >= 1")

    torch, model, device, fields = hf_common.load_model(a)
    from transformers import CompileConfig

    cc = None
    if not a.no_compile:
        # transformers' own default on CUDA (inductor, reduce-overhead = CUDA graphs); on the
        # CPU (dry runs) there are no CUDA graphs, so inductor's default mode.
        cc = CompileConfig() if device == "cuda" else CompileConfig(mode="default")
        if device != "cuda":
            # transformers auto-compiles only on accelerators; this flag is its documented way
            # (CompileConfig's comment: "for testing purposes") to compile on the CPU too.
            cc._compile_all_devices = True
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, model.config.vocab_size, (1, a.prompt_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def generate(n):
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=pad,
                cache_implementation="static",
                disable_compile=a.no_compile,
                **({"compile_config": cc} if cc is not None else {}),
            )
        sync()
        secs = time.perf_counter() - t
        if out.shape[1] - a.prompt_len != n:
            sys.exit(f"generate returned {out.shape[1] - a.prompt_len} new tokens, asked for {n}")
        return secs

    warm = []
    for i in range(a.warmup):
        warm.append(generate(a.max_tokens))
        print(f"hf generate warm-up {i + 1}/{a.warmup}: {warm[-1]:.2f} s", file=sys.stderr)
    compiled = hasattr(model, "_compiled_call")
    runs = []
    for i in range(a.runs):
        t1 = generate(1)
        tg = generate(a.max_tokens)
        runs.append({"prefill_s": t1, "generate_s": tg})
        print(f"hf generate run {i + 1}/{a.runs}: prefill {t1 * 1e3:.1f} ms, {a.max_tokens} tokens {tg * 1e3:.1f} ms", file=sys.stderr)
    steps = a.max_tokens - 1
    rates = [steps / (r["generate_s"] - r["prefill_s"]) for r in runs if r["generate_s"] > r["prefill_s"]]
    if not rates:
        sys.exit("every timed generate was no slower than its prefill: nothing to time")
    steady = statistics.median(r["generate_s"] for r in runs)
    print(
        json.dumps(
            {
                **fields,
                "method": "generate, static cache" + ("" if a.no_compile else ", torch.compile " + cc.mode),
                "compiled": compiled,
                "cache_implementation": "static",
                "batch_size": 1,
                "prompt_len": a.prompt_len,
                "max_tokens": a.max_tokens,
                "decode_steps": steps,
                "runs": a.runs,
                "warmup_s": warm,
                # The first warm-up generate less a steady one: compile (and graph capture) time.
                "compile_s": warm[0] - steady,
                "decode_tokens_per_s": statistics.median(rates),
                "decode_tokens_per_s_best": max(rates),
                "prefill_tokens_per_s": statistics.median(a.prompt_len / r["prefill_s"] for r in runs),
                "raw_runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
