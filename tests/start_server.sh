# Sourced by tests/lm_eval/run.sh and tests/guidellm/run.sh: starts `$TANDEM_BIN serve "$MODEL"`
# on a free loopback port (PORT) with the extra flags given, logs to $OUT/server.log, stops it
# on exit, and returns once /health answers 200.
start_server() {
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)} "$TANDEM_BIN" serve "$MODEL" --backend "$BACKEND" --port "$PORT" "$@" > "$OUT/server.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
    kill -0 $SERVER 2>/dev/null || { cat "$OUT/server.log"; return 1; }
    sleep 0.2
  done
  echo "tandem serve not healthy after 120 s" >&2
  return 1
}
