#!/usr/bin/env python3
"""The KV-event contract a Tandem publisher would have to meet, checked against the pinned
vllm-router (0.1.17) with a stand-in publisher: Tandem does not publish KV events yet
(docs/scale-out.md, "KV-cache events").

3 Tandem replicas of the tiny model behind `vllm-router --policy kv_aware` with static event
sources (`--kv-event-source URL=tcp://...`, `--kv-event-model`, `--kv-event-block-size 16`); a
ZeroMQ XPUB socket per replica stands in for its publisher. Asserted:

  1. the router subscribes to every source (an empty topic: vLLM's default);
  2. after one batch (sequence 0, topic "", msgpack `[ts, [events], dp_rank]`) of `BlockStored`
     events in map form (`type`, `block_hashes` as plain integers, `parent_block_hash`,
     `token_ids` of each full 16-token block, `block_size`, `medium` "GPU") announcing a prompt's
     blocks on a replica the router would not otherwise pick, the request with that prompt goes
     to that replica, and so does the next one sharing the prefix;
  3. the router reads the token ids from the worker (`POST /tokenize`): no tokenizer is given to it.

The block hashes are arbitrary integers (Tandem's own u64 would do): the router hashes the
token ids itself. Run by `cargo xtask test` after router_test.py (needs pyzmq and msgpack,
pinned there); by hand:

    .venv-routers/bin/python tests/routers/kv_events_contract.py --tandem target/debug/tandem
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router_test import MODEL, Replica, Router, free_port, http, log, metric, wait_until  # noqa: E402

BLOCK = 16


def run(tandem, bin_dir, work, model_dir, own):
    """One round: `own` True uses Tandem's publisher (tandem serve --kv-events-endpoint), False
    the stand-in (a pyzmq XPUB per replica announcing the prompt's blocks)."""
    what = "Tandem's publisher" if own else "a stand-in publisher"
    replicas = [Replica(tandem, model_dir, work, i + (10 if own else 0)) for i in range(3)]
    router = Router("vllm", bin_dir, work)
    ctx = zmq.Context()
    pubs, endpoints = [], []
    try:
        for r in replicas:
            port = free_port()
            endpoints.append(f"tcp://127.0.0.1:{port}")
            if own:
                r.start(wait=False, extra=["--kv-events-endpoint", endpoints[-1]])
            else:
                s = ctx.socket(zmq.XPUB)
                s.setsockopt(zmq.XPUB_VERBOSE, 1)
                s.setsockopt(zmq.LINGER, 0)
                s.bind(endpoints[-1])
                pubs.append(s)
                r.start(wait=False)
        for r in replicas:
            r.wait_ready()
        extra = [a for r, e in zip(replicas, endpoints) for a in ("--kv-event-source", f"{r.url}={e}")]
        extra += ["--kv-event-model", MODEL, "--kv-event-block-size", str(BLOCK)]
        router.start("kv_aware", replicas, extra=extra)
        if own:
            # The router's subscribers connect at its start; the first batch each replica
            # publishes must reach them (a source whose first sequence number is not 0 is
            # disqualified): wait until every replica logged its subscriber.
            for r in replicas:
                wait_until(lambda: "KV events: a subscriber joined" in open(r.logpath, errors="replace").read(), 30, f"the router to subscribe to replica {r.idx}")
            log("kv_aware: the router subscribed to all 3 replicas' publishers")
        else:
            # 1. Every source subscribed to, with the empty topic.
            for i, s in enumerate(pubs):
                s.setsockopt(zmq.RCVTIMEO, 10000)
                sub = s.recv()
                assert sub == b"\x01", f"source {i}: subscription {sub!r}"
            log("kv_aware: the router subscribed to all 3 sources (topic \"\")")

        def served():
            return [metric(r.metrics(), "vllm:request_success_total") for r in replicas]

        def send(prompt, url=None):
            before = served()
            st, body = http("POST", (url or router.url) + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
            assert st == 200, (st, body[:200])
            per = [a - b for a, b in zip(served(), before)]
            assert sorted(per) == [0, 0, 1], per
            return per.index(1)

        prompt = "a shared system prompt that one replica already holds in its KV cache, " * 8
        # Where the router sends a prompt with nothing cached anywhere: the target is another replica.
        default = send("an unrelated prompt of about the same length, nothing cached anywhere " * 8)
        target = (default + 1) % 3
        toks = json.loads(http("POST", replicas[0].url + "/tokenize", {"model": MODEL, "prompt": prompt})[1])["tokens"]
        blocks = len(toks) // BLOCK
        if own:
            # The target replica serves the prompt directly: its engine caches the blocks and
            # publishes them.
            send(prompt, replicas[target].url)
        else:
            events, parent = [], None
            for k in range(blocks):
                h = 0x7A3D_0000_0000_0000 + k  # any integer: the router hashes the token ids itself
                events.append({"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent, "token_ids": toks[k * BLOCK:(k + 1) * BLOCK],
                               "block_size": BLOCK, "lora_id": None, "lora_name": None, "medium": "GPU"})
                parent = h
            pubs[target].send_multipart([b"", (0).to_bytes(8, "big"), msgpack.packb([time.time(), events, 0], use_bin_type=True)])
        time.sleep(0.5)

        # 2. The announced prefix draws its requests to the replica that holds it.
        first = send(prompt + " first question")
        second = send(prompt + " second question")
        log(f"kv_aware with {what}: with nothing cached a request went to replica {default}; once replica {target} "
            f"{'served the prompt' if own else 'announced its'} ({blocks} blocks of {BLOCK}, of {len(toks)} prompt tokens), two requests sharing it went to {first} and {second}")
        assert first == target and second == target, (default, target, first, second)
        if own:
            hits = metric(replicas[target].metrics(), "vllm:prefix_cache_hits_total")
            log(f"  replica {target}'s prefix-cache hits: {hits:.0f} tokens")
            assert hits >= 2 * (blocks - 1) * BLOCK, hits
    finally:
        router.stop()
        for r in replicas:
            r.stop()
        for s in pubs:
            s.close()
        ctx.term()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--bin-dir", default=os.path.dirname(sys.executable))
    args = ap.parse_args()
    t_all = time.monotonic()
    work = tempfile.mkdtemp(prefix="tandem-kv-contract-")
    model_dir = os.path.join(work, "tiny")
    subprocess.run([args.tandem, "gen-model", "--shape", "tiny", "--dtype", "f32", "--out", model_dir], check=True, stdout=subprocess.DEVNULL)
    ok = False
    try:
        run(args.tandem, args.bin_dir, work, model_dir, own=False)
        run(args.tandem, args.bin_dir, work, model_dir, own=True)
        log(f"kv_aware: passed in {time.monotonic() - t_all:.0f} s")
        ok = True
    finally:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"logs in {work}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
