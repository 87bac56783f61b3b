#!/bin/bash
# moverd-rdma.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh):
# two moverd daemons over RDMA (rxe0, 10.77.0.1), several flows with
# producer and consumer processes checking every record's sequence number;
# then the receiving moverd is killed (SIGKILL) mid-stream and restarted,
# and every record must still arrive exactly once.
set -euo pipefail
build=${1:?usage: moverd-rdma.sh BUILD_DIR}
ip=${FM_RDMA_ADDR:-10.77.0.1}
port=7471
count=${FM_RDMA_RECORDS:-300000}
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-rdma   # $run, $pids, cleanup
fail() { echo "moverd-rdma.sh: FAIL: $*" >&2; for f in "$run"/*.log; do echo "--- $f"; tail -20 "$f"; done >&2; exit 1; }

ulimit -l unlimited
moverd=$build/moverd/moverd
ctl() { "$build/control/moverctl" --socket "$run/$1/s" "${@:2}"; }
# both daemons prove the same key (an address off loopback needs one)
"$build/control/moverctl" keygen "$run/peer.key" >/dev/null
start_b() {
    "$moverd" -f --socket "$run/b/s" --listen "$ip:$port" --transport rdma \
        --peer-key "$run/peer.key" >>"$run/b.log" 2>&1 &
    pids+=($!)
    b=$!
    for _ in $(seq 100); do ctl b status >/dev/null 2>&1 && return 0; sleep 0.05; done
    fail "moverd B did not start"
}
"$moverd" -f --socket "$run/a/s" --transport rdma --peer-key "$run/peer.key" \
    >"$run/a.log" 2>&1 &
pids+=($!)
start_b
for _ in $(seq 100); do ctl a status >/dev/null 2>&1 && break; sleep 0.05; done

flows=4
for i in $(seq $flows); do
    ctl a flow create "r$i" --ring-size 1M --max-record 64K --peer "$ip:$port" >/dev/null
done
for _ in $(seq 100); do
    [ "$(ctl b flow list --json | grep -o '"name"' | wc -l)" = $flows ] && break
    sleep 0.1
done
ctl a flow list
ctl a flow show r1 | grep -q 'transport: *rdma' || fail "flow r1 is not on RDMA"

cons=()
for i in $(seq $flows); do
    FLOWMOVER_SOCKET=$run/b/s "$build/libflowshm/flowdemo" consume "r$i" \
        --count "$count" >"$run/c$i.log" 2>&1 &
    cons+=($!)
    FLOWMOVER_SOCKET=$run/a/s "$build/libflowshm/flowdemo" produce "r$i" \
        --count "$count" --size $((64 + 200 * i)) >"$run/p$i.log" 2>&1 &
    pids+=($!)
done
sleep 1
echo "moverd-rdma.sh: killing the receiving moverd mid-stream"
kill -9 "$b"
sleep 0.5
start_b
for i in $(seq $flows); do
    wait "${cons[$((i - 1))]}" || fail "consumer of r$i failed: $(cat "$run/c$i.log")"
    grep -q "consumer: $count records" "$run/c$i.log" || fail "r$i: $(cat "$run/c$i.log")"
done
cat "$run"/c*.log
ctl a status
echo "moverd-rdma.sh: PASS ($flows flows x $count records over RDMA, receiver killed and restarted)"
