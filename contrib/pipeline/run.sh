#!/bin/bash
# contrib/pipeline/run.sh - the example pipeline, on one machine: two moverd
# daemons on loopback (host A and host B), and
#   A: ingest (C)     sensor frames -> flow 'frames' (A to B, over TCP)
#   B: transform (Python/numpy) 'frames' -> flow 'results' (B, local)
#   B: sink (C)       'results' -> results.txt, every frame once, checked
#   B: monitor (Python) the live rate on the terminal, either
#        --monitor subscribe: a second subscriber of 'results' (ring
#                          format 2: several consumers per flow; default)
#        --monitor ticks:  ten ticks a second the transform sends to a flow
#                          of its own, 'monitor' (what ring format 1 allows)
# Runs until --seconds run out (default 10; 0 = until Ctrl-C), then stops
# the ingest, lets the rest drain into the sink, and stops everything.
# Usage: contrib/pipeline/run.sh [--seconds S] [--rate FRAMES/S]
#                 [--monitor subscribe|ticks] [--build DIR] [--out FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
seconds=10
rate=5000
build=$top/build
out=
monitor=subscribe
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) seconds=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --monitor) monitor=$2; shift 2 ;;
        *) echo "usage: $0 [--seconds S] [--rate FRAMES/S] [--monitor" \
                "subscribe|ticks] [--build DIR] [--out FILE]" >&2; exit 2 ;;
    esac
done

if [ ! -x "$build/contrib/pipeline/pipeline_sink" ]; then
    "$top/contrib/install-deps.sh" >/dev/null
    cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target moverd moverctl flowshm_py \
    pipeline_ingest pipeline_sink >/dev/null

run=$(mktemp -d /tmp/flowmover-pipeline.XXXXXX)
keep=$out                   # --out: the results stay after the run
out=${out:-$run/results.txt}
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
py=/usr/bin/python3
pids=()
daemons=()
cleanup() {
    trap - INT TERM EXIT
    for p in "${pids[@]}" "${daemons[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}" "${daemons[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$run"
}
trap cleanup EXIT
stopping=0
trap 'stopping=1' INT TERM

port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ctl_a() { "$build/control/moverctl" --socket "$run/a/moverd.sock" "$@"; }
ctl_b() { "$build/control/moverctl" --socket "$run/b/moverd.sock" "$@"; }
# Stages run as simple commands (not through a function): $! is then the
# stage itself, not a subshell a signal would not reach it through.  Each
# in a session of its own (setsid): Ctrl-C reaches this script alone, which
# then stops the stages in order, so nothing in flight is cut off.
sock_a=$run/a/moverd.sock
sock_b=$run/b/moverd.sock

echo "== moverd A and B (B listens on 127.0.0.1:$port)"
mkdir -p "$run/a" "$run/b"
setsid "$build/moverd/moverd" --foreground --log-level warn \
    --socket "$run/a/moverd.sock" 2>"$run/a/log" &
daemons+=($!)
setsid "$build/moverd/moverd" --foreground --log-level warn \
    --socket "$run/b/moverd.sock" --listen "127.0.0.1:$port" 2>"$run/b/log" &
daemons+=($!)
for _ in $(seq 200); do
    ctl_a status >/dev/null 2>&1 && ctl_b status >/dev/null 2>&1 && break
    sleep 0.05
done

echo "== flows: frames (A to B), results (on B); monitor: $monitor"
ctl_a flow create frames --ring-size 4M --max-record 64K \
    --peer "127.0.0.1:$port" >/dev/null
ctl_b flow create results --ring-size 1M --max-record 4K >/dev/null
case $monitor in
    ticks)
        ctl_b flow create monitor --ring-size 64K --max-record 64 >/dev/null
        monitor_args=(monitor)
        transform_args=(--monitor monitor) ;;
    subscribe)
        monitor_args=(--subscribe results)
        transform_args=() ;;
    *) echo "--monitor subscribe or ticks" >&2; exit 2 ;;
esac
for _ in $(seq 200); do
    ctl_b flow show frames >/dev/null 2>&1 && break
    sleep 0.05
done

echo "== stages: sink, monitor, transform on B; ingest on A ($rate frames/s)"
FLOWMOVER_SOCKET=$sock_b setsid "$build/contrib/pipeline/pipeline_sink" results --out "$out" \
    >"$run/sink.out" &
sink=$!
pids+=($sink)
FLOWMOVER_SOCKET=$sock_b setsid $py "$here/monitor.py" "${monitor_args[@]}" &
pids+=($!)
FLOWMOVER_SOCKET=$sock_b setsid $py "$here/transform.py" frames results \
    "${transform_args[@]}" \
    >"$run/transform.out" &
transform=$!
pids+=($transform)
FLOWMOVER_SOCKET=$sock_a setsid "$build/contrib/pipeline/pipeline_ingest" frames --rate "$rate" \
    >"$run/ingest.out" &
ingest=$!
pids+=($ingest)

start=$SECONDS
while [ $stopping = 0 ] && kill -0 "$ingest" 2>/dev/null; do
    [ "$seconds" != 0 ] && [ $((SECONDS - start)) -ge "$seconds" ] && break
    sleep 0.2 || true   # Ctrl-C kills the sleep too: keep going
done

echo "== stopping: ingest first, then the rest once the sink has it all"
kill -TERM "$ingest" 2>/dev/null || true
wait "$ingest" || true
cat "$run/ingest.out"
sent=$(sed -n 's/^ingest: sent \([0-9]*\) frames$/\1/p' "$run/ingest.out")
for _ in $(seq 100); do
    [ "$(wc -l <"$out")" -ge "${sent:-0}" ] && break
    sleep 0.1
done
kill -TERM "$transform" "$sink" 2>/dev/null || true
wait "$transform" "$sink" || true
cat "$run/transform.out" "$run/sink.out"
written=$(wc -l <"$out")
if [ "$written" = "${sent:-x}" ]; then
    echo "== every frame once: $written sent, $written written${keep:+ ($out)}"
else
    echo "== MISMATCH: ${sent:-?} sent, $written written" >&2
    exit 1
fi
