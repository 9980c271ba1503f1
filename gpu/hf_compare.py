#!/usr/bin/env python3
"""Our backends against HF transformers on the same random model, on the GPU when there is one.

`tandem compare --json FILE` writes the prompts it ran and, per prompt and per side (the backend
under test and the reference backend), the greedy ids and the five best (id, logprob) per step.
This script runs the same prompts greedily through HF transformers in float32 (TF32 off) and
applies the rule of crates/conformance/src/golden.rs (vLLM's check_logprobs_close), with HF as
the gold side:

  - greedy ids equal up to the first position where they differ; there, each side's token is
    in the other's top-5;
  - while they agree, HF's logprob of each of our top-5 tokens is within --logprob-tol of ours.

    python3 gpu/hf_compare.py --model DIR --ids-json compare.json [--out hf.json]

Prints one line per prompt and side, then `hf_compare: N passed, M failed` last; exits 1 on a
failure, 2 when it cannot run at all.
"""
import argparse
import json
import sys
import time


def hf_greedy(model, torch, device, ids, steps):
    """Greedy ids and per-step float64 log-softmax rows (on the CPU), recomputing the whole
    context each step, as tests/hf_golden.py does: no cache code of HF's in the way."""
    ids = list(ids)
    out, lps = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids], device=device)).logits[0, -1].float()
            lp = torch.log_softmax(logits.double(), -1).cpu()
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            lps.append(lp)
            ids.append(nxt)
    return out, lps


def judge(ours, hf_ids, hf_lps, tol):
    """Returns (passed, equal_steps, diverged_at, max_err, why)."""
    max_err = 0.0
    steps = min(len(ours["greedy"]), len(hf_ids))
    for i in range(steps):
        lp = hf_lps[i]
        our_top = [int(t[0]) for t in ours["top5"][i]]
        hf_top = [int(j) for j in lp.topk(5).indices.tolist()]
        if ours["greedy"][i] != hf_ids[i]:
            if ours["greedy"][i] in hf_top and hf_ids[i] in our_top:
                return True, i, i, max_err, ""
            return False, i, i, max_err, (
                f"step {i}: we chose {ours['greedy'][i]} (HF top-5 {hf_top}), "
                f"HF chose {hf_ids[i]} (our top-5 {our_top})"
            )
        for tid, our_lp in ours["top5"][i]:
            err = abs(float(lp[int(tid)]) - float(our_lp))
            max_err = max(max_err, err)
            if err > tol:
                return False, i, None, max_err, (
                    f"step {i}: token {tid}: our logprob {our_lp:.6f}, HF {float(lp[int(tid)]):.6f} "
                    f"(|diff| {err:.2e} > {tol:.0e})"
                )
    return True, steps, None, max_err, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json + safetensors)")
    ap.add_argument("--ids-json", required=True, help="output of `tandem compare --json`")
    # Default: 1e-3 for the f32 reference; for the backend under test, the limit tandem compare
    # used for it (its JSON's logprob_tol: 1e-3 in f32 numerics, the bf16 limit where the backend
    # rounds projection inputs or K/V to 16 bits, crates/cli/src/compare.rs `Limits`).
    ap.add_argument("--logprob-tol", type=float, default=None)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--out", help="write HF's greedy ids and the verdicts here")
    a = ap.parse_args()

    try:
        import torch
        from transformers import AutoModelForCausalLM
        import transformers
    except Exception as e:  # noqa: BLE001 - any import failure means this check cannot run
        print(f"hf_compare: cannot import torch/transformers: {e}")
        print("hf_compare: 0 passed, 0 failed (skipped)")
        return 2
    with open(a.ids_json) as f:
        doc = json.load(f)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # float32 means float32: no TF32 matrix products (their ~1e-3 error is the size of our tolerance).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(device)
    model.eval()
    # Gemma scales its embedding by sqrt(hidden) cast to the weights' type (HF's scaled word
    # embedding, vLLM's normalizer): in a 16-bit checkpoint's type, not the float32 this script
    # upcasts to (bf16 rounds sqrt(1152) = 33.94 to 33.75).
    emb = model.get_input_embeddings()
    with open(f"{a.model}/config.json") as f:
        stored = json.load(f)
    stored = stored.get("dtype") or stored.get("torch_dtype")
    if hasattr(emb, "embed_scale") and stored in ("bfloat16", "float16"):
        emb.embed_scale = emb.embed_scale.to(getattr(torch, stored)).to(torch.float32)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(
        f"hf_compare: transformers {transformers.__version__}, torch {torch.__version__}, {device} ({name}), "
        f"model {a.model}, {len(doc['prompts'])} prompts, loaded in {time.time() - t0:.1f} s"
    )
    passed = failed = 0
    results = []
    for i, p in enumerate(doc["prompts"]):
        sides = [(k, p.get(k)) for k in ("backend", "reference")]
        steps = max((len(s["greedy"]) for _, s in sides if s), default=0)
        if steps == 0:
            print(f"prompt {i}: FAIL  no results from tandem compare for this prompt")
            failed += 1
            continue
        t = time.time()
        hf_ids, hf_lps = hf_greedy(model, torch, device, p["prompt_ids"], steps)
        secs = time.time() - t
        entry = {"prompt_ids": p["prompt_ids"], "hf_greedy": hf_ids, "sides": {}}
        for key, side in sides:
            label = doc["backend"] if key == "backend" else doc.get("against", "reference")
            if side is None:
                print(f"prompt {i} ({len(p['prompt_ids'])} tokens) {label}: FAIL  tandem compare has no result for it")
                failed += 1
                continue
            tol = a.logprob_tol if a.logprob_tol is not None else (doc.get("logprob_tol") or 1e-3) if key == "backend" else 1e-3
            ok, equal, div, err, why = judge(side, hf_ids, hf_lps, tol)
            print(
                f"prompt {i} ({len(p['prompt_ids'])} tokens) {label} vs HF: ids equal {equal}/{steps}, "
                f"first divergence {'-' if div is None else div}, max |dlogprob| {err:.2e}, HF {secs:.2f} s  "
                + ("ok" if ok else f"FAIL  {why}")
            )
            entry["sides"][label] = {"passed": ok, "equal_steps": equal, "diverged_at": div, "max_logprob_err": err, "why": why}
            if ok:
                passed += 1
            else:
                failed += 1
        results.append(entry)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "device": device, "gpu": name, "results": results, "passed": passed, "failed": failed}, f)
            f.write("\n")
    print(f"hf_compare: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
