#!/bin/bash
# Instructions and allocations per proxied request with the access log and tracing off or
# on, under callgrind (counts, not seconds: they do not drift on a noisy VM).
#
#   benches/observability_cg.sh MODE N   -> prints "IR ALLOCS" of a run of N requests
#
# MODE: off | log (access_log to a file) | trace ([tracing] to examples/otlp_sink) | both.
# Per request = (count(N2) - count(N1)) / (N2 - N1), which cancels start-up and shutdown.
# The whole process is counted: the access-log writer and the span exporter threads too.
# Needs: valgrind, taskset, curl, python3; a release throttle ($B, default
# target/release/throttle; `cargo bench --bench bare_proxy --no-run` builds one) and
# `cargo build --example otlp_sink` for MODE trace/both. Starts its own upstream
# (`throttle demo`'s echo is not used: a one-line Python keep-alive server answers "ok").
set -euo pipefail
mode=$1; n=$2
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here")
B=${B:-$root/target/release/throttle}
SINK=${SINK:-$root/target/debug/examples/otlp_sink}
d=${CG_DIR:-/tmp/throttle-obs-cg}; mkdir -p "$d"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P=$(port); A=$(port); U=$(port); O=$(port)
cleanup() { kill $(jobs -p) 2>/dev/null || true; }
trap cleanup EXIT

python3 - "$U" <<'PY' &
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64)
def serve(c):
    buf = b""
    while True:
        d = c.recv(65536)
        if not d: return
        buf += d
        while b"\r\n\r\n" in buf:
            _, buf = buf.split(b"\r\n\r\n", 1)
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
PY

log=off; tracing=""
case $mode in
  off) ;;
  log) log="$d/access.$n.log" ;;
  trace) tracing="[tracing]
otlp_endpoint = \"http://127.0.0.1:$O\"" ;;
  both) log="$d/access.$n.log"; tracing="[tracing]
otlp_endpoint = \"http://127.0.0.1:$O\"" ;;
  *) echo "mode: off | log | trace | both" >&2; exit 2 ;;
esac
if [ -n "$tracing" ]; then "$SINK" "127.0.0.1:$O" 2>"$d/sink.$mode.$n.err" & fi
rm -f "$d/access.$n.log"
cat > "$d/gw.$mode.$n.toml" <<T
[server]
listen = "127.0.0.1:$P"
admin_listen = "127.0.0.1:$A"
threads = 1
grace_period_secs = 0
access_log = "$log"
$tracing
[limits.ip]
per_minute = 100000000
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:$U"]
auth = "none"
T
# Every request is limited (one store call), so a traced one has three spans.
out=$d/cg.$mode.$n
taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out" --log-file="$out.log" \
  "$B" run --config "$d/gw.$mode.$n.toml" 2>"$d/gw.$mode.$n.err" &
pid=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$A/readyz" >/dev/null && break; sleep 0.2; done
python3 "$here/drive.py" 127.0.0.1 "$P" "$n" /x "" 200 >&2
# Let the exporter send the last batch (500 ms batches; slower under callgrind).
if [ -n "$tracing" ]; then
  for _ in $(seq 100); do
    curl -s "http://127.0.0.1:$A/metrics" | grep -q "throttle_trace_spans_total{outcome=\"exported\"} $((n * 3))" && break
    sleep 0.3
  done
  curl -s "http://127.0.0.1:$A/metrics" | grep throttle_trace_spans_total >&2
fi
kill -TERM $pid; wait $pid || true
python3 "$here/cgcount.py" "$out"
