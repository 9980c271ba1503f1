#!/usr/bin/env python3
"""HF transformers baseline for `tandem bench throughput --hf-baseline`.

Runs `model.generate` in static batches over the same model directory and the same prompts
(token ids), greedy, with min_new_tokens = max_new_tokens so EOS cannot end an output early,
and prints a JSON line with output tokens/s after each batch (the last one covers the run).

    python bench/hf_baseline.py --model DIR --prompts-file prompts.json --batch-size 64
    python bench/hf_baseline.py --model DIR --num-prompts 64 --input-len 128 --output-len 128

The prompts file is `{"prompts": [{"ids": [...], "output_len": N}, ...]}` (what the Rust side
writes). Prompts in a batch are left-padded to the longest one; with the `random` workload
they all have the same length, so no padding is needed. Runs on CUDA when available, else CPU.
"""

import argparse
import json
import sys
import time

import hf_common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--prompts-file", help="JSON prompts written by `tandem bench`")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-batches", type=int, default=0, help="run only the first N static batches (0: all); the JSON says how many ran")
    hf_common.add_model_args(ap)
    a = ap.parse_args()

    torch, model, device, fields = hf_common.load_model(a)
    cfg = model.config

    if a.prompts_file:
        with open(a.prompts_file) as f:
            prompts = [(p["ids"], int(p["output_len"])) for p in json.load(f)["prompts"]]
    else:
        g = torch.Generator().manual_seed(a.seed)
        prompts = [(torch.randint(0, cfg.vocab_size, (a.input_len,), generator=g).tolist(), a.output_len) for _ in range(a.num_prompts)]
    if not prompts:
        sys.exit("no prompts")

    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0

    def batches():
        for i in range(0, len(prompts), a.batch_size):
            yield prompts[i : i + a.batch_size]

    def run_batch(batch, max_new=None):
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (p, _) in enumerate(batch):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        # A static batch runs until its longest output: HF cannot retire rows early.
        new = max_new or max(n for _, n in batch)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        return out.shape[1] - width

    # Warm-up: one short batch (kernel selection, allocator).
    run_batch(prompts[: min(len(prompts), a.batch_size)], max_new=2)

    all_batches = list(batches())
    todo = all_batches[: a.max_batches] if a.max_batches > 0 else all_batches
    start = time.perf_counter()
    generated = prompt_tokens = done = 0
    for i, b in enumerate(todo):
        n = run_batch(b)
        # Count what each request asked for (what tandem counts), not the padding rows.
        generated += sum(min(n, want) for _, want in b)
        prompt_tokens += sum(len(p) for p, _ in b)
        done += len(b)
        wall = time.perf_counter() - start
        # A line after every batch: a run cut short by its timeout still leaves the figures of
        # the batches it finished (each a draw from the same workload), marked incomplete.
        print(
            json.dumps(
                {
                    **fields,
                    "batch_size": a.batch_size,
                    "num_prompts": done,
                    "num_prompts_total": len(prompts),
                    "batches_run": i + 1,
                    "batches_total": len(all_batches),
                    "complete": i + 1 == len(all_batches),
                    "prompt_tokens": prompt_tokens,
                    "output_tokens": generated,
                    "wall_s": wall,
                    "requests_per_s": done / wall,
                    "output_tokens_per_s": generated / wall,
                    "total_tokens_per_s": (prompt_tokens + generated) / wall,
                }
            ),
            flush=True,
        )
        print(f"hf batch {i + 1}/{len(todo)}: {len(b)} requests, {n} steps, {wall:.1f} s so far", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
