#!/usr/bin/env bash
# End-to-end comparison on one core: Throttle vs a bare Pingora proxy, nginx limit_req and
# HAProxy stick tables. Each proxy is pinned to CPU 0 (one worker thread); wrk and the
# upstream (nginx `return 200`) share CPU 1. For each proxy: plain proxying, limiting that
# always passes (so the cost of limiting shows), and every request rejected with 429.
#
#   benches/compare.sh            (DURATION=8s by default; needs wrk, nginx, haproxy, taskset)
#
# Loopback only; each run is bounded by DURATION. Prints requests/s per run.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${DURATION:-8s}"
for t in wrk nginx haproxy taskset; do command -v "$t" >/dev/null || { echo "compare: $t missing (apt-get install wrk nginx haproxy util-linux)"; exit 1; }; done
cargo build --release --quiet
bare=$(cargo bench --bench bare_proxy --no-run --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*bare_proxy[^"]*\)".*/\1/p' | tail -1)
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; rm -rf "$tmp"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; exit 1; }

# The upstream: nginx on CPU 1.
up=$(port)
mkdir -p "$tmp/up"
cat > "$tmp/up/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $tmp/up/nginx.pid; error_log $tmp/up/error.log;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$up; location / { return 200 "ok"; } } }
CONF
taskset -c 1 nginx -c "$tmp/up/nginx.conf" -p "$tmp/up" & pids+=($!)
wait_port "$up"

stop_last() { kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; }

bench() { # name url [header]
  local name=$1 url=$2 hdr=${3:-}
  local out
  if [ -n "$hdr" ]; then out=$(taskset -c 1 wrk -t1 -c32 -d"$duration" -H "$hdr" "$url"); else out=$(taskset -c 1 wrk -t1 -c32 -d"$duration" "$url"); fi
  local rps non2xx
  rps=$(echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p')
  non2xx=$(echo "$out" | sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p')
  printf '%-44s %10s req/s   non-2xx: %s\n' "$name" "$rps" "${non2xx:-0}"
}

# --- bare Pingora -------------------------------------------------------------------
p=$(port)
BARE_PROXY_LISTEN=127.0.0.1:$p BARE_PROXY_UPSTREAM=127.0.0.1:$up taskset -c 0 "$bare" >/dev/null 2>&1 & pids+=($!)
wait_port "$p"
bench "pingora (bare proxy)" "http://127.0.0.1:$p/"
stop_last

# --- Throttle -------------------------------------------------------------------------
throttle_run() { # name limits-toml; sets P
  local p a
  p=$(port); a=$(port)
  cat > "$tmp/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
admin_listen = "127.0.0.1:$a"
threads = 1
$2
[[routes]]
name = "all"
path_prefix = "/"
upstreams = ["127.0.0.1:$up"]
auth = "none"
TOML
  RUST_LOG=error taskset -c 0 ./target/release/throttle run --config "$tmp/$1.toml" >/dev/null 2>&1 & pids+=($!)
  wait_port "$p"
  P=$p
}
throttle_run none ""
p=$P
bench "throttle, no limits" "http://127.0.0.1:$p/"
stop_last
throttle_run pass $'[limits.ip]\nper_second = 100000000\nper_minute = 1000000000\n[limits.global]\nper_second = 100000000'
p=$P
bench "throttle, ip (2 windows) + global, all pass" "http://127.0.0.1:$p/"
stop_last
throttle_run reject $'[limits.ip]\nper_hour = 1'
p=$P
bench "throttle, every request 429" "http://127.0.0.1:$p/"
stop_last

# --- nginx limit_req ------------------------------------------------------------------
nginx_run() { # name extra-http extra-location; sets P
  local p; p=$(port)
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $tmp/$1/nginx.pid; error_log $tmp/$1/error.log crit;
events { worker_connections 4096; }
http { access_log off; $2
  upstream up { server 127.0.0.1:$up; keepalive 64; }
  server { listen 127.0.0.1:$p; location / { $3 proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://up; } } }
CONF
  taskset -c 0 nginx -c "$tmp/$1/nginx.conf" -p "$tmp/$1" & pids+=($!)
  wait_port "$p"
  P=$p
}
nginx_run nplain "" ""
p=$P
bench "nginx, no limits" "http://127.0.0.1:$p/"
stop_last
nginx_run npass "limit_req_zone \$binary_remote_addr zone=ip:10m rate=100000000r/s;" "limit_req zone=ip burst=100000000 nodelay;"
p=$P
bench "nginx limit_req, all pass" "http://127.0.0.1:$p/"
stop_last
nginx_run nrej "limit_req_zone \$binary_remote_addr zone=ip:10m rate=1r/m; limit_req_status 429;" "limit_req zone=ip;"
p=$P
bench "nginx limit_req, every request 429" "http://127.0.0.1:$p/"
stop_last

# --- HAProxy stick tables -------------------------------------------------------------
haproxy_run() { # name frontend-extra; sets P
  local p; p=$(port)
  cat > "$tmp/$1.cfg" <<CONF
global
  nbthread 1
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:$p
  $2
  default_backend be
backend be
  http-reuse always
  server up 127.0.0.1:$up
CONF
  taskset -c 0 haproxy -f "$tmp/$1.cfg" -db >/dev/null 2>&1 & pids+=($!)
  wait_port "$p"
  P=$p
}
haproxy_run hplain ""
p=$P
bench "haproxy, no limits" "http://127.0.0.1:$p/"
stop_last
haproxy_run hpass $'stick-table type ip size 1m expire 60s store http_req_rate(1s)\n  http-request track-sc0 src\n  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 100000000 }'
p=$P
bench "haproxy stick table, all pass" "http://127.0.0.1:$p/"
stop_last
haproxy_run hrej $'stick-table type ip size 1m expire 60s store http_req_rate(60s)\n  http-request track-sc0 src\n  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 0 }'
p=$P
bench "haproxy stick table, every request 429" "http://127.0.0.1:$p/"
