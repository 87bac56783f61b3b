#!/bin/bash
# tests/rdma/bench-in-vm.sh BUILD_DIR - runs INSIDE the soft-RoCE guest:
#
#   contrib/softroce/vm-run.sh --timeout 900 -- \
#       /work/main/tests/rdma/bench-in-vm.sh /work/main/build-rb > /tmp/rb.out
#
# In one run, on rxe0 (10.77.0.1): the perftest references (ib_write_bw at
# 32 B, 4 KiB, 64 KiB, 1 MiB; ib_write_lat and ib_send_lat -e (the
# receiver sleeping on completion events) at 32 B, server and client both
# on 10.77.0.1, like tests/rdma/perftest.sh), then `flowbench remote` with
# two moverd daemons over RDMA and then over TCP on the same address:
# throughput for 32 B, 256 B, 4 KiB, 64 KiB and 1 MiB records with 1 flow,
# 4 flows for 32 B and 64 KiB, and one-way latency of 32 B records (paced,
# sparse and ping-pong; then again with --poll-us 10000 --spin, with
# --idle spin, with movers and clients yielding, and with clients
# yielding).  Prints every
# figure and one machine-readable line per
# measurement:
#
#   PERFTEST tool=ib_write_bw size=65536 msg_s=... MB_s=... (MB = 1e6 B)
#   PERFTEST tool=ib_write_lat size=32 typical_us=... avg_us=... p99_us=...
#   BENCH kind=tput transport=rdma size=65536 flows=1 rec_s=... MB_s=... ...
#   BENCH kind=lat transport=rdma size=32 run=paced rate=... p50_us=... ...
#   BENCH kind=pingpong transport=rdma size=32 one_way_p50_us=... ...
#
# contrib/plot-bench.py reads these lines.  Everything in the guest is
# emulated (TCG): compare flowmover with perftest from the same run, as
# ratios, never with absolute figures from elsewhere.
#
# Environment (inside the guest: pass it as `vm-run.sh -- env FB_LAT_ONLY=1
# .../bench-in-vm.sh ...`; the guest does not inherit the host's): FB_SECONDS (measured s per throughput case, default 2),
# FB_WARMUP (default 0.5), FB_LAT_SECONDS (default 2), PERFTEST_DURATION
# (ib_write_bw -D, default 2), PERFTEST_LAT_ITERS (default 1000),
# FB_TRANSPORTS (default "rdma tcp"), FB_LAT_ONLY (1: the latency runs
# only, no throughput), FB_LOG_LEVEL (moverd --log-level, default warn;
# debug to diagnose: logs are printed when a case fails).
set -uo pipefail

build=${1:?usage: bench-in-vm.sh BUILD_DIR}
DEV=${RDMA_DEV:-rxe0}
ADDR=${FM_RDMA_ADDR:-10.77.0.1}
SECS=${FB_SECONDS:-2}
WARM=${FB_WARMUP:-0.5}
LATSECS=${FB_LAT_SECONDS:-2}
DURATION=${PERFTEST_DURATION:-2}
LAT_ITERS=${PERFTEST_LAT_ITERS:-1000}
TRANSPORTS=${FB_TRANSPORTS:-rdma tcp}
LAT_ONLY=${FB_LAT_ONLY:-0}
PORT=18700
STEP_TIMEOUT=120
PY=/usr/bin/python3
FB=$build/tests/bench/flowbench
FAILED=0

ulimit -l unlimited
WORK=$(mktemp -d /tmp/fm-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

log() { echo "bench-in-vm: [$SECONDS s] $*"; }
fail() { echo "bench-in-vm: FAIL: $*" >&2; FAILED=1; }

# ---- machine -----------------------------------------------------------------
[ -x "$FB" ] || { echo "bench-in-vm: no $FB (build it first)" >&2; exit 2; }
[ -d "/sys/class/infiniband/$DEV" ] ||
    { echo "SKIPPED: no RDMA device $DEV (run this inside contrib/softroce/vm-run.sh)" >&2; exit 77; }
log "guest: kernel $(uname -r), $(nproc) cpus ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), $(awk '/MemTotal/ { printf "%.0f MiB", $2 / 1024 }' /proc/meminfo)"
log "$DEV: $(ibv_devinfo -d "$DEV" 2>&1 | grep -E 'state:|active_mtu:|link_layer:' | awk '{ $1 = $1; print }' | paste -sd ';')"
# the source tree of this build, and its commit (or .rev of a snapshot)
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
if [ -f "$src/.rev" ]; then
    rev="$(cut -c1-12 "$src/.rev") (snapshot)"
else
    rev=$(git -C "$src" describe --always --dirty 2>/dev/null || echo '?')
fi
log "build: $build, source ${src:-?} at $rev"

# ---- perftest ----------------------------------------------------------------
# shellcheck source=tests/rdma/perftest-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/perftest-lib.sh"   # run_pair, result_line

# bw columns: #bytes #iterations BW-peak BW-average MsgRate[Mpps]; perftest's
# MB/sec is MiB/s, so MB_s here is computed from the message rate (1e6 B).
# 1 MiB: -D gives 0 iterations under TCG (128 messages in flight take
# longer than the run), so a fixed count with a shallower queue.
bw_test() {
    local size=$1 line mode=(-D "$DURATION")
    [ "$size" -ge 1048576 ] && mode=(-n 40 -t 16)
    run_pair ib_write_bw "$size" "${mode[@]}" || return 0
    line=$(result_line "$size")
    [ -n "$line" ] || { fail "no result from ib_write_bw -s $size"; cat "$WORK/client"; return 0; }
    echo "  $line"
    echo "$line" | awk '{ printf "PERFTEST tool=ib_write_bw size=%s iters=%s msg_s=%.0f MB_s=%.3f perftest_MiB_s=%s\n", $1, $2, $5 * 1e6, $5 * $1, $4 }'
}

# lat columns: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9
# lat_test TOOL SIZE [ARGS...]; the tool's name in PERFTEST lines gets
# the args appended ("ib_send_lat-e": sleeping on completion events)
lat_test() {
    local tool=$1 size=$2 line name
    shift 2
    name=$tool$(printf '%s' "$@")
    run_pair "$tool" "$size" -n "$LAT_ITERS" "$@" || return 0
    line=$(result_line "$size")
    [ -n "$line" ] || { fail "no result from $tool -s $size $*"; cat "$WORK/client"; return 0; }
    echo "  $tool $* $line"
    echo "$line" | awk -v t="$name" '{ printf "PERFTEST tool=%s size=%s iters=%s min_us=%s typical_us=%s avg_us=%s p99_us=%s p999_us=%s\n", t, $1, $2, $3, $5, $6, $8, $9 }'
}

if [ "${PERFTEST:-1}" = 0 ]; then log "perftest: skipped (PERFTEST=0)"; else
log "perftest: ib_write_bw -D $DURATION, ib_write_lat -n $LAT_ITERS, server and client on $ADDR"
echo "  #bytes #iterations BW_peak[MiB/s] BW_avg[MiB/s] MsgRate[Mpps]"
for size in 32 4096 65536 1048576; do bw_test "$size"; done
echo "  #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (us)"
lat_test ib_write_lat 32       # both sides spin on memory
lat_test ib_send_lat 32 -e     # the receiver sleeps on completion events
fi

# ---- flowbench remote ------------------------------------------------------
# bench_lines FILE TRANSPORT TAG: BENCH lines from one flowbench --json output.
bench_lines() {
    "$PY" - "$1" "$2" "$3" <<'EOF'
import json, sys
path, tp, tag = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.load(open(path))
except Exception as e:
    print(f"bench-in-vm: cannot parse {path}: {e}", file=sys.stderr)
    sys.exit(1)
for c in d.get("throughput", []):
    if not c.get("ok"):
        print(f"BENCH kind=tput transport={tp} size={c['size']} flows={c['flows']} ok=0")
        continue
    ld = c["loaded_latency_ns"]
    print(f"BENCH kind=tput transport={tp} flow_transport={c.get('flow_transport','?')} "
          f"size={c['size']} flows={c['flows']} ring={c['ring']} "
          f"rec_s={c['records_per_s']:.0f} MB_s={c['gb_per_s'] * 1e3:.3f} "
          f"secs={c['seconds']:.3f} records={c['records']} "
          f"cpu_a={c['moverd_cpu']['a'] * 100:.0f} cpu_b={c['moverd_cpu']['b'] * 100:.0f} "
          f"loaded_p50_us={ld['p50'] / 1e3:.1f} loaded_p99_us={ld['p99'] / 1e3:.1f} ok=1")
for r in d.get("latency", []):
    if not r.get("ok"):
        print(f"BENCH kind=lat transport={tp} size={r['size']} run={r['run']} ok=0")
        continue
    l = r["one_way_ns"]
    print(f"BENCH kind=lat transport={tp} flow_transport={r.get('flow_transport','?')} "
          f"variant={tag} size={r['size']} run={r['run']} rate={r['records_per_s']:.0f} "
          f"samples={l['samples']} p50_us={l['p50'] / 1e3:.1f} p90_us={l['p90'] / 1e3:.1f} "
          f"p99_us={l['p99'] / 1e3:.1f} max_us={l['max'] / 1e3:.1f} mean_us={l['mean'] / 1e3:.1f} "
          f"cpu_a={r['moverd_cpu']['a'] * 100:.0f} cpu_b={r['moverd_cpu']['b'] * 100:.0f} ok=1")
pp = d.get("pingpong")
if pp is not None and not pp.get("ok"):
    print(f"BENCH kind=pingpong transport={tp} variant={tag} size={pp['size']} ok=0")
elif pp is not None:
    c = pp["cpu_us_per_exchange"]
    print(f"BENCH kind=pingpong transport={tp} variant={tag} size={pp['size']} "
          f"rate={pp['exchanges_per_s']:.0f} one_way_p50_us={pp['one_way_p50_ns'] / 1e3:.1f} "
          f"one_way_p99_us={pp['one_way_p99_ns'] / 1e3:.1f} cpu_us={json.dumps(c, separators=(',', ':'))} ok=1")
print(f"BENCHRUN transport={tp} others_cpu={d.get('others_cpu', 0) * 100:.1f} "
      f"steal_cpu={d.get('steal_cpu', 0) * 100:.1f} ok={1 if d.get('ok') else 0}")
EOF
}

# fb TRANSPORT TAG ARGS...: one flowbench remote invocation (own daemons).
fb() {
    local tp=$1 tag=$2 st=0
    shift 2
    log "flowbench remote --transport $tp $* (tag $tag)"
    FLOWBENCH_MOVERD_LOG=${FB_LOG_LEVEL:-warn} timeout 240 \
        "$FB" remote --addr "$ADDR" --transport "$tp" --dir /tmp \
        --seconds "$SECS" --warmup "$WARM" --lat-seconds "$LATSECS" \
        --json "$@" >"$WORK/$tp-$tag.json" 2>"$WORK/$tp-$tag.err" || st=$?
    sed 's/^/  | /' "$WORK/$tp-$tag.err"
    [ "$st" = 0 ] || fail "flowbench remote --transport $tp $* exited $st"
    bench_lines "$WORK/$tp-$tag.json" "$tp" "$tag" || fail "no JSON from flowbench ($tp $tag)"
}

for tp in $TRANSPORTS; do
    # 32 B: 1 and 4 flows, then paced and sparse one-way latency (the
    # paced rate is 0.2 x this run's 1-flow rate, at most 20000/s)
    # and a ping-pong (32 B echoed back over a second flow: RTT / 2)
    if [ "$LAT_ONLY" = 1 ]; then
        fb "$tp" small --sizes 32 --flows 1 --only lat,pingpong
    else
        fb "$tp" small --sizes 32 --flows 1,4 --only tput,lat,pingpong
    fi
    # the same latency runs with both movers polling 10 ms after work and
    # the consumer spinning: the closest flowmover gets to perftest's
    # all-polling latency test (4 processes on the guest's 2 vcpus)
    fb "$tp" poll --sizes 32 --flows 1 --only lat --poll-us 10000 --spin
    # both movers spinning (--idle spin), clients sleeping
    fb "$tp" spin --sizes 32 --flows 1 --only lat,pingpong --idle spin
    # the explicit low-latency mode: movers and clients poll with
    # sched_yield (flowshm_set_wait); then the clients alone
    fb "$tp" yield --sizes 32 --flows 1 --only lat,pingpong --idle yield \
        --client-wait yield
    fb "$tp" cyield --sizes 32 --flows 1 --only lat,pingpong --client-wait yield
    [ "$LAT_ONLY" = 1 ] && continue
    fb "$tp" 64k --sizes 64K --flows 1,4 --only tput
    # 1 MiB records: 64 MiB rings (two per flow in this one guest)
    fb "$tp" rest --sizes 256,4K,1M --flows 1 --only tput
done

log "done$([ "$FAILED" = 0 ] || echo ', with FAILURES')"
exit "$FAILED"
