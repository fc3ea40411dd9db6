#!/usr/bin/env bash
# Issue 36's instruction target: counting by outcome (`count_on`) and by bytes
# (`cost_from`) cost no more than 2% instructions per request when a config uses neither.
# Callgrind instructions and allocations per proxied request of two release builds of the
# gateway, the tree before those features and this one, on the same config (the one of
# benches/observability_cg.sh, MODE off: `[limits.ip]`, one route, access log and tracing
# off), which this script runs for each build:
#
#   BASE=/path/to/old/throttle benches/outcomes_cg.sh
#     NEW (default target/release/throttle), CG_N1=500, CG_N2=1500 requests, ROUNDS=2
#
# Per request = (count after N2 requests - count after N1) / (N2 - N1) on one keep-alive
# connection, so start-up and shutdown cancel. Each round runs BASE then NEW at N1 and N2
# (alternating, so a change in the machine's load shows as a change between rounds);
# the ratio is of the means over the rounds. Needs what observability_cg.sh needs
# (valgrind, taskset, curl, python3). Loopback only; every process it starts is stopped
# by observability_cg.sh. Builds nothing: build BASE in its own worktree and target dir,
# e.g. `git worktree add ../before <commit>` and `CARGO_TARGET_DIR=../before/target cargo
# build --release` there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here")
base=${BASE:?BASE=the release throttle of the tree before count_on and cost_from}
new=${NEW:-$root/target/release/throttle}
n1=${CG_N1:-500}; n2=${CG_N2:-1500}; rounds=${ROUNDS:-2}
for b in "$base" "$new"; do [ -x "$b" ] || { echo "outcomes_cg: no binary at $b" >&2; exit 1; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for r in $(seq "$rounds"); do
  for side in base new; do
    if [ "$side" = base ]; then b=$base; else b=$new; fi
    for n in "$n1" "$n2"; do
      ir=; al=
      read -r ir al < <(B=$b CG_DIR="$tmp/cg.$side.$r" "$here/observability_cg.sh" off "$n" 2>"$tmp/err")
      [ -n "${al:-}" ] || { cat "$tmp/err" >&2; echo "outcomes_cg: $side at N=$n failed" >&2; exit 1; }
      echo "$side $r $n $ir $al" >> "$tmp/counts"
      printf '  round %s  %-4s N=%-5s Ir %s  allocs %s\n' "$r" "$side" "$n" "$ir" "$al" >&2
    done
  done
done

python3 - "$tmp/counts" "$n1" "$n2" "$base" "$new" <<'PY'
import sys
counts, n1, n2, base, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
c = {}
for line in open(counts):
    side, r, n, ir, al = line.split()
    c[(side, int(r), int(n))] = (int(ir), int(al))
rounds = sorted({r for _, r, _ in c})
d = n2 - n1
per = lambda side, r, i: (c[(side, r, n2)][i] - c[(side, r, n1)][i]) / d
mean = lambda side, i: sum(per(side, r, i) for r in rounds) / len(rounds)
print(f"Instructions and allocations per request under callgrind ({n2} - {n1} requests, one keep-alive connection, "
      f"benches/observability_cg.sh off)")
print(f"before: {base}\nthis tree: {new}")
print("| build | instructions/request, per round | **mean** | allocations/request, per round | **mean** |")
print("|---|---|---|---|---|")
for side, label in [("base", "before count_on / cost_from"), ("new", "this tree")]:
    irs = ", ".join(f"{per(side, r, 0):,.0f}" for r in rounds)
    als = ", ".join(f"{per(side, r, 1):.2f}" for r in rounds)
    print(f"| {label} | {irs} | **{mean(side, 0):,.0f}** | {als} | **{mean(side, 1):.2f}** |")
ratio = mean("new", 0) / mean("base", 0)
each = ", ".join(f"{per('new', r, 0) / per('base', r, 0):.4f}" for r in rounds)
verdict = "**met**" if ratio <= 1.02 else "**not met**"
print(f"\nthis tree / before: instructions **{ratio:.4f}** ({(ratio - 1) * 100:+.2f}%; per round {each}), "
      f"{mean('new', 0) - mean('base', 0):+,.0f} a request; allocations {mean('new', 1) - mean('base', 1):+.2f} a request. "
      f"Target <= 1.02: {verdict}")
PY
