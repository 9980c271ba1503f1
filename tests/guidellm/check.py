"""Reads GuideLLM's JSON report: every benchmark's request counts by status; exit 1 when any
request errored or was left incomplete, or when the report holds no counts at all."""
import json
import sys


def counts(node, path=""):
    """(path, {successful, errored, incomplete, total}) for every status breakdown of integers."""
    if isinstance(node, dict):
        keys = {"successful", "errored", "incomplete"}
        if keys <= node.keys() and all(isinstance(node[k], int) for k in keys):
            yield path, node
        for k, v in node.items():
            yield from counts(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from counts(v, f"{path}[{i}]")


with open(sys.argv[1]) as f:
    report = json.load(f)
found = [(p, c) for p, c in counts(report) if "request_totals" in p]
if not found:
    sys.exit(f"{sys.argv[1]}: no request_totals in the report")
bad = 0
for p, c in found:
    print(f"{p}: successful {c['successful']}, errored {c['errored']}, incomplete {c['incomplete']}")
    bad += c["errored"] + c["incomplete"]
    if c["successful"] == 0:
        bad += 1
print("guidellm:", "OK, no failed request" if bad == 0 else f"{bad} failed or incomplete request(s)")
sys.exit(1 if bad else 0)
