#!/usr/bin/env bash
# A flood from one address against a client within its limit, on one core (issue 39):
# a flood from one address at FACTOR (5) x the gateway's 429 capacity, with a second client
# sending within its limit: the second client's success rate >= 99% and its p99 within 3x
# its p99 without the flood.
#
#   benches/flood.sh     (SECS=10 per client run, RATE=200 requests/s of the client,
#                         FLOOD_CONNS=64 flood connections, FACTOR=5, DURATION=5 s per
#                         capacity run, ROUNDS=2; honours CARGO_TARGET_DIR)
#
# The gateway (release build, `threads = 1`) is pinned to CPU 0; the load generator
# (benches/flood.rs), wrk and the upstream (nginx `return 200`) run on CPU 1, the client and
# the upstream at a real-time priority when allowed, so that on CPU 1 they go first. Limits: `[limits.ip]
# per_second = 400`, so the client (RATE/s) is within its limit and the flood is refused.
# Source addresses on loopback (Linux routes all of 127.0.0.0/8 to lo): the flood binds
# 127.0.0.2, the client 127.0.0.3, the gateway listens on 127.0.0.1; each is a client IP
# of its own to the gateway as a direct peer (no trusted proxy, so the per-address
# connection cap applies as it would at the edge).
#
# (1) 429 capacity: every request over the limit, keep-alive, as fast as the gateway
#     answers; wrk -t1 -c32 (one request in flight per connection, as benches/compare.sh)
#     and the flood generator at --rate 0 (FLOOD_CONNS pipelined connections); the larger
#     of the two answered rates is the capacity C.
# (2) The client alone: RATE/s for SECS s, open loop, latency from each request's due time.
# (3) The flood at FACTOR x C requests/s (offered on a schedule; what TCP did not take is
#     counted, and what the generator wrote and the gateway answered is shown) from its own
#     address, the client on the same schedule as (2) from another.
# (2) and (3) alternate ROUNDS times, each run in a fresh gateway process.
#
# Needs nginx, wrk, taskset, curl, python3 (and chrt, util-linux, for the priority). Loopback only, free ports, every process
# it starts is stopped at exit. Run by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-10}"
rate="${RATE:-200}"
fconns="${FLOOD_CONNS:-64}"
factor="${FACTOR:-5}"
duration="${DURATION:-5}"
rounds="${ROUNDS:-2}"
cmd="SECS=$secs RATE=$rate FLOOD_CONNS=$fconns FACTOR=$factor DURATION=$duration ROUNDS=$rounds benches/flood.sh"
for t in cargo nginx wrk taskset curl python3; do
  command -v "$t" >/dev/null || { echo "flood: $t is missing (apt-get install nginx wrk util-linux curl python3)" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "flood: needs 2 CPUs (gateway on CPU 0, load on CPU 1)" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
# stop PID SECONDS: SIGTERM, then SIGKILL if it has not exited within SECONDS; reaps it.
stop() {
  local i
  kill -TERM "$1" 2>/dev/null || true
  for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  local p
  for p in "${pids[@]:-}"; do if [ -n "$p" ]; then stop "$p" 10; fi; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building (bench profile = release; target dir ${CARGO_TARGET_DIR:-target}) ..." >&2
cargo bench --bench flood --no-run --message-format=json-render-diagnostics >"$tmp/build.json" 2>"$tmp/build.err" || {
  cat "$tmp/build.err" >&2; echo "flood: cargo bench --bench flood --no-run failed" >&2; exit 1
}
executable() { # target-name kind -> its executable, as cargo reported it
  python3 -c 'import json, sys
exe = ""
for line in open(sys.argv[1]):
    try: m = json.loads(line)
    except ValueError: continue
    t = m.get("target") or {}
    if m.get("reason") == "compiler-artifact" and t.get("name") == sys.argv[2] and sys.argv[3] in t.get("kind", []) and m.get("executable"):
        exe = m["executable"]
print(exe)' "$tmp/build.json" "$1" "$2"
}
throttle=$(executable throttle bin)
gen=$(executable flood bench)
[ -x "$throttle" ] || { echo "flood: cargo built no throttle binary" >&2; exit 1; }
[ -x "$gen" ] || { echo "flood: cargo built no benches/flood.rs" >&2; exit 1; }
# Private copies: a build in the same target dir during the run cannot swap them.
cp "$throttle" "$tmp/throttle" && throttle=$tmp/throttle
cp "$gen" "$tmp/gen" && gen=$tmp/gen
echo "  ${THROTTLE_BIN:-$throttle}" >&2
# THROTTLE_BIN: another gateway binary to measure (an A/B of two builds).
throttle=${THROTTLE_BIN:-$throttle}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port seconds pid log
  local i
  for i in $(seq $(($2 * 20))); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "flood: process $3 exited before opening port $1" >&2; tail -20 "$4" >&2; exit 1; }
    sleep 0.05
  done
  echo "flood: port $1 never opened" >&2; tail -20 "$4" >&2; exit 1
}
# run_waited OUT CMD...: runs CMD in the background (stdout to OUT) and waits for it.
run_waited() {
  local out=$1 rc=0
  shift
  "$@" >"$out" 2>"$out.err" & pids+=($!)
  wait "${pids[-1]}" || rc=$?
  unset 'pids[-1]'
  [ "$rc" = 0 ] || { cat "$out.err" >&2; echo "flood: $* failed" >&2; exit 1; }
}

# The client and the upstream at a real-time priority on CPU 1 when allowed (root): a
# waiting compile or the flood generator there does not delay them, so their latency is
# the gateway's.
rt=()
if chrt -f 10 true 2>/dev/null; then rt=(chrt -f 10); fi
echo "  client and upstream priority: ${rt[*]:-normal (chrt -f not allowed)}" >&2
up=$(port)
mkdir -p "$tmp/up"
cat > "$tmp/up/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $tmp/up/nginx.pid; error_log $tmp/up/error.log;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$up; location / { return 200 "ok"; } } }
CONF
"${rt[@]}" taskset -c 1 nginx -c "$tmp/up/nginx.conf" -p "$tmp/up" & pids+=($!)
wait_port "$up" 5 "${pids[-1]}" "$tmp/up/error.log"

run_id=0
gateway_start() { # starts a fresh gateway on CPU 0; sets P, A and GW (its pid)
  local p a
  p=$(port); a=$(port); run_id=$((run_id + 1))
  cat > "$tmp/g$run_id.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
admin_listen = "127.0.0.1:$a"
threads = 1
grace_period_secs = 0
${GATEWAY_SERVER_EXTRA:-}
[limits.ip]
per_second = 400

[[routes]]
name = "all"
path_prefix = "/"
upstreams = ["127.0.0.1:$up"]
auth = "none"
TOML
  RUST_LOG=error taskset -c 0 "$throttle" run --config "$tmp/g$run_id.toml" >"$tmp/g$run_id.log" 2>&1 & pids+=($!)
  GW=${pids[-1]}; P=$p; A=$a
  wait_port "$P" 10 "$GW" "$tmp/g$run_id.log"
}
gateway_stop() { stop "$GW" 10; unset 'pids[-1]'; }
metric() { # name -> the gateway's value (0 when absent)
  curl -s "http://127.0.0.1:$A/metrics" | awk -v m="$1" '$1 == m { v = $2 } END { print v + 0 }'
}
flood_gen() { # rate secs out
  taskset -c 1 "$gen" flood --target "127.0.0.1:$P" --bind 127.0.0.2 --conns "$fconns" \
    --rate "$1" --secs "$2" --warmup 1 >"$3" 2>"$3.err"
}

# --- (1) the 429 capacity ----------------------------------------------------------------
# CAPACITY=N skips the measurement and floods at FACTOR x N (the same offered load for
# two gateway builds).
if [ -n "${CAPACITY:-}" ]; then
  cap_wrk=0; cap_flood=0; capacity=$CAPACITY
else
echo "(1) 429 capacity: wrk -t1 -c32 -d${duration}s, then the flood generator at --rate 0 ($fconns connections) ..." >&2
gateway_start
run_waited "$tmp/wrk.out" taskset -c 1 wrk -t1 -c32 -d"${duration}s" "http://127.0.0.1:$P/x"
gateway_stop
gateway_start
flood_gen 0 $((duration + 1)) "$tmp/cap.json" || { cat "$tmp/cap.json.err" >&2; exit 1; }
gateway_stop
cap=$(python3 - "$tmp/wrk.out" "$tmp/cap.json" <<'PY'
import json, re, sys
w = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s*([\d.]+)", w).group(1))
total = int(re.search(r"(\d+) requests in", w).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", w)
r429 = rps * (int(non2xx.group(1)) if non2xx else 0) / max(total, 1)
f = json.load(open(sys.argv[2]))
print(f"{r429:.0f} {f['per_sec']['429']:.0f}")
PY
)
read -r cap_wrk cap_flood <<<"$cap"
capacity=$((cap_wrk > cap_flood ? cap_wrk : cap_flood))
fi
offer=$((capacity * factor))
echo "  429s/s: wrk $cap_wrk, flood generator $cap_flood; capacity $capacity, flood offered at $offer/s" >&2

# --- (2) and (3), alternating ---------------------------------------------------------------
client_gen() { # out
  run_waited "$1" "${rt[@]}" taskset -c 1 "$gen" client --target "127.0.0.1:$P" --bind 127.0.0.3 --rate "$rate" --secs "$secs" --conns 16
}
for r in $(seq "$rounds"); do
  echo "(2) round $r: the client alone, $rate/s for $secs s ..." >&2
  gateway_start
  client_gen "$tmp/alone.$r.json"
  echo "  refused $(metric 'throttle_connections_refused_total{listener="proxy",reason="per_ip"}')" > "$tmp/alone.$r.gw"
  gateway_stop
  echo "(3) round $r: flood at $offer/s from 127.0.0.2 ($fconns connections) + the client ..." >&2
  gateway_start
  flood_gen "$offer" $((secs + 3)) "$tmp/flood.$r.json" & pids+=($!)
  fl=${pids[-1]}
  sleep 1.5 # the flood's warm-up (its counts start after 1 s)
  client_gen "$tmp/with.$r.json"
  wait "$fl" || { cat "$tmp/flood.$r.json.err" >&2; echo "flood: the flood generator failed" >&2; exit 1; }
  unset 'pids[-1]'
  echo "  refused $(metric 'throttle_connections_refused_total{listener="proxy",reason="per_ip"}')" > "$tmp/with.$r.gw"
  gateway_stop
done

export REPORT_CMD=$cmd REPORT_CAP_WRK=$cap_wrk REPORT_CAP_FLOOD=$cap_flood REPORT_CAPACITY=$capacity \
  REPORT_OFFER=$offer REPORT_FACTOR=$factor REPORT_ROUNDS=$rounds
python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
e = os.environ
rounds = int(e["REPORT_ROUNDS"])
load = lambda n: json.load(open(f"{tmp}/{n}.json"))
cpu = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip()
print(f"### benches/flood.sh: gateway on CPU 0 (one worker), generators and upstream on CPU 1")
print()
print(f"`{e['REPORT_CMD']}` ({cpu})")
print()
if os.path.exists(f"{tmp}/cap.json"):
    print(f"429 capacity (answered 429/s): wrk -t1 -c32 {int(e['REPORT_CAP_WRK']):,}; flood generator, "
          f"{load('cap')['conns']} pipelined connections {int(e['REPORT_CAP_FLOOD']):,}; "
          f"capacity **{int(e['REPORT_CAPACITY']):,}/s**, flood offered at {e['REPORT_FACTOR']}x = **{int(e['REPORT_OFFER']):,}/s**")
else:
    print(f"429 capacity given (CAPACITY): {int(e['REPORT_CAPACITY']):,}/s, flood offered at {e['REPORT_FACTOR']}x = **{int(e['REPORT_OFFER']):,}/s**")
print()
print("| round | run | client sent | ok | success | p50 ms | p99 ms | p99.9 ms | max ms | client send late p99 ms "
      "| flood scheduled/s | written/s | answered/s (429/s) | flood reconnects |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
ok_all, p99s = [], {"alone": [], "with": []}
for r in range(1, rounds + 1):
    for run in ("alone", "with"):
        c = load(f"{run}.{r}")
        lat, late = c["latency_us"], c["send_late_us"]
        succ = c["ok"] / max(c["sent"], 1)
        p99s[run].append(lat["p99"])
        if run == "with":
            ok_all.append(succ)
            f = load(f"flood.{r}"); ps = f["per_sec"]
            fl = f"| {ps['scheduled']:,.0f} | {ps['written']:,.0f} | {ps['answered']:,.0f} ({ps['429']:,.0f}) | {f['reconnects']} |"
        else:
            fl = "| | | | |"
        print(f"| {r} | {'with the flood' if run == 'with' else 'alone'} | {c['sent']:,} | {c['ok']:,} | {succ:.2%} "
              f"| {lat['p50']/1000:.3f} | {lat['p99']/1000:.3f} | {lat['p999']/1000:.3f} | {lat['max']/1000:.3f} "
              f"| {late['p99']/1000:.3f} {fl}")
print()
succ = min(ok_all)
mean = lambda v: sum(v) / len(v)
ratio = mean(p99s["with"]) / mean(p99s["alone"])
per_round = ", ".join(f"{w / a:.2f}" for w, a in zip(p99s["with"], p99s["alone"]))
print(f"- client success rate with the flood (lowest round): **{succ:.2%}** — target >= 99%: "
      + ("**met**" if succ >= 0.99 else "**not met**"))
print(f"- client p99 with the flood / alone (mean of rounds' p99s): **{ratio:.2f}x** (rounds: {per_round}) — target <= 3x: "
      + ("**met**" if ratio <= 3 else "**not met**"))
print("(latency: from each request's due time to the end of its answer; 'send late': how long after its due time the client wrote it)")
PY
