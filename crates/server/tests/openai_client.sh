#!/usr/bin/env bash
# Starts the fake-model server (examples/fake_server.rs) on a free loopback port, runs
# tests/openai_client.py against it with the `openai` package from a venv, stops the server.
# Usage: crates/server/tests/openai_client.sh [python-with-openai]   (default: python3)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-python3}"
"$py" -c "import openai" || { echo "needs the openai package: python3 -m venv v && v/bin/pip install openai"; exit 2; }
cargo build -q -p tandem-server --example fake_server
bin="$(cargo metadata --format-version 1 --no-deps | "$py" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/examples/fake_server"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" "127.0.0.1:$port" 1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
done
"$py" "$here/openai_client.py" "http://127.0.0.1:$port/v1" fake
