#!/usr/bin/env bash
# Local admission on Redis (leases + the over-limit cache), in one run:
#   (a) Redis round trips per request: clients at half their limits (ip + key + global;
#       default algorithms, then sliding_window everywhere),
#       a client at 100x its limit, and the same half-limit clients with admission = "exact";
#   (b) throughput through one gateway: Redis (auto), Redis (exact) and the memory store,
#       same limits, keys far under them (wrk -t1 -c32);
#   (c) fleet accuracy: 3 gateways on one Redis, clients of every algorithm at 1x, 1.5x and
#       2x their limit: leased (auto) keys, then exact keys on the same schedules;
#   (d) counting by outcome and by bytes (issue 36): Redis round trips per admitted request
#       with leases, plain ip + key limits against the same with `count_on` (answers
#       outside the set: refunds; inside it) and with a route's `cost_from =
#       "response_bytes"`; default algorithms, then fixed windows (whose refunds go back to
#       a lease in hand). Round trips are the gateway's `throttle_store_calls_total`,
#       checked against Redis's own count (`INFO commandstats`: EVALSHA); two reference
#       rows spend what a debt row spends (4 units a request), reserved up front.
#
#   benches/local_admission.sh          (SECS=10 per paced run, DURATION=8s per wrk run;
#                                        PARTS=abcd: which parts to run)
#
# Starts its own redis-server on a free port and release builds of the gateway
# (`throttle demo`: the gateway with its in-process upstream). Needs redis-server,
# redis-cli, wrk, curl, python3. Loopback only; every run is bounded. Run by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-10}"
parts="${PARTS:-abcd}"
duration="${DURATION:-8s}"
for t in redis-server redis-cli wrk curl python3; do
  command -v "$t" >/dev/null || { echo "local_admission: $t is missing"; exit 1; }
done
cargo build --release --quiet
gen=$(cargo bench --bench local_admission --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*local_admission[^"]*\)".*/\1/p' | tail -1)
[ -x "$gen" ] || { echo "local_admission: the load generator did not build"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null 2>&1 & pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" PING >/dev/null 2>&1 && break; sleep 0.05; done
redis_url="redis://127.0.0.1:$rport"

# gateway NAME STORE-TOML LIMITS-TOML: starts `throttle demo`; sets PORT and ADMIN.
gateway() {
  local name=$1 p a
  p=$(free_port); a=$(free_port)
  cat > "$tmp/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
admin_listen = "127.0.0.1:$a"
threads = 1
grace_period_secs = 0
[store]
$2
$3
TOML
  RUST_LOG=error ./target/release/throttle demo --config "$tmp/$name.toml" >"$tmp/$name.log" 2>&1 & pids+=($!)
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$a/readyz" >/dev/null && break; sleep 0.05; done
  curl -sf "http://127.0.0.1:$a/readyz" >/dev/null || { echo "gateway $name did not start:"; cat "$tmp/$name.log"; exit 1; }
  PORT=$p; ADMIN=$a
}
stop_last() { kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; }
redis_store() { printf 'backend = "redis"\nurl = "%s"\ntimeout_ms = 25\nkey_prefix = "%s"\n' "$redis_url" "$1"; }
keys_toml() { # NAME:TIER ...  (ROUTE: more lines for the route)
  printf '\n[[routes]]\nname = "api"\npath_prefix = "/"\nupstreams = ["127.0.0.1:9"]\n%s\n' "${ROUTE:-}"
  for kt in "$@"; do
    printf '\n[[keys]]\nid = "k_%s"\nkey = "%s"\ntenant = "t_%s"\ntier = "%s"\n' "${kt%%:*}" "${kt%%:*}" "${kt%%:*}" "${kt##*:}"
  done
}

# --- (a) round trips per request -----------------------------------------------------
half_limits() { # ADMISSION-LINE KEY-ADMISSION [ALGORITHM]
  local alg="" kalg=""
  if [ -n "${3:-}" ]; then alg="algorithm = \"$3\""; kalg=", algorithm = \"$3\""; fi
  cat <<TOML
[limits.ip]
per_second = 400
per_minute = 24000
$1
$alg
[limits.global]
per_second = 400
$1
$alg
[tiers.half]
key = { per_second = 100, per_minute = 6000 $2 $kalg }
[tiers.over]
key = { per_minute = 60 $2 }
TOML
  keys_toml half1:half half2:half half3:half half4:half over:over
}
half_keys=(--key half1=50 --key half2=50 --key half3=50 --key half4=50)

if [[ $parts == *a* ]]; then
gateway rt-auto "$(redis_store la-rt)" "$(half_limits "" "")"
"$gen" --targets "http://127.0.0.1:$PORT" "${half_keys[@]}" --secs 1 >/dev/null # warm-up
"$gen" --targets "http://127.0.0.1:$PORT" --admins "http://127.0.0.1:$ADMIN" "${half_keys[@]}" --secs "$secs" > "$tmp/a_half.json"
"$gen" --targets "http://127.0.0.1:$PORT" --admins "http://127.0.0.1:$ADMIN" --key over=100 --secs "$secs" > "$tmp/a_over.json"
stop_last
gateway rt-sw "$(redis_store la-rtsw)" "$(half_limits "" "" sliding_window)"
"$gen" --targets "http://127.0.0.1:$PORT" "${half_keys[@]}" --secs 1 >/dev/null
"$gen" --targets "http://127.0.0.1:$PORT" --admins "http://127.0.0.1:$ADMIN" "${half_keys[@]}" --secs "$secs" > "$tmp/a_sw.json"
stop_last
gateway rt-exact "$(redis_store la-rtx)" "$(half_limits 'admission = "exact"' ', admission = "exact"')"
"$gen" --targets "http://127.0.0.1:$PORT" "${half_keys[@]}" --secs 1 >/dev/null
"$gen" --targets "http://127.0.0.1:$PORT" --admins "http://127.0.0.1:$ADMIN" "${half_keys[@]}" --secs "$secs" > "$tmp/a_exact.json"
stop_last
fi

# --- (b) throughput: Redis vs memory, same limits ------------------------------------
far_limits() { # ADMISSION-LINE KEY-ADMISSION (the limits of benches/e2e.sh)
  cat <<TOML
[limits.ip]
per_second = 1000000
per_minute = 100000000
$1
[limits.global]
per_second = 1000000000
$1
[tiers.bench]
key = { per_second = 1000000, per_hour = 1000000000 $2 }
TOML
  keys_toml bench-key:bench
}
wrk_run() { # NAME STORE-TOML ADMISSION KEY-ADMISSION
  gateway "$1" "$2" "$(far_limits "$3" "$4")"
  local before after errors
  before=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | sed -n 's/^throttle_store_calls_total{store="redis"} //p')
  wrk -t1 -c32 -d"$duration" -H 'X-API-Key: bench-key' "http://127.0.0.1:$PORT/bench" > "$tmp/wrk_$1.txt"
  after=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | sed -n 's/^throttle_store_calls_total{store="redis"} //p')
  errors=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | sed -n 's/^throttle_store_errors_total{store="redis"} //p')
  echo "${before:-0} ${after:-0} ${errors:-0}" > "$tmp/wrk_$1.calls"
  stop_last
}
# Two alternating rounds (the order matters a little on a shared VM), then exact.
if [[ $parts == *b* ]]; then
for r in 1 2; do
  wrk_run "memory-$r" 'backend = "memory"' "" ""
  wrk_run "redis-$r" "$(redis_store "la-tp$r")" "" ""
done
wrk_run redis-exact "$(redis_store la-tpx)" 'admission = "exact"' ', admission = "exact"'
fi

# --- (c) fleet accuracy: 3 gateways, every algorithm, 1x-2x --------------------------
algs=(token_bucket leaky_bucket fixed_window sliding_window sliding_log)
fleet_limits() {
  local kt=() a
  for a in "${algs[@]}"; do
    printf '[tiers.a_%s]\nkey = { per_second = 50, algorithm = "%s" }\n' "$a" "$a"
    printf '[tiers.x_%s]\nkey = { per_second = 50, algorithm = "%s", admission = "exact" }\n' "$a" "$a"
    for f in 1.0 1.5 2.0; do kt+=("$a-auto-$f:a_$a" "$a-exact-$f:x_$a"); done
  done
  keys_toml "${kt[@]}"
}
if [[ $parts == *c* ]]; then
targets=(); admins=()
# Fail closed with a roomier deadline: a store error is a 503 here (counted as "other"),
# never a request admitted by the local fallback.
fleet_store="$(redis_store la-fleet | sed 's/timeout_ms = 25/timeout_ms = 100/')
on_failure = \"closed\""
for i in 1 2 3; do
  gateway "fleet$i" "$fleet_store" "$(fleet_limits)"
  targets+=("http://127.0.0.1:$PORT"); admins+=("http://127.0.0.1:$ADMIN")
done
# Leased keys, then exact keys with the same schedules (one run each, so the load
# generator keeps its pace on a small machine).
for mode in auto exact; do
  fleet_keys=()
  for a in "${algs[@]}"; do
    for f in 1.0 1.5 2.0; do
      fleet_keys+=(--key "$a-$mode-$f=$(python3 -c "print(50*$f)")")
    done
  done
  "$gen" --targets "$(IFS=,; echo "${targets[*]}")" --admins "$(IFS=,; echo "${admins[*]}")" "${fleet_keys[@]}" --secs "$secs" > "$tmp/c_$mode.json"
done
fi

# --- (d) counting by outcome and by bytes: round trips per admitted request ----------
# ip (1 s + 1 min) and key (1 s + 1 min) tables, the 4 keys of (a) at 50/s each, far under
# every limit (a cost_from request spends several units). IP-LINES go into [limits.ip],
# KEY-FIELDS into the tier's key table, ROUTE-LINES into the route.
outcome_limits() { # IP-LINES KEY-FIELDS
  cat <<TOML
[limits.ip]
per_second = 4000
per_minute = 240000
$1
[tiers.half]
key = { per_second = 1000, per_minute = 60000 $2 }
TOML
  keys_toml half1:half half2:half half3:half half4:half
}
settled() { # the gateway's settled tokens: "CHARGED REFUNDED"
  curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '
    $1 == "throttle_cost_settled_total{direction=\"charge\"}" { c = $2 }
    $1 == "throttle_cost_settled_total{direction=\"refund\"}" { r = $2 }
    END { print c + 0, r + 0 }'
}
evalsha() { # EVALSHA calls Redis served since its last CONFIG RESETSTAT
  redis-cli -p "$rport" INFO commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p' | tr -d '\r'
}
outcome_run() { # NAME PATH IP-LINES KEY-FIELDS [ROUTE-LINES]
  local base="http://127.0.0.1"
  gateway "d-$1" "$(redis_store "la-d-$1")" "$(ROUTE=${5:-} outcome_limits "$3" "$4")"
  "$gen" --targets "$base:$PORT" "${half_keys[@]}" --path "$2" --secs 1 >/dev/null # warm-up
  redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
  local before; before=$(settled)
  "$gen" --targets "$base:$PORT" --admins "$base:$ADMIN" "${half_keys[@]}" --path "$2" \
    --secs "$secs" > "$tmp/d_$1.json"
  echo "$(evalsha) $before $(settled)" > "$tmp/d_$1.redis"
  stop_last
}
if [[ $parts == *d* ]]; then
count_on='count_on = ["401"]'
fixed='algorithm = "fixed_window"'
# The demo upstream's answer to these requests has a body of about 400 bytes (4 or 5
# units of 100): a reserve of 1 unit settles a debt; a reserve of 20 units, a refund.
debt=$'cost = 1\ncost_from = "response_bytes"\ncost_unit_bytes = 100'
refund=$'cost = 20\ncost_from = "response_bytes"\ncost_unit_bytes = 100'
outcome_run plain /bench "" ""
outcome_run refund /bench "$count_on" ", $count_on"
outcome_run counted '/bench?status=401' "$count_on" ", $count_on"
outcome_run debt /bench "" "" "$debt"
outcome_run bytesback /bench "" "" "$refund"
outcome_run fplain /bench "$fixed" ", $fixed"
outcome_run frefund /bench "$fixed
$count_on" ", $fixed, $count_on"
outcome_run fdebt /bench "$fixed" ", $fixed" "$debt"
outcome_run fbytesback /bench "$fixed" ", $fixed" "$refund"
# References: what the debt rows spend (4 units a request), reserved up front.
outcome_run cost4 /bench "" "" "cost = 4"
outcome_run fcost4 /bench "$fixed" ", $fixed" "cost = 4"
fi

# --- the table -----------------------------------------------------------------------
python3 - "$tmp" "$secs" "$duration" <<'PY'
import json, os, re, sys
tmp, secs, duration = sys.argv[1], float(sys.argv[2]), sys.argv[3]
load = lambda n: json.load(open(f"{tmp}/{n}.json"))
have = lambda n: os.path.exists(f"{tmp}/{n}")

def part_a():
    print(f"(a) Redis round trips per request (one gateway, single node, {secs:.0f} s per run)")
    print("| clients | requests | admitted | round trips | per request | target |")
    print("|---|---|---|---|---|---|")
    for name, label, target in [("a_half", "4 keys at half their limits (ip 2 + key 2 + global 1 windows), admission = auto", "<= 0.1"),
                                ("a_sw", "the same with algorithm = \"sliding_window\" in every scope", "<= 0.1"),
                                ("a_exact", "the same (default algorithms), admission = \"exact\"", "1.0")]:
        r = load(name); req = sum(k["sent"] for k in r["keys"].values()); ok = sum(k["ok"] for k in r["keys"].values())
        rt = r["gateways"]["round_trips"]
        print(f"| {label} | {req:,} | {ok:,} | {rt:,.0f} | **{rt/req:.3f}** | {target} |")
    r = load("a_over"); k = r["keys"]["over"]; g = r["gateways"]; rt = g["round_trips"]
    redis_429 = k["limited"] - g["over_limit_cache"]
    print(f"| 1 key at 100x its limit (60/min token bucket, retry_after <= 1 s) | {k['sent']:,} | {k['ok']:,} | {rt:,.0f} | **{rt/k['sent']:.3f}** | |")
    print(f"\n100x client: {k['limited']:,} x 429, {g['over_limit_cache']:,.0f} of them from the over-limit cache; "
          f"{redis_429:,.0f} decided by Redis in {r['elapsed_secs']:.1f} s = **{redis_429/r['elapsed_secs']:.2f} per second**, "
          f"i.e. per retry_after (target <= 1); {g['leased']:,.0f} admitted on leases.")

def wrk(name):
    w = open(f"{tmp}/wrk_{name}.txt").read()
    rps = float(re.search(r"Requests/sec:\s*([\d.]+)", w).group(1))
    lat = re.search(r"Latency\s+(\S+)", w).group(1)
    total = int(re.search(r"(\d+) requests in", w).group(1))
    b, a, err = (float(x) for x in open(f"{tmp}/wrk_{name}.calls").read().split())
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", w)
    return rps, lat, (a - b) / total, int(non2xx.group(1)) if non2xx else 0, err

def part_b():
    print(f"\n(b) Throughput through one gateway (wrk -t1 -c32 -d{duration}, ip 2 + key 2 + global 1 windows, far under the limits; two alternating rounds)")
    print("| store | requests/s (round 1, round 2) | mean latency | round trips per request | vs memory |")
    print("|---|---|---|---|---|")
    mem = [wrk("memory-1"), wrk("memory-2")]
    red = [wrk("redis-1"), wrk("redis-2")]
    exa = [wrk("redis-exact")]
    m = sum(x[0] for x in mem) / 2
    for label, runs in [("memory", mem), ("Redis, admission = auto (leases)", red), ("Redis, admission = \"exact\"", exa)]:
        mean = sum(x[0] for x in runs) / len(runs)
        rt = "" if runs is mem else f"{sum(x[2] for x in runs)/len(runs):.4f}"
        bad = sum(x[3] for x in runs)
        err = sum(x[4] for x in runs)
        print(f"| {label} | **{mean:,.0f}** ({', '.join(f'{x[0]:,.0f}' for x in runs)}) | {runs[0][1]} | {rt} | **{mean/m:.2f}x** |"
              + (f" non-2xx: {bad}" if bad else "") + (f" {err:.0f} store calls failed or missed the deadline (the fallback decided)" if err else ""))

L = 50
def bound(a, k):
    # Decisions fall between the first request sent and the last answer received.
    first, last = k["first_ms"] / 1000, k["done_ms"] / 1000
    span = last - first
    if a in ("token_bucket", "leaky_bucket"):
        return int(L + L * span + 0.999)
    return L * (int(last) - int(first) + 1)

def part_c():
    auto, exact = load("c_auto"), load("c_exact")
    print(f"\n(c) Fleet accuracy: 3 gateways, one Redis, every key limited to {L}/s, {secs:.0f} s of traffic per key")
    print("    spread round-robin over the gateways; leased keys first, then exact keys on the same schedules.")
    print("    'allowed' is the most the algorithm lets through over the run (per-second windows touched x limit;")
    print("    buckets: capacity + refill over the run); per window = admitted / seconds of traffic.")
    print("| algorithm | client | offered | allowed at most | exact: admitted (per window) | leased: admitted (per window) | over it (leased / exact) | early rejections (exact - leased) |")
    print("|---|---|---|---|---|---|---|---|")
    for a in ["token_bucket", "leaky_bucket", "fixed_window", "sliding_window", "sliding_log"]:
        for f in ["1.0", "1.5", "2.0"]:
            au, ex = auto["keys"][f"{a}-auto-{f}"], exact["keys"][f"{a}-exact-{f}"]
            per = lambda k: k["ok"] / max((k["last_ms"] - k["first_ms"]) / 1000, 1e-9)
            over = f"{max(au['ok'] - bound(a, au), 0)} / {max(ex['ok'] - bound(a, ex), 0)}"
            diff = ex["ok"] - au["ok"]
            bad = lambda k: k["other"] + k.get("failed", 0)  # another status, or no answer
            other = "" if bad(au) + bad(ex) == 0 else f" (other statuses or no answer: {bad(au)}/{bad(ex)})"
            print(f"| {a} | {f}x | {au['sent']:,} | {bound(a, au):,} | {ex['ok']:,} ({per(ex)/L:.2f}x limit) | {au['ok']:,} ({per(au)/L:.2f}x limit) | {over} | {diff:+d} ({diff/max(ex['ok'],1)*100:+.1f}%){other} |")
    for name, r in [("leased", auto), ("exact", exact)]:
        g = r["gateways"]; tot = sum(k["sent"] for k in r["keys"].values())
        print(f"{name} run: {tot:,} requests in {r['elapsed_secs']:.1f} s, {g['round_trips']:,.0f} round trips ({g['round_trips']/tot:.3f} per request), "
              f"{g['leased']:,.0f} admitted on leases, {g['over_limit_cache']:,.0f} rejected by the over-limit cache, {g['tokens_returned']:,.0f} leased tokens returned, "
              f"{g['store_errors']:,.0f} store errors")

def part_d():
    print(f"\n(d) Counting by outcome and by bytes: Redis round trips per admitted request (one gateway, leases, "
          f"4 keys at 50/s, {secs:.0f} s per run; ip 1 s + 1 min and key 1 s + 1 min tables far under their limits)")
    print("Target: the plain row of the same algorithms + 0.01 (the plain rows' own run-to-run spread). "
          "'Calls besides checks' = round trips - requests Redis decided (settles, returns, flushes).")
    print("| config | upstream answer | admitted | settled per request (charged / refunded tokens) | round trips (gateway) "
          "| per admitted request | EVALSHA (Redis) per admitted request | admitted on leases | calls besides checks "
          "| target: <= plain + 0.01 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = [("plain", "plain ip + key limits", "200", None),
            ("refund", "the same, `count_on = [\"401\"]` on both tables", "200 (outside the set: refunded)", "plain"),
            ("counted", "the same, `count_on = [\"401\"]` on both tables", "401 (in the set: counted)", "plain"),
            ("debt", "plain + route `cost_from = \"response_bytes\"`, `cost = 1`, `cost_unit_bytes = 100`", "200 (settles above the reserve)", "plain"),
            ("bytesback", "plain + route `cost_from = \"response_bytes\"`, `cost = 20`, `cost_unit_bytes = 100`", "200 (settles below the reserve)", "plain"),
            ("fplain", "plain, `algorithm = \"fixed_window\"` on both tables", "200", None),
            ("frefund", "fixed windows + `count_on = [\"401\"]`", "200 (refunded)", "fplain"),
            ("fdebt", "fixed windows + `cost_from`, `cost = 1`", "200 (settles above)", "fplain"),
            ("fbytesback", "fixed windows + `cost_from`, `cost = 20`", "200 (settles below)", "fplain"),
            ("cost4", "reference: plain + route `cost = 4` (a debt row's spending, reserved up front)", "200", None),
            ("fcost4", "reference: fixed windows + route `cost = 4`", "200", None)]
    per = {}
    for name, label, answer, ref in rows:
        if not have(f"d_{name}.json"):
            continue
        r = load(f"d_{name}"); g = r["gateways"]; ks = r["keys"].values()
        admitted = sum(k["ok"] + k["other"] for k in ks)
        bad = sum(k["limited"] + k["failed"] for k in ks)
        ev, c0, r0, c1, r1 = (float(x) for x in open(f"{tmp}/d_{name}.redis").read().split())
        sent = sum(k["sent"] for k in ks)
        per[name] = g["round_trips"] / max(admitted, 1)
        verdict = ""
        if ref in per:
            verdict = f"{per[name]:.3f} vs {per[ref]:.3f}: " + ("**met**" if per[name] <= per[ref] + 0.01 else "**not met**")
        note = f" ({bad} of {sent} limited or unanswered)" if bad else ""
        decided = sent - g["leased"] - g["over_limit_cache"]
        print(f"| {label} | {answer}{note} | {admitted:,} | {(c1 - c0) / max(admitted, 1):.2f} / {(r1 - r0) / max(admitted, 1):.2f} "
              f"| {g['round_trips']:,.0f} | **{per[name]:.3f}** | {ev / max(admitted, 1):.3f} | {g['leased']:,.0f} "
              f"| {g['round_trips'] - decided:,.0f} | {verdict} |")

if have("a_half.json"): part_a()
if have("wrk_memory-1.txt"): part_b()
if have("c_auto.json"): part_c()
if have("d_plain.json"): part_d()
PY
