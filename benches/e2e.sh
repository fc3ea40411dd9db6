#!/usr/bin/env bash
# End-to-end load through the real gateway: `throttle demo` (gateway + in-process echo
# upstream) with 3 scopes (ip, key, global) on the memory or the Redis store, driven by
# wrk over keep-alive on loopback. Bounded: one 10 s run per backend.
#
#   benches/e2e.sh [memory|redis|both]      (redis: $REDIS_URL, default redis://127.0.0.1:6379)
#
# Needs wrk (apt-get install wrk). Prints requests/s and, for Redis, EVALSHA calls per request.
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-both}"
redis_url="${REDIS_URL:-redis://127.0.0.1:6379}"
duration="${DURATION:-10s}"
command -v wrk >/dev/null || { echo "e2e: wrk is not installed (apt-get install wrk)"; exit 1; }
cargo build --release --quiet
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {
  local backend=$1 port admin store
  port=$(free_port); admin=$(free_port)
  if [ "$backend" = redis ]; then
    store="backend = \"redis\"
url = \"$redis_url\"
timeout_ms = 25
key_prefix = \"e2e-$$\""
  else
    store='backend = "memory"'
  fi
  cat > "$tmp/gw-$backend.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
threads = 1
[store]
$store
[limits.ip]
per_second = 1000000
per_minute = 100000000
[limits.global]
per_second = 1000000000
[tiers.bench]
key = { per_second = 1000000, per_hour = 1000000000 }
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:9"]
[[keys]]
id = "bench"
key = "bench-key"
tenant = "bench"
tier = "bench"
TOML
  RUST_LOG=error ./target/release/throttle demo --config "$tmp/gw-$backend.toml" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break; sleep 0.1; done
  local before=0 after=0
  if [ "$backend" = redis ]; then
    redis-cli -u "$redis_url" CONFIG RESETSTAT >/dev/null
  fi
  echo "== $backend store: wrk -t1 -c32 -d$duration, 3 scopes (ip 2 windows, key 2 windows, global 1)"
  wrk -t1 -c32 -d"$duration" -H 'X-API-Key: bench-key' "http://127.0.0.1:$port/bench" | tee "$tmp/wrk-$backend.txt" | grep -E "Requests/sec|Latency|requests in|Non-2xx"
  if [ "$backend" = redis ]; then
    local evalsha total
    evalsha=$(redis-cli -u "$redis_url" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p')
    total=$(grep -Eo '^ *[0-9]+ requests' "$tmp/wrk-$backend.txt" | grep -Eo '[0-9]+')
    echo "   EVALSHA calls: $evalsha for $total requests ($(python3 -c "print(round(${evalsha:-0}/max(${total:-1},1),3))") per request)"
    redis-cli -u "$redis_url" --scan --pattern "e2e-$$:*" | xargs -r redis-cli -u "$redis_url" DEL >/dev/null
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

case "$which" in
  memory) run memory ;;
  redis) run redis ;;
  both) run memory; run redis ;;
esac
