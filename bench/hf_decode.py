#!/usr/bin/env python3
"""HF transformers baseline for `tandem bench decode --hf-baseline`.

Measures what `tandem bench decode` measures, the same way, with a manual loop (no
`generate`, so no logits processors or stopping checks are timed):

- prefill tokens/s: one forward of one P-token prompt with use_cache (P / seconds);
- decode tokens/s at batch B: B random P-token prompts prefilled together (untimed), then
  `max_tokens - 1` timed greedy steps, each ONE forward carrying one new token per sequence
  (B * steps / seconds). The first token comes out of the prefill, as on the tandem side.

One warm-up (a prefill and a few steps at each batch size), then `--runs` timed runs; the
figures are medians (and bests) over the runs. Prints one JSON line at the end.

    python bench/hf_decode.py --model DIR --prompt-len 128 --max-tokens 16 --batch-sizes 1,16 --threads 2

Runs on CUDA in bfloat16 when available, else on the CPU in float32.
"""

import argparse
import inspect
import json
import statistics
import sys
import time

import hf_common


def parse_batch_sizes(text):
    sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] < 1:
        sys.exit(f"--batch-sizes {text!r}: need positive integers, e.g. 1,16")
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per sequence; the first comes from the prefill")
    ap.add_argument("--batch-sizes", default="1", help="comma list, e.g. 1,16")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    hf_common.add_model_args(ap)
    a = ap.parse_args()
    if a.prompt_len < 1 or a.max_tokens < 2 or a.runs < 1:
        sys.exit("need --prompt-len >= 1, --max-tokens >= 2 and --runs >= 1")
    batch_sizes = parse_batch_sizes(a.batch_sizes)

    torch, model, device, fields = hf_common.load_model(a)
    # transformers 5.24 renamed `past_key_values` to `cache` (argument and output; the old
    # names still work with a warning); earlier 5.x and 4.x only know `past_key_values`.
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    g = torch.Generator().manual_seed(a.seed)
    prompts = torch.randint(0, model.config.vocab_size, (max(batch_sizes), a.prompt_len), generator=g).to(device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def prefill(ids):
        """One forward over `ids` [B, P]; returns (the greedy next tokens [B], the KV cache)."""
        out = model(input_ids=ids, use_cache=True)
        return out.logits[:, -1, :].argmax(dim=-1), getattr(out, cache_name)

    def timed_prefill():
        sync()
        t = time.perf_counter()
        prefill(prompts[:1])
        sync()
        return time.perf_counter() - t

    def timed_decode(b, steps):
        """Seconds for `steps` greedy steps of `b` sequences, after an untimed prefill."""
        nxt, past = prefill(prompts[:b])
        sync()
        t = time.perf_counter()
        for _ in range(steps):
            # The cache object a forward returns (the one it was given, updated) goes back in.
            out = model(input_ids=nxt[:, None], use_cache=True, **{cache_name: past})
            nxt, past = out.logits[:, -1, :].argmax(dim=-1), getattr(out, cache_name)
        sync()
        return time.perf_counter() - t

    steps = a.max_tokens - 1
    runs = []
    with torch.inference_mode():
        timed_prefill()
        for b in batch_sizes:
            timed_decode(b, min(steps, 3))
        for i in range(a.runs):
            run = {"prefill_s": timed_prefill(), "decode_s": {str(b): timed_decode(b, steps) for b in batch_sizes}}
            print(f"hf run {i + 1}/{a.runs}: prefill {run['prefill_s'] * 1e3:.1f} ms, decode {run['decode_s']}", file=sys.stderr)
            runs.append(run)

    prefill_tps = [a.prompt_len / r["prefill_s"] for r in runs]
    decode_tps = {str(b): [b * steps / r["decode_s"][str(b)] for r in runs] for b in batch_sizes}
    print(
        json.dumps(
            {
                **fields,
                "cache_argument": cache_name,
                "prompt_len": a.prompt_len,
                "max_tokens": a.max_tokens,
                "decode_steps": steps,
                "runs": a.runs,
                "prefill_tokens_per_s": statistics.median(prefill_tps),
                "prefill_tokens_per_s_best": max(prefill_tps),
                "decode_tokens_per_s": {b: statistics.median(v) for b, v in decode_tps.items()},
                "decode_tokens_per_s_best": {b: max(v) for b, v in decode_tps.items()},
                "raw_runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
