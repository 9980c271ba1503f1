#!/usr/bin/env python3
"""An hour's soak of `tandem serve` under mixed load (issue 29, item 4). Run by hand:

    python3 tests/soak/soak.py --tandem target/debug/tandem --minutes 60 --out docs/results/soak-DATE

It starts the server (the default model on wgpu unless told otherwise, a small KV pool so that
preemption happens, a request timeout), then keeps `--concurrency` clients busy with a mix:
chat and completions, whole and streamed, structured output, forced tool calls, greedy requests
repeated (their text must not change: no lost or duplicated output), a shared long prefix
(prefix-cache hits), clients that disconnect mid-stream, bad inputs (each must be a 4xx), and
requests the server's timeout cuts. Every minute it records latency percentiles, the server's
RSS and its /metrics. At the end, with the load stopped: no 5xx, every request accounted for in
vLLM's `request_success_total`, KV usage and running requests back to 0, RSS back near where the
first minute left it. Writes OUT.json (figures per minute and the verdict) and OUT.png (p99 per
minute), and exits non-zero when a check fails. Standard library only (the plot needs matplotlib;
without it the PNG is skipped and says so).
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

CHECKS = []


def fail(msg):
    CHECKS.append(msg)
    print("CHECK FAILED:", msg, flush=True)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.minute = []  # (kind, status, latency)
        self.kinds = {}
        self.status = {}
        self.sent = 0
        self.engine_requests = 0  # requests that reached the engine (200, or a stream started)
        self.aborted_by_client = 0
        self.greedy = {}
        self.greedy_repeats = 0

    def add(self, kind, status, latency, engine=0):
        with self.lock:
            self.minute.append((kind, status, latency))
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            self.status[str(status)] = self.status.get(str(status), 0) + 1
            self.sent += 1
            self.engine_requests += engine


def conn(port, timeout=120):
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)


def post(port, path, body, timeout=120):
    c = conn(port, timeout)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    return r.status, text


def stream(port, path, body, cut_after=None, timeout=120):
    """Returns (status, events, done). With cut_after, closes the socket after that many events."""
    c = conn(port, timeout)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        text = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, [text], False
    events, done, buf = [], False, b""
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        d = line[6:]
        if d == b"[DONE]":
            done = True
            break
        events.append(json.loads(d))
        if cut_after is not None and len(events) >= cut_after:
            c.sock.shutdown(socket.SHUT_RDWR)
            break
    c.close()
    return 200, events, done


PREFIX = "You are a careful assistant. " * 24  # about 150 tokens shared by many requests
WORDS = "alpha beta gamma delta river stone cloud light paper seven green quiet".split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def one(port, rng, st, model):
    kind = rng.choice(["chat", "chat_stream", "completion_stream", "json_schema", "tool", "greedy_repeat", "prefix", "disconnect", "bad", "long_prompt", "timeout"])
    t0 = time.time()
    status, engine = 0, 0
    try:
        if kind in ("chat", "prefix"):
            sys_msg = PREFIX if kind == "prefix" else "Be brief."
            status, text = post(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "system", "content": sys_msg}, {"role": "user", "content": words(rng, 8)}], "max_tokens": rng.randint(4, 24), "temperature": 0.7, "seed": rng.randint(0, 1 << 30)})
            if status == 200:
                engine = 1
                v = json.loads(text)
                if v["choices"][0]["finish_reason"] not in ("stop", "length"):
                    fail(f"{kind}: finish_reason {v['choices'][0]['finish_reason']}")
        elif kind == "chat_stream":
            status, ev, done = stream(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": words(rng, 6)}], "max_tokens": rng.randint(4, 24), "stream": True, "stream_options": {"include_usage": True}})
            if status == 200:
                engine = 1
                if not done:
                    fail("chat_stream: no [DONE]")
                usage = [e for e in ev if e.get("usage")]
                n = sum(1 for e in ev for c in e.get("choices", []) if c.get("delta", {}).get("content"))
                if not usage or usage[-1]["usage"]["completion_tokens"] < n:
                    fail(f"chat_stream: usage {usage[-1:] if usage else None} against {n} content chunks")
        elif kind == "completion_stream":
            status, ev, done = stream(port, "/v1/completions", {"model": model, "prompt": words(rng, 10), "max_tokens": rng.randint(4, 24), "stream": True, "logprobs": 2})
            if status == 200:
                engine = 1
                if not done:
                    fail("completion_stream: no [DONE]")
        elif kind == "json_schema":
            schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": False}
            status, text = post(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "a name and a number as JSON"}], "max_tokens": 48, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
            if status == 200:
                engine = 1
                v = json.loads(text)
                c = v["choices"][0]
                if c["finish_reason"] == "stop":
                    obj = json.loads(c["message"]["content"])
                    if set(obj) != {"name", "n"}:
                        fail(f"json_schema: keys {sorted(obj)}")
        elif kind == "tool":
            tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 12}}, "required": ["q"]}}}
            status, text = post(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "look up " + words(rng, 2)}], "max_tokens": 48, "tools": [tool], "tool_choice": "required"})
            if status == 200:
                engine = 1
                c = json.loads(text)["choices"][0]
                if c["finish_reason"] == "tool_calls":
                    json.loads(c["message"]["tool_calls"][0]["function"]["arguments"])
        elif kind == "greedy_repeat":
            p = "Count: " + words(random.Random(rng.randint(0, 7)), 5)
            status, text = post(port, "/v1/completions", {"model": model, "prompt": p, "max_tokens": 16, "temperature": 0})
            if status == 200:
                engine = 1
                out = json.loads(text)["choices"][0]["text"]
                with st.lock:
                    if p in st.greedy:
                        st.greedy_repeats += 1
                        if st.greedy[p] != out:
                            fail(f"greedy text changed for {p!r}: {st.greedy[p]!r} then {out!r}")
                    else:
                        st.greedy[p] = out
        elif kind == "disconnect":
            status, ev, _ = stream(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": words(rng, 6)}], "max_tokens": 64, "stream": True}, cut_after=2)
            if status == 200:
                engine = 1
                with st.lock:
                    st.aborted_by_client += 1
        elif kind == "bad":
            body = rng.choice([b"{not json", json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}), json.dumps({"model": model, "messages": "x"}), json.dumps({"model": model, "prompt": "x", "max_tokens": -3}), json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})])
            status, _ = post(port, rng.choice(["/v1/chat/completions", "/v1/completions"]), body)
            if not 400 <= status < 500:
                fail(f"bad input answered {status}")
        elif kind == "long_prompt":
            status, text = post(port, "/v1/completions", {"model": model, "prompt": "x " * 5000, "max_tokens": 4})
            if status != 400:
                fail(f"an overflowing prompt answered {status}: {text[:200]}")
        elif kind == "timeout":
            # Long enough to run into the server's --request-timeout-s under load: 200 (cut,
            # finish "abort"/"length") or 408, never a 5xx.
            status, text = post(port, "/v1/completions", {"model": model, "prompt": words(rng, 4), "max_tokens": 200, "ignore_eos": True})
            if status == 200:
                engine = 1
    except Exception as e:  # a dropped connection or bad JSON is a failure of the server
        fail(f"{kind}: {type(e).__name__}: {e}")
        status = -1
    if status >= 500:
        fail(f"{kind}: answered {status}")
    st.add(kind, status, time.time() - t0, engine)


def metrics(port):
    c = conn(port, 30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def metric_sum(m, prefix):
    return sum(v for k, v in m.items() if k.startswith(prefix))


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default="target/debug/tandem")
    ap.add_argument("--model", default=None, help="model directory (default: the default model)")
    ap.add_argument("--backend", default="wgpu")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--out", required=True, help="output path without extension")
    a = ap.parse_args()
    args = [a.tandem, "serve", "--backend", a.backend, "--port", str(a.port), "--num-kv-blocks", "48", "--max-num-seqs", "8", "--request-timeout-s", "60"]
    if a.model:
        args += ["--model", a.model]
    log = open(a.out + ".server.log", "w")
    srv = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    t_start = time.time()
    while True:
        try:
            c = conn(a.port, 5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if srv.poll() is not None or time.time() - t_start > 600:
            print("the server did not come up; see", a.out + ".server.log")
            return 2
        time.sleep(1)
    c = conn(a.port)
    c.request("GET", "/v1/models")
    model = json.loads(c.getresponse().read())["data"][0]["id"]
    print(f"server up in {time.time() - t_start:.0f} s, model {model}", flush=True)
    base = metrics(a.port)
    st = Stats()
    stop = threading.Event()

    def worker(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            one(a.port, rng, st, model)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.concurrency)]
    for t in threads:
        t.start()
    minutes = []
    end = time.time() + a.minutes * 60
    while time.time() < end:
        time.sleep(min(60, max(1, end - time.time())))
        with st.lock:
            batch, st.minute = st.minute, []
        m = metrics(a.port)
        lat = [x[2] for x in batch if x[1] == 200]
        row = {"minute": len(minutes) + 1, "requests": len(batch), "ok": len(lat), "p50_s": pct(lat, 0.5), "p99_s": pct(lat, 0.99),
               "rss_mb": rss_kb(srv.pid) / 1024, "kv_usage": metric_sum(m, "vllm:kv_cache_usage_perc"),
               "preemptions": metric_sum(m, "vllm:num_preemptions_total"), "prefix_hits": metric_sum(m, "vllm:prefix_cache_hits_total")}
        minutes.append(row)
        print(json.dumps(row), flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    # Idle: the engine must settle to nothing held.
    settle = time.time()
    while True:
        m = metrics(a.port)
        running = metric_sum(m, "vllm:num_requests_running") + metric_sum(m, "vllm:num_requests_waiting")
        kv = metric_sum(m, "vllm:kv_cache_usage_perc")
        if (running == 0 and kv == 0) or time.time() - settle > 60:
            break
        time.sleep(1)
    if running != 0 or kv != 0:
        fail(f"not idle 60 s after the load: running+waiting {running}, KV usage {kv}")
    finished = metric_sum(m, "vllm:request_success_total") - metric_sum(base, "vllm:request_success_total")
    if finished < st.engine_requests:
        fail(f"request_success_total grew by {finished}, fewer than the {st.engine_requests} requests that reached the engine")
    rss_first = minutes[0]["rss_mb"] if minutes else 0
    rss_end = rss_kb(srv.pid) / 1024
    if rss_first and rss_end > rss_first * 1.25 + 64:
        fail(f"RSS grew from {rss_first:.0f} MB (first minute) to {rss_end:.0f} MB")
    srv.send_signal(signal.SIGTERM)
    try:
        code = srv.wait(timeout=120)
    except subprocess.TimeoutExpired:
        srv.kill()
        code = "killed"
        fail("the server did not exit within 120 s of SIGTERM")
    if code not in (0, "killed"):
        fail(f"the server exited with {code} on SIGTERM")
    fivexx = {k: v for k, v in st.status.items() if k.startswith("5") or k == "-1"}
    verdict = {
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "server": " ".join(args[1:]), "minutes": a.minutes, "concurrency": a.concurrency,
        "requests": st.sent, "by_kind": st.kinds, "by_status": st.status, "reached_engine": st.engine_requests,
        "client_disconnects": st.aborted_by_client, "greedy_repeats_checked": st.greedy_repeats,
        "request_success_total_delta": finished, "rss_mb_first_minute": rss_first, "rss_mb_end": rss_end,
        "five_xx": fivexx, "checks_failed": CHECKS, "per_minute": minutes,
    }
    with open(a.out + ".json", "w") as f:
        json.dump(verdict, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = [r["minute"] for r in minutes]
        ax.plot(xs, [r["p99_s"] or 0 for r in minutes], label="p99 latency (s)")
        ax.plot(xs, [r["p50_s"] or 0 for r in minutes], label="p50 latency (s)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r["rss_mb"] for r in minutes], "g:", label="RSS (MB)")
        ax.set_xlabel("minute")
        ax.set_ylabel("seconds")
        ax2.set_ylabel("MB")
        ax.legend(loc="upper left")
        ax2.legend(loc="upper right")
        ax.set_title(f"tandem serve soak: {st.sent} requests, {len(CHECKS)} failed checks")
        fig.tight_layout()
        fig.savefig(a.out + ".png", dpi=100)
    except ImportError:
        print("matplotlib missing: no PNG")
    print(json.dumps({k: v for k, v in verdict.items() if k != "per_minute"}, indent=1))
    return 1 if CHECKS else 0


if __name__ == "__main__":
    sys.exit(main())
