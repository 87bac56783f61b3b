#!/bin/bash
# multipeer.sh - what flows waiting on one peer cost the flows of another.
#
# Three moverd on this machine: A sends to B and to C.  A's N flows to C are
# filled while C has no consumer, so their windows are closed with records
# left to send on A.  Printed: the CPU moverd A, and C, use over 10 s at
# rest with them, and the time one flow A -> B takes to move COUNT
# records of 32..64 bytes (tests/flowcheck.c: each checked once, in
# order), first with no flow to C, then with the N waiting (the ratio:
# their cost to the busy flow).
#
#   usage: multipeer.sh BUILD_DIR [N [COUNT [MOVERD]]]
#   (MOVERD: another moverd binary to measure, e.g. an older build's)
set -euo pipefail
build=$(cd "$1" && pwd)
n=${2:-500}
count=${3:-2000000}
moverd=${4:-$build/moverd/moverd}
ctl=$build/control/moverctl
check=$build/tests/flowcheck
dir=$(mktemp -d /dev/shm/multipeer.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() { # start NAME [moverd args...]
    local name=$1; shift
    mkdir -p "$dir/$name"
    "$moverd" --foreground --socket "$dir/$name/sock" \
        --state-dir "$dir/$name/rings" --log-level warn \
        --max-flows $((n + 64)) --peer-max-flows $((n + 64)) \
        "$@" 2>"$dir/$name/log" &
    pids+=($!)
    for _ in $(seq 100); do
        "$ctl" --socket "$dir/$name/sock" status >/dev/null 2>&1 && return
        sleep 0.05
    done
    echo "moverd $name did not start:" >&2; cat "$dir/$name/log" >&2; exit 1
}

pb=$(port) pc=$(port)
start B --listen 127.0.0.1:$pb
start C --listen 127.0.0.1:$pc
start A --transport tcp

# user + system CPU time of process PID, in ms
cpu_ms() {
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) * 1000 / hz }' \
        "/proc/$1/stat"
}

# COUNT records A -> B over flow NAME: elapsed seconds
run() {
    local name=$1 t0 t1
    "$ctl" --socket "$dir/A/sock" flow create "$name" --peer 127.0.0.1:$pb \
        --ring-size 16M --max-record 1K >/dev/null
    FLOWMOVER_SOCKET=$dir/B/sock "$check" consume "$name" --producers 1 \
        --count "$count" --max-size 64 --attach-wait 10000 >/dev/null &
    local cons=$!
    t0=$(date +%s.%N)
    FLOWMOVER_SOCKET=$dir/A/sock "$check" produce "$name" --id 1 \
        --count "$count" --max-size 64 >/dev/null
    wait $cons
    t1=$(date +%s.%N)
    "$ctl" --socket "$dir/A/sock" flow destroy "$name" >/dev/null
    python3 -c "print(f'{$t1 - $t0:.3f}')"
}

alone=$(run x0)
for i in $(seq 0 $((n - 1))); do
    "$ctl" --socket "$dir/A/sock" flow create "w$i" --peer 127.0.0.1:$pc \
        --ring-size 64K --max-record 1K >/dev/null
done
# fill every w ring twice: the first fill moves on to C, which has no
# consumer, so its rings fill and A's windows close; the second stays on A
PYTHONPATH=$build/python FLOWMOVER_SOCKET=$dir/A/sock python3 - "$n" <<'EOF'
import sys
import time
import flowshm

flows = [flowshm.attach(f"w{i}", "producer") for i in range(int(sys.argv[1]))]
for _ in range(2):
    for p in flows:
        try:
            while True:
                p.send(b"w" * 1000, timeout=0)
        except (BlockingIOError, TimeoutError, flowshm.Error):
            pass
    time.sleep(1)
for p in flows:
    p.close()
EOF
# the flows to C with records left on A
waiting=$("$ctl" --socket "$dir/A/sock" --json flow list | python3 -c '
import json, sys
print(sum(1 for f in json.load(sys.stdin)
          if f["name"].startswith("w") and f["used"] > 0))')
# what the waiting flows cost A at rest, and C, whose receivers owe
# credit their consumers (none) may never take
c0=$(cpu_ms "${pids[2]}") r0=$(cpu_ms "${pids[1]}")
sleep 10
c1=$(cpu_ms "${pids[2]}") r1=$(cpu_ms "${pids[1]}")
with=$(run x1)
echo "moverd: $moverd"
echo "moverd A at rest with $waiting flows waiting: $((${c1%.*} - ${c0%.*})) ms" \
     "of CPU in 10 s"
echo "moverd C at rest with their receivers full: $((${r1%.*} - ${r0%.*})) ms" \
     "of CPU in 10 s"
echo "$count records A -> B alone: $alone s; with $waiting flows A -> C" \
     "waiting on closed windows: $with s;" \
     "ratio $(python3 -c "print(f'{$with / $alone:.2f}')")"
