#!/usr/bin/env python3
"""Merges a GPU run's latest.json into docs/gpu/latest.json field by field, so that a short run
does not erase what a longer one measured.

    python3 gpu/merge_latest.py OUT/latest.json [--into docs/gpu/latest.json]

The merged file keeps every figure at the top level (`decode_b1_frac`, ... as summarize.py
writes them) and, under `measured_at`, the run each figure came from: its date, commit, GPU and
driver. A figure the new run measured replaces the old one unless the old one was measured
later; a figure the new run did not measure keeps its value and its run. The top-level `date`,
`gpu`, `driver` and `commit` are those of the latest run merged.

Refused, with the reason, leaving the file as it was: a latest.json from the fake driver
(`fake_driver`, `cargo xtask gpu-rehearsal`: it times a CPU emulator), one without a date or a
commit, or one that is not a JSON object. A file in the old flat form (no `measured_at`) is
read as one run: each of its figures gets its top-level date, commit, GPU and driver.

Plain python3: it runs anywhere. Tests: gpu/test_merge_latest.py.
"""
import argparse
import json
import os
import sys

# Who measured, kept per figure.
RUN_KEYS = ("date", "commit", "gpu", "driver")
# Not figures: the run's identity, the provenance map, and the fake's marks.
NOT_FIGURES = set(RUN_KEYS) | {"measured_at", "fake_driver", "not_a_measurement"}


class Refused(Exception):
    pass


def run_of(doc):
    return {k: doc[k] for k in RUN_KEYS if doc.get(k) is not None}


def figures(doc):
    return {k: v for k, v in doc.items() if k not in NOT_FIGURES}


def provenance(doc):
    """Each figure's run: `measured_at` where the file has one, else the file's own run."""
    at = doc.get("measured_at")
    if isinstance(at, dict):
        return {k: dict(at.get(k) or {}) for k in figures(doc)}
    run = run_of(doc)
    return {k: dict(run) for k in figures(doc)}


def check_new(new, where):
    if not isinstance(new, dict):
        raise Refused(f"{where}: not a JSON object")
    if new.get("fake_driver"):
        raise Refused(f"{where}: from the fake driver ({new.get('not_a_measurement', 'fake_driver is set')}): never merged")
    for k in ("date", "commit"):
        if not new.get(k):
            raise Refused(f"{where}: no `{k}`: a figure must keep the run it was measured at")
    if "measured_at" in new:
        raise Refused(f"{where}: already a merged file (it has measured_at): merge a run's own latest.json")


def merge(old, new, where="the new latest.json"):
    """The merged document and a list of lines saying what happened to each figure."""
    check_new(new, where)
    old = old or {}
    if not isinstance(old, dict):
        raise Refused("the file merged into is not a JSON object")
    if old.get("fake_driver"):
        raise Refused("the file merged into is marked fake_driver: restore it from git first")
    values, at = figures(old), provenance(old)
    run = run_of(new)
    said = []
    for k, v in figures(new).items():
        prev = at.get(k, {}).get("date")
        if k in values and prev and prev > run["date"]:
            said.append(f"{k}: kept {values[k]!r} of {prev} (newer than this run's {run['date']})")
            continue
        said.append(f"{k}: {values.get(k, 'absent')!r} -> {v!r}")
        values[k] = v
        at[k] = dict(run)
    for k in sorted(set(values) - set(figures(new))):
        said.append(f"{k}: kept {values[k]!r} of {at.get(k, {}).get('date', '?')} (not measured by this run)")
    newest = max([run] + [r for r in at.values() if r.get("date")], key=lambda r: r["date"])
    out = {k: newest[k] for k in RUN_KEYS if k in newest}
    out.update(values)
    out["measured_at"] = {k: at[k] for k in values}
    return out, said


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", help="a run's latest.json (check.sh's OUT/latest.json)")
    ap.add_argument("--into", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "gpu", "latest.json"))
    a = ap.parse_args(argv)
    try:
        with open(a.new) as f:
            new = json.load(f)
    except (OSError, ValueError) as e:
        print(f"merge_latest: {a.new}: {e}", file=sys.stderr)
        return 2
    old = None
    if os.path.exists(a.into):
        try:
            with open(a.into) as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            print(f"merge_latest: {a.into}: {e}", file=sys.stderr)
            return 2
    try:
        doc, said = merge(old, new, a.new)
    except Refused as e:
        print(f"merge_latest: refused: {e}", file=sys.stderr)
        return 1
    tmp = a.into + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, a.into)
    for line in said:
        print(line)
    print(f"merge_latest: {len(figures(new))} figures from {a.new} ({new['date']}, {new['commit'][:12]}) into {a.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
