#!/usr/bin/env bash
# Starts the fake-model server (examples/fake_server.rs) and the tiny-random-model server with
# structured output (examples/tiny_server.rs) on free loopback ports, runs
# tests/openai_client.py (the `openai` package), tests/anthropic_client.py (the `anthropic`
# package) and tests/agents_client.py (the OpenAI Agents SDK, `openai-agents`) against them from
# a venv, stops them.
# Usage: crates/server/tests/openai_client.sh [python-with-openai-anthropic-and-openai-agents]   (default: python3)
# With TANDEM_EXAMPLES_DIR set (cargo xtask test sets it: `cargo test --workspace` has just built
# both examples there) the examples are not built again; a `-p tandem-server` build would
# resolve features for that crate alone and recompile much of the workspace.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-python3}"
# The versions `cargo xtask test` pins (xtask/src/test.rs, CLIENT_PACKAGES): the checks call
# `chat.completions.parse` and `responses.parse`, which older clients lack.
"$py" -c "import openai" || { echo "needs the openai package: python3 -m venv v && v/bin/pip install openai==3.60.0"; exit 2; }
"$py" -c "import anthropic" || { echo "needs the anthropic package: python3 -m venv v && v/bin/pip install anthropic==2.17.0"; exit 2; }
"$py" -c "import agents" || { echo "needs the openai-agents package: python3 -m venv v && v/bin/pip install openai-agents==0.24.0"; exit 2; }
if [ -n "${TANDEM_EXAMPLES_DIR:-}" ]; then
    examples="$TANDEM_EXAMPLES_DIR"
else
    cargo build -q -p tandem-server --example fake_server --example tiny_server
    examples="$(cargo metadata --format-version 1 --no-deps | "$py" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/examples"
fi
for e in fake_server tiny_server; do
    [ -x "$examples/$e" ] || { echo "openai_client.sh: $examples/$e is missing (build it: cargo build -p tandem-server --example $e)"; exit 2; }
done
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
tiny_port=$(free_port)
"$examples/fake_server" "127.0.0.1:$port" 1 &
pid=$!
"$examples/tiny_server" "127.0.0.1:$tiny_port" &
tiny_pid=$!
trap 'kill -TERM $pid $tiny_pid 2>/dev/null; wait $pid $tiny_pid 2>/dev/null || true' EXIT
for p in "$port" "$tiny_port"; do
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$p/health" >/dev/null 2>&1 && break
        sleep 0.1
    done
done
"$py" "$here/openai_client.py" "http://127.0.0.1:$port/v1" fake "http://127.0.0.1:$tiny_port/v1"
"$py" "$here/anthropic_client.py" "http://127.0.0.1:$port" fake "http://127.0.0.1:$tiny_port"
"$py" "$here/agents_client.py" "http://127.0.0.1:$port/v1" fake
