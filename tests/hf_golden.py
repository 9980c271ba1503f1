#!/usr/bin/env python3
"""Golden data from HF transformers, the model implementation we did not write.

Runs a model in float32 on the CPU and writes small JSON: for each prompt, its ids, the greedy
continuation, and per step the top-5 logprobs and the gap between the two best logits.

    tests/make_golden.sh             # sets up a throwaway venv with torch + transformers
    python tests/hf_golden.py --model DIR --out tests/golden/NAME.json [--gguf FILE]

With --gguf, the tokenizer checks (ids of tricky strings, the rendered chat template) come from
transformers' own GGUF reader, independent of our converter; the logits always come from DIR
(our converted safetensors upcast to f32), so they check our forward pass exactly.
"""
import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TRICKY = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "Digits: 1234567890 and 3.14159",
    "日本語のテキストと中文",
    "Emoji 🦀🚀 and 👍🏽",
    "def f(x):\n    return x ** 2  # code\n",
    "<|im_start|>user\nspecial tokens<|im_end|>",
    "naïve café résumé",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."}],
]
PLAIN = ["The quick brown fox", "Once upon a time, in a land far away,", "1 + 1 ="]


def run(model, ids, steps):
    ids = list(ids)
    out, top5, gaps = [], [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits.double(), -1)
            vals, idx = torch.topk(logits, 5)
            nxt = int(idx[0])
            out.append(nxt)
            top5.append([[int(i), float(lp[i])] for i in idx])
            gaps.append(float(vals[0] - vals[1]))
            ids.append(nxt)
    return out, top5, gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--raw-ids", action="store_true", help="tiny random models: prompts are id lists")
    ap.add_argument("--show", action="store_true", help="print HF's config and parameter names")
    a = ap.parse_args()
    torch.manual_seed(0)
    model, info = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, output_loading_info=True)
    model.eval()
    # Every tensor of the checkpoint read, none left at its initial value: a name HF does not
    # know (or one we did not write) would otherwise pass silently as random init.
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit(f"{a.model}: HF did not read the checkpoint as written: {bad}")
    if a.show:
        print(model.config)
        for n, p in model.named_parameters():
            print(n, tuple(p.shape))
    cases = []
    doc = {"model": a.model.rstrip("/").split("/")[-1], "steps": a.steps, "cases": cases}
    if a.raw_ids:
        vocab = model.config.vocab_size
        for n, seed in [(1, 1), (7, 2), (23, 3), (40, 4)]:
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, vocab, (n,), generator=g).tolist()
            out, top5, gaps = run(model, ids, a.steps)
            cases.append({"kind": "ids", "prompt_ids": ids, "greedy": out, "top5": top5, "gap": gaps})
        tok = AutoTokenizer.from_pretrained(a.model)
        if "enable_thinking" in (tok.chat_template or ""):
            # The template's switch, as `chat_template_kwargs` passes it.
            doc["chat_render"] = [
                {"messages": m, "kwargs": kw, "text": tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True, **kw)}
                for m in CHATS
                for kw in ({}, {"enable_thinking": False}, {"enable_thinking": True})
            ]
        elif "start_of_turn" in (tok.chat_template or ""):
            # Gemma's template: a system turn folded into the first user turn, roles renamed,
            # content trimmed, given as a string or as text parts.
            more = [
                [{"role": "user", "content": "  Hi there  "}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": [{"type": "text", "text": " And now? "}]}],
            ]
            doc["chat_render"] = [
                {"messages": m, "text": tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)} for m in CHATS + more
            ]
    else:
        tok = AutoTokenizer.from_pretrained(a.model)
        for p in PLAIN:
            ids = tok(p, add_special_tokens=True)["input_ids"]
            out, top5, gaps = run(model, ids, a.steps)
            cases.append({"kind": "plain", "prompt": p, "prompt_ids": ids, "greedy": out, "top5": top5, "gap": gaps})
        for msgs in CHATS:
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            out, top5, gaps = run(model, ids, a.steps)
            cases.append({"kind": "chat", "messages": msgs, "rendered": text, "prompt_ids": ids, "greedy": out, "top5": top5, "gap": gaps})
        ref_tok = AutoTokenizer.from_pretrained(a.model, gguf_file=a.gguf) if a.gguf else tok
        doc["tokenizer_source"] = "gguf" if a.gguf else "model_dir"
        doc["tokenize"] = [{"text": s, "ids": ref_tok(s, add_special_tokens=False)["input_ids"]} for s in TRICKY]
        doc["chat_render"] = [
            {"messages": m, "text": ref_tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)} for m in CHATS
        ]
    with open(a.out, "w") as f:
        json.dump(doc, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {a.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
