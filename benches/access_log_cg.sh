#!/bin/bash
# Instructions per request with the access log off vs on, under callgrind (see README "Benchmarks").
# Needs an HTTP/1.1 keep-alive upstream on 127.0.0.1:18999 (e.g. a 200 "ok" server) and
# a release build. Usage: benches/access_log_cg.sh off|on N  -> prints "IR ALLOCS";
# per request = (count(N2) - count(N1)) / (N2 - N1).
# run.sh MODE N  -> prints Ir allocs
mode=$1; n=$2; d=${CG_DIR:-/tmp/alogcg}; mkdir -p $d; B=/work/wt-alog/target/release/throttle
P=$((20000 + RANDOM % 10000)); A=$((P+1))
log=off; [ "$mode" = on ] && log="$d/access.$n.log"
cat > $d/gw.$mode.$n.toml <<T
[server]
listen = "127.0.0.1:$P"
admin_listen = "127.0.0.1:$A"
threads = 1
grace_period_secs = 0
access_log = "$log"
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:18999"]
auth = "none"
T
out=$d/cg.$mode.$n
taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=$out --log-file=$out.log $B run --config $d/gw.$mode.$n.toml 2>$d/gw.$mode.$n.err &
pid=$!
for i in $(seq 600); do curl -sf http://127.0.0.1:$A/readyz >/dev/null && break; sleep 0.2; done
python3 /work/wt-alog/benches/drive.py 127.0.0.1 $P $n /x "" 200 >&2
kill -TERM $pid; wait $pid
python3 /work/wt-alog/benches/cgcount.py $out
