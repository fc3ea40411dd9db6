#!/usr/bin/env bash
# Issue 37's benchmark: what `fleet = "regions"` costs a request, against the same limits
# kept by a single region (no `[regions]`).
#
#   (a) Redis round trips per admitted request, paced: 4 keys at 50/s through region 1's
#       gateway (a key table of 1000/s + 60,000/min, fixed windows, admission auto: leases),
#       three regions on one machine (a redis-server and a `throttle demo` each, peers
#       reached directly), then the same keys and limits on one region alone. Round trips
#       are region 1's `throttle_store_calls_total{store="redis"}` (the request path: the
#       sync loop's calls are not counted there).
#   (b) Instructions and allocations per request under callgrind, region 1's gateway with
#       `fleet = "regions"` (its sync loop running against the other two regions) and the
#       single-region gateway: N1 then N2 requests of one key on one keep-alive connection
#       (benches/drive.py), per request = (count(N2) - count(N1)) / (N2 - N1), the whole
#       process counted (the sync loop included).
#
#   benches/regions.sh      (SECS=10 paced seconds; CG_N1=500, CG_N2=1500; PARTS=ab)
#
# Targets (issue 37): instructions within 10% of the single region's, and no extra round
# trip on the request path under leases. Needs redis-server, redis-cli, valgrind, taskset,
# curl, python3. Loopback only; every process it starts is stopped at exit. Run by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-10}"; parts="${PARTS:-ab}"
n1="${CG_N1:-500}"; n2="${CG_N2:-1500}"
for t in redis-server redis-cli valgrind taskset curl python3; do
  command -v "$t" >/dev/null || { echo "regions: $t is missing"; exit 1; }
done
cargo build --release --quiet
bin=./target/release/throttle
gen=$(cargo bench --bench local_admission --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*local_admission[^"]*\)".*/\1/p' | tail -1)
[ -x "$gen" ] || { echo "regions: the load generator did not build"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rports=()
for i in 1 2 3; do
  p=$(free_port); rports+=("$p")
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null 2>&1 & pids+=($!)
done
for p in "${rports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" PING >/dev/null 2>&1 && break; sleep 0.05; done
done
names=(r1 r2 r3)

limits() { # FLEET-FIELD
  cat <<TOML
[tiers.half]
key = { per_second = 1000, per_minute = 60000, algorithm = "fixed_window" $1 }
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:9"]
TOML
  for k in half1 half2 half3 half4 bench; do
    printf '\n[[keys]]\nid = "k_%s"\nkey = "%s"\ntenant = "t_%s"\ntier = "half"\n' "$k" "$k" "$k"
  done
}
# config NAME REGION(1-3 or 0: alone) PREFIX -> $tmp/NAME.toml; sets PORT ADMIN
config() {
  local name=$1 r=$2 prefix=$3 p a regions="" fleet=""
  p=$(free_port); a=$(free_port)
  if [ "$r" != 0 ]; then
    local peers=() j
    for j in 1 2 3; do
      [ "$j" = "$r" ] || peers+=("${names[j-1]} = \"redis://127.0.0.1:${rports[j-1]}\"")
    done
    regions="[regions]
name = \"${names[r-1]}\"
peers = { $(IFS=,; echo "${peers[*]}") }"
    fleet=', fleet = "regions"'
  fi
  local rp=${rports[$(( r == 0 ? 0 : r - 1 ))]}
  cat > "$tmp/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
admin_listen = "127.0.0.1:$a"
threads = 1
grace_period_secs = 0
[store]
backend = "redis"
url = "redis://127.0.0.1:$rp"
timeout_ms = 25
key_prefix = "$prefix"
$regions
$(limits "$fleet")
TOML
  PORT=$p; ADMIN=$a
}
start() { # NAME [WRAPPER...]: starts throttle demo on $tmp/NAME.toml
  local name=$1; shift
  RUST_LOG=error "$@" "$bin" demo --config "$tmp/$name.toml" >"$tmp/$name.log" 2>&1 & pids+=($!)
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null && break; sleep 0.1; done
  curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null || { echo "gateway $name did not start:"; cat "$tmp/$name.log"; exit 1; }
}
half_keys=(--key half1=50 --key half2=50 --key half3=50 --key half4=50)

# --- (a) round trips per admitted request ---------------------------------------------
if [[ $parts == *a* ]]; then
  for setup in regions alone; do
    admins=()
    if [ "$setup" = regions ]; then
      for r in 3 2 1; do config "a-$setup-$r" "$r" "rt-$setup"; start "a-$setup-$r"; admins+=("$ADMIN"); done
    else
      config "a-alone" 0 "rt-alone"; start "a-alone"; admins+=("$ADMIN")
    fi
    # Region 1's gateway is the last started: PORT and ADMIN are its.
    "$gen" --targets "http://127.0.0.1:$PORT" "${half_keys[@]}" --secs 1 >/dev/null # warm-up
    "$gen" --targets "http://127.0.0.1:$PORT" --admins "http://127.0.0.1:$ADMIN" "${half_keys[@]}" \
      --secs "$secs" > "$tmp/a_$setup.json"
    for _ in "${admins[@]}"; do kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; done
  done
fi

# --- (b) instructions per request under callgrind -------------------------------------
cg() { # SETUP N -> "IR ALLOCS"
  local setup=$1 n=$2 out="$tmp/cg.$1.$2" others=()
  local name="b-$setup-$n"
  if [ "$setup" = regions ]; then
    for r in 3 2; do config "$name-$r" "$r" "cg-$setup-$n"; start "$name-$r"; others+=("${pids[-1]}"); done
    name="$name-1"; config "$name" 1 "cg-$setup-$n"
  else
    config "$name" 0 "cg-$setup-$n"
  fi
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out" --log-file="$out.log" \
    "$bin" demo --config "$tmp/$name.toml" >"$tmp/$name.out" 2>"$tmp/$name.log" & local pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null && break; sleep 0.2; done
  curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null || { echo "regions: $name did not start" >&2; cat "$tmp/$name.log" >&2; }
  python3 benches/drive.py 127.0.0.1 "$PORT" "$n" /x "X-API-Key: bench" 200 >&2
  kill -TERM "$pid"; wait "$pid" || true
  for p in "${others[@]:-}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }; done
  python3 benches/cgcount.py "$out"
}
if [[ $parts == *b* ]]; then
  for setup in alone regions; do
    for n in "$n1" "$n2"; do
      read -r ir al < <(cg "$setup" "$n")
      echo "$setup $n $ir $al" >> "$tmp/cg"
      printf '  %-7s N=%-5s Ir %s  allocs %s\n' "$setup" "$n" "$ir" "$al" >&2
    done
  done
fi

python3 - "$tmp" "$secs" "$n1" "$n2" "$parts" <<'PY'
import json, os, sys
tmp, secs, n1, n2, parts = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if "a" in parts:
    print(f"(a) Redis round trips per admitted request, region 1's gateway, 4 keys at 50/s, {secs:.0f} s, leases on")
    print("| fleet | requests | admitted | request-path round trips | per admitted request |")
    print("|---|---|---|---|---|")
    per = {}
    for setup, label in [("alone", "one region (no [regions])"), ("regions", "fleet = \"regions\", 3 regions")]:
        r = json.load(open(f"{tmp}/a_{setup}.json"))
        req = sum(k["sent"] for k in r["keys"].values()); ok = sum(k["ok"] for k in r["keys"].values())
        rt = r["gateways"]["round_trips"]
        per[setup] = rt / max(ok, 1)
        print(f"| {label} | {req:,} | {ok:,} | {rt:,.0f} | **{per[setup]:.3f}** |")
    extra = per["regions"] - per["alone"]
    verdict = "**met**" if extra <= 0.01 else "**not met**"
    print(f"\nextra round trips per admitted request with fleet = \"regions\": {extra:+.3f} (target: none, <= +0.01): {verdict}")
if "b" in parts:
    c = {}
    for line in open(f"{tmp}/cg"):
        setup, n, ir, al = line.split()
        c[(setup, int(n))] = (int(ir), int(al))
    d = n2 - n1
    per = lambda s, i: (c[(s, n2)][i] - c[(s, n1)][i]) / d
    print(f"\n(b) Instructions and allocations per request under callgrind ({n2} - {n1} requests, one keep-alive connection, the whole process)")
    print("| fleet | instructions/request | allocations/request |")
    print("|---|---|---|")
    for setup, label in [("alone", "one region"), ("regions", "fleet = \"regions\", 3 regions (sync loop running)")]:
        print(f"| {label} | **{per(setup, 0):,.0f}** | {per(setup, 1):.2f} |")
    ratio = per("regions", 0) / per("alone", 0)
    verdict = "**met**" if ratio <= 1.10 else "**not met**"
    print(f"\nregions / one region: instructions **{ratio:.4f}** (target <= 1.10): {verdict}")
PY
