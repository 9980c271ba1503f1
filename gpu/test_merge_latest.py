#!/usr/bin/env python3
"""Checks gpu/merge_latest.py: a run's figures replace older ones, keep the run they came from,
and leave the figures it did not measure alone; a fake-driver file, a file without date or
commit, and an older run's figure over a newer one are refused or kept.
Run: python3 gpu/test_merge_latest.py (also run by crates/cli/tests/cli/gpu_scripts.rs).
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import merge_latest as ml  # noqa: E402

OLD_FLAT = {"date": "2026-12-04T16:29:57Z", "gpu": "NVIDIA H200", "driver": "580.159.04", "commit": "cafdfba",
            "decode_b1_frac": 0.22, "prefill_2048_frac": 0.084, "batch_invariant": True}
SHORT = {"date": "2026-12-10T10:00:00Z", "gpu": "NVIDIA H200", "driver": "580.159.04", "commit": "0123abc",
         "decode_b1_frac": 0.5}


def check_merge():
    doc, said = ml.merge(OLD_FLAT, SHORT)
    # The short run's figure replaces the old one and names its run; the others keep theirs.
    assert doc["decode_b1_frac"] == 0.5 and doc["prefill_2048_frac"] == 0.084 and doc["batch_invariant"] is True, doc
    assert doc["measured_at"]["decode_b1_frac"] == {"date": SHORT["date"], "commit": "0123abc", "gpu": "NVIDIA H200", "driver": "580.159.04"}, doc
    assert doc["measured_at"]["prefill_2048_frac"]["commit"] == "cafdfba" and doc["measured_at"]["batch_invariant"]["date"] == OLD_FLAT["date"], doc
    assert (doc["date"], doc["commit"]) == (SHORT["date"], "0123abc"), doc
    assert any(s.startswith("prefill_2048_frac: kept") for s in said), said
    # Merging again, and merging an older run: an older figure never replaces a newer one.
    again, _ = ml.merge(doc, dict(OLD_FLAT, decode_b1_frac=0.1, hf_b1_tok_s=300.0))
    assert again["decode_b1_frac"] == 0.5 and again["measured_at"]["decode_b1_frac"]["commit"] == "0123abc", again
    # A figure the older run alone has is still taken, with its own run.
    assert again["hf_b1_tok_s"] == 300.0 and again["measured_at"]["hf_b1_tok_s"]["commit"] == "cafdfba", again
    assert (again["date"], again["commit"]) == (SHORT["date"], "0123abc"), again
    # Into nothing: the run itself, with its provenance.
    first, _ = ml.merge(None, SHORT)
    assert first["decode_b1_frac"] == 0.5 and set(first["measured_at"]) == {"decode_b1_frac"}, first


def refused(old, new):
    try:
        ml.merge(old, new)
    except ml.Refused as e:
        return str(e)
    return None


def check_refusals():
    fake = dict(SHORT, fake_driver=True, not_a_measurement="a rehearsal")
    assert "fake driver" in (refused(OLD_FLAT, fake) or ""), "a fake-driver latest.json must never be merged"
    assert "no `date`" in (refused(OLD_FLAT, {k: v for k, v in SHORT.items() if k != "date"}) or "")
    assert "no `commit`" in (refused(OLD_FLAT, {k: v for k, v in SHORT.items() if k != "commit"}) or "")
    assert "not a JSON object" in (refused(OLD_FLAT, [1, 2]) or "")
    merged, _ = ml.merge(OLD_FLAT, SHORT)
    assert "already a merged file" in (refused(OLD_FLAT, merged) or "")
    assert "marked fake_driver" in (refused(fake, SHORT) or "")


def check_cli():
    """The command line: merges in place; a refusal exits 1 and leaves the file untouched."""
    with tempfile.TemporaryDirectory() as tmp:
        into, new, fake = (os.path.join(tmp, n) for n in ("into.json", "new.json", "fake.json"))
        json.dump(OLD_FLAT, open(into, "w"))
        json.dump(SHORT, open(new, "w"))
        json.dump(dict(SHORT, fake_driver=True), open(fake, "w"))
        r = subprocess.run([sys.executable, os.path.join(HERE, "merge_latest.py"), new, "--into", into], capture_output=True, text=True)
        assert r.returncode == 0 and "1 figures from" in r.stdout, (r.stdout, r.stderr)
        doc = json.load(open(into))
        assert doc["decode_b1_frac"] == 0.5 and doc["measured_at"]["prefill_2048_frac"]["commit"] == "cafdfba", doc
        before = open(into).read()
        r = subprocess.run([sys.executable, os.path.join(HERE, "merge_latest.py"), fake, "--into", into], capture_output=True, text=True)
        assert r.returncode == 1 and "refused" in r.stderr and open(into).read() == before, (r.returncode, r.stderr)


def check_committed():
    """docs/gpu/latest.json is in the merged form: every figure has its run."""
    path = os.path.join(HERE, "..", "docs", "gpu", "latest.json")
    doc = json.load(open(path))
    assert not doc.get("fake_driver"), "docs/gpu/latest.json is marked as from the fake driver"
    figs = ml.figures(doc)
    assert figs and set(doc.get("measured_at") or {}) == set(figs), sorted(set(figs) ^ set(doc.get("measured_at") or {}))
    assert all(r.get("date") and r.get("commit") for r in doc["measured_at"].values()), doc["measured_at"]


def main():
    check_merge()
    check_refusals()
    check_cli()
    check_committed()
    print("test_merge_latest: ok (figures replaced with their run, others kept, older never over newer; fake, dateless and merged inputs refused)")


if __name__ == "__main__":
    main()
