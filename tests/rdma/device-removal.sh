#!/bin/bash
# device-removal.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh):
# the RDMA device is removed (`rdma link delete rxe0`) under running flows.
#
#   1. --transport auto: a flow moves records over RDMA; the device is
#      deleted mid-stream.  The deletion must complete (rxe has no
#      "disassociate": the kernel waits until every process lets go, so a
#      moverd holding on would hang it), both daemons must live on, hold no
#      uverbs file, log the removal, and the flow must finish over TCP with
#      every record exactly once, in order (flowdemo checks).
#   2. --transport rdma: the device comes back, new daemons, a flow over
#      RDMA, the device is deleted again.  The deletion completes; the flow
#      waits in "reconnecting", saying there is no device; moverctl answers.
#   3. RLIMIT_MEMLOCK: moverd without CAP_IPC_LOCK and `ulimit -l 64`; the
#      registration fails; the log and `flow show` say to raise the limit.
#   4. RDMA set-up that fails half way, after the device is open (an
#      open-file limit that leaves no fd for the event channel, the
#      completion channel or the registration thread's eventfd): moverd
#      runs on over TCP, holds no uverbs file, and the deletion completes.
set -euo pipefail
build=${1:?usage: device-removal.sh BUILD_DIR}
ip=10.77.0.1
port=7473
count=${FM_RDMA_RECORDS:-600000}
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-devrm   # $run, $pids, cleanup
need_rxe0
moverd=$build/moverd/moverd
flowdemo=$build/libflowshm/flowdemo
ctl() { "$build/control/moverctl" --socket "$run/$1.s" "${@:2}"; }

# start_transport NAME TRANSPORT [ARGS...]: common.sh's start_daemon, logging at info
start_transport() {
    local name=$1 transport=$2
    shift 2
    start_daemon "$name" --transport "$transport" --log-level info "$@"
}

# delete_device: `rdma link delete rxe0` must return; a hang means some
# process still holds the device.  60 s is a liveness bound for an
# emulated guest, not a performance figure.
delete_device() {
    ( rdma link delete rxe0 ) &
    local d=$!
    for _ in $(seq 600); do
        kill -0 "$d" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$d" 2>/dev/null; then
        for p in $(pgrep -x moverd); do
            echo "moverd $p still holds: $(ls -l /proc/"$p"/fd | grep -c uverbs) uverbs fds"
        done >&2
        fail "rdma link delete rxe0 still blocked after 60 s"
    fi
    wait "$d" || fail "rdma link delete rxe0 failed"
    [ ! -e /sys/class/infiniband/rxe0 ] || fail "rxe0 still exists"
}

# no_uverbs PID...: the daemons let go of the device entirely
no_uverbs() {
    for p in "$@"; do
        kill -0 "$p" 2>/dev/null || fail "moverd $p died with the device"
        ! ls -l /proc/"$p"/fd | grep -q uverbs ||
            fail "moverd $p still holds a uverbs file"
    done
}

# ---- 1: auto: the flow goes on over TCP ----------------------------------------
start_transport b auto --listen "$ip:$port"; b=$pid
start_transport a auto; a=$pid
ctl a flow create d1 --peer "$ip:$port" --ring-size 1M >/dev/null
wait_flow a d1 'state: *open'
ctl a flow show d1 | grep -q 'transport: *rdma' || fail "flow d1 is not on RDMA"
FLOWMOVER_SOCKET=$run/b.s "$flowdemo" consume d1 --count "$count" >"$run/c1.log" 2>&1 &
c=$!
pids+=("$c")
FLOWMOVER_SOCKET=$run/a.s "$flowdemo" produce d1 --count "$count" --size 64 \
    >"$run/p1.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do    # until records are moving over RDMA
    [ "$(ctl a --json flow show d1 | sed -n 's/.*"bytes_acked": \([0-9]*\).*/\1/p')" -gt 1000000 ] && break
    sleep 0.05
done
say "phase 1: deleting rxe0 under a running flow (--transport auto)"
delete_device
no_uverbs "$a" "$b"
wait "$c" || fail "consumer of d1: $(cat "$run/c1.log")"
grep -q "consumer: $count records" "$run/c1.log" || fail "d1: $(cat "$run/c1.log")"
ctl a flow show d1 | grep -q 'transport: *tcp' || fail "flow d1 did not move to TCP"
for n in a b; do
    grep -q "RDMA device rxe0 is being removed" "$run/$n.log" ||
        fail "moverd $n did not log the removal"
done
say "phase 1: PASS ($count records, RDMA then TCP, device released)"
kill "$a" "$b"; wait "$a" "$b" 2>/dev/null || true

# ---- 2: rdma only: the flow waits ------------------------------------------------
rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add rxe0"
start_transport b2 rdma --listen "$ip:$((port + 1))"; b=$pid
start_transport a2 rdma; a=$pid
ctl a2 flow create d2 --peer "$ip:$((port + 1))" --ring-size 1M >/dev/null
wait_flow a2 d2 'state: *open'
say "phase 2: deleting rxe0 (--transport rdma)"
delete_device
no_uverbs "$a" "$b"
wait_flow a2 d2 'reason: *no RDMA device'
ctl a2 flow show d2 | grep -q 'state: *reconnecting' ||
    fail "flow d2 is not reconnecting: $(ctl a2 flow show d2)"
grep -q "flows wait for a device" "$run/a2.log" || fail "moverd a2 did not say the flows wait"
say "phase 2: PASS (flow reconnecting with the reason, device released)"
kill "$a" "$b"; wait "$a" "$b" 2>/dev/null || true

# ---- 3: RLIMIT_MEMLOCK -----------------------------------------------------------
rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add rxe0"
start_transport b3 rdma --listen "$ip:$((port + 2))"; b=$pid
(
    ulimit -l 64
    exec setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
        "$moverd" -f --socket "$run/a3.s" --state-dir "$run/a3.rings" \
        --transport rdma --log-level info >>"$run/a3.log" 2>&1
) &
a=$!
pids+=("$a")
for _ in $(seq 200); do ctl a3 status >/dev/null 2>&1 && break; sleep 0.05; done
ctl a3 flow create d3 --peer "$ip:$((port + 2))" --ring-size 4M >/dev/null
for _ in $(seq 300); do
    grep -q "RLIMIT_MEMLOCK" "$run/a3.log" && break
    sleep 0.1
done
grep -q "RLIMIT_MEMLOCK" "$run/a3.log" ||
    fail "no RLIMIT_MEMLOCK advice after a registration beyond the limit"
wait_flow a3 d3 'reason: .*RLIMIT_MEMLOCK' 
kill -0 "$a" || fail "moverd a3 died on a registration failure"
ctl a3 status >/dev/null || fail "moverd a3 stopped answering"
say "phase 3: PASS ($(grep -m1 RLIMIT_MEMLOCK "$run/a3.log" | cut -c14-))"
kill "$a" "$b"; wait "$a" "$b" 2>/dev/null || true

# ---- 4: RDMA set-up fails after the device is open -------------------------------
# Each fd moverd opens before its RDMA set-up moves where the limit bites,
# so the limits are tried upward: below the window moverd cannot start or
# opens no device, above it RDMA comes up.  One daemon per way of failing
# is kept running while the device is deleted.
started() { grep -q "ready (pid" "$2" || ! kill -0 "$1" 2>/dev/null; }
kept=()
for n in $(seq 8 64); do
    (
        ulimit -n "$n"
        exec "$moverd" -f --socket "$run/f$n.s" --state-dir "$run/f$n.rings" \
            --transport auto --log-level info >"$run/f$n.log" 2>&1
    ) &
    f=$!
    pids+=("$f")
    within 20 started "$f" "$run/f$n.log" || true
    why=$(grep -o "RDMA device present but [a-z ]*" "$run/f$n.log" || true)
    if [ -n "$why" ] && kill -0 "$f" 2>/dev/null &&
       ! grep -q "$why" "$run"/f*.kept 2>/dev/null; then
        echo "$why" >"$run/f$n.kept"
        kept+=("$f")
        say "phase 4: fd limit $n: $why"
        continue
    fi
    kill "$f" 2>/dev/null || true
    wait "$f" 2>/dev/null || true
    if grep -q "transport for new peers: rdma" "$run/f$n.log"; then break; fi
done
[ ${#kept[@]} -gt 0 ] || fail "no fd limit made the RDMA set-up fail half way"
delete_device
no_uverbs "${kept[@]}"
for k in "$run"/f*.kept; do
    k=$(basename "$k" .kept)
    ctl "$k" status >/dev/null || fail "moverd $k stopped answering"
done
say "phase 4: PASS (${#kept[@]} ways of failing, device released)"
say "PASS"
