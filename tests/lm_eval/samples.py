"""Per-item results from lm-evaluation-harness sample files, and the comparison of two runs.

  python samples.py extract OUT_DIR > results.json     # {task: {doc_id: ...}} from samples_*.jsonl
  python samples.py compare GOLDEN.json OURS.json       # exit 1 on a mismatch

loglikelihood tasks: each choice's log-likelihood must agree within 1e-3, and the same choice
must win. generate_until tasks: the texts are printed side by side and counted (greedy texts
of two f32 implementations may part where two logits are closer than their rounding).
"""
import glob
import json
import os
import sys

TOL = 1e-3


def extract(out_dir):
    res = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "**", "samples_*.jsonl"), recursive=True)):
        task = os.path.basename(path)[len("samples_"):].rsplit("_", 1)[0]
        items = res.setdefault(task, {})
        with open(path) as f:
            for line in f:
                s = json.loads(line)
                resps = s["filtered_resps"]
                if resps and isinstance(resps[0], list):  # loglikelihood: [[ll, is_greedy], ...]
                    items[str(s["doc_id"])] = {"ll": [float(r[0]) for r in resps], "greedy": [str(r[1]) == "True" for r in resps], "target": s.get("target")}
                else:
                    items[str(s["doc_id"])] = {"text": resps[0] if resps else "", "target": s.get("target")}
    return res


def compare(golden, ours):
    bad = 0
    for task, items in golden.items():
        got = ours.get(task)
        if got is None:
            print(f"{task}: missing from our run")
            bad += 1
            continue
        same_text = 0
        worst = 0.0
        for doc, g in sorted(items.items(), key=lambda kv: int(kv[0])):
            o = got.get(doc)
            if o is None:
                print(f"{task} doc {doc}: missing")
                bad += 1
                continue
            if "ll" in g:
                diffs = [abs(a - b) for a, b in zip(g["ll"], o["ll"])]
                worst = max([worst] + diffs)
                win_g = max(range(len(g["ll"])), key=lambda i: g["ll"][i])
                win_o = max(range(len(o["ll"])), key=lambda i: o["ll"][i])
                if len(g["ll"]) != len(o["ll"]) or max(diffs) > TOL or win_g != win_o:
                    print(f"{task} doc {doc}: HF {g['ll']} vs ours {o['ll']} (winner {win_g} vs {win_o})")
                    bad += 1
            else:
                same = g["text"] == o["text"]
                same_text += same
                print(f"{task} doc {doc}: {'same' if same else 'DIFFERENT'}: HF {g['text']!r} / ours {o['text']!r}")
        if items and "ll" in next(iter(items.values())):
            print(f"{task}: {len(items)} items, largest log-likelihood difference {worst:.2e} (limit {TOL})")
        else:
            print(f"{task}: {same_text} of {len(items)} generated texts identical")
    return bad


if __name__ == "__main__":
    if sys.argv[1] == "extract":
        json.dump(extract(sys.argv[2]), sys.stdout, indent=1, sort_keys=True)
        print()
    elif sys.argv[1] == "compare":
        with open(sys.argv[2]) as f:
            golden = json.load(f)
        with open(sys.argv[3]) as f:
            ours = json.load(f)
        n = compare(golden, ours)
        print("lm-eval compare:", "OK" if n == 0 else f"{n} mismatch(es)")
        sys.exit(1 if n else 0)
