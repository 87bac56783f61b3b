#!/bin/bash
# flow-alone.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh):
# one flow's trouble over RDMA stays that flow's.  The connection between
# two daemons is shared by every flow between them; what goes wrong with
# one ring must not reset it for the others.
#
#   1. A sender ring that cannot be registered (moverd without
#      CAP_IPC_LOCK, RLIMIT_MEMLOCK 12 MiB, a 16 MiB ring beside a 1 MiB
#      one): that flow waits and says why (RLIMIT_MEMLOCK), the other one
#      keeps its connection (no reconnect) and moves every record.  Then
#      the limit is raised (prlimit): the waiting flow opens by itself and
#      moves every record.  Before, the registration failure failed the
#      connection, again at every reconnect (144 reconnects in 25 s).
#   2. Receiver flows destroyed on the receiving host while their senders
#      stream into them: the connection stays up (another flow's
#      reconnects stay 0 and it moves every record) and the destroyed
#      flows stay gone on the receiver.  Before, the consumer ring's
#      registration went at once, the sender's WRITE in flight hit an
#      invalid rkey and the connection failed ("remote access error"),
#      losing the refusal: the sender opened the flow again and the
#      receiver made it anew.
#   3. A sender killed and restarted four times while the receiver's
#      registration of a 64 MiB ring is held (FLOWMOVER_TEST_REG_HOLD):
#      the closed connections' queued registrations are dropped, not
#      pinned once the hold ends (before: five pins for five connections;
#      now the one under way at the hold and the live one's).
#   4. rxe0's network device down and up: moverd reads the device's
#      asynchronous events and logs the port's error and its return
#      (before, nothing read them).
#
# Under the ASan build each daemon must stop with exit 0 and no report.
set -euo pipefail
build=${1:?usage: flow-alone.sh BUILD_DIR}
ip=${FM_RDMA_ADDR:-10.77.0.1}
port=7501
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-alone   # $run, $pids, cleanup
need_rxe0
ctl() { timeout 60 "$build/control/moverctl" --socket "$run/$1.s" "${@:2}"; }
demo=$build/libflowshm/flowdemo

# reconnects NAME FLOW: the flow's reconnect count
reconnects() {
    ctl "$1" flow show "$2" | sed -n 's/.*reconnects: *\([0-9]*\).*/\1/p' | head -1
}

# move NAME_A NAME_B FLOW N SIZE: N records A -> B, each checked by flowdemo
move() {
    FLOWMOVER_SOCKET=$run/$2.s timeout 120 "$demo" consume "$3" --count "$4" \
        >"$run/c-$3.log" 2>&1 &
    local c=$!
    FLOWMOVER_SOCKET=$run/$1.s timeout 120 "$demo" produce "$3" --count "$4" \
        --size "$5" >"$run/p-$3.log" 2>&1 || fail "producer of $3: $(tail -2 "$run/p-$3.log")"
    wait "$c" || fail "consumer of $3: $(tail -2 "$run/c-$3.log")"
}

# registered NAME: the rings registered on NAME's peer connections
registered() {
    ctl "$1" --json status | { grep -o '"registrations": *[0-9]*' || true; } |
        awk -F: '{ n += $2 } END { print n + 0 }'
}

# stops_clean NAME PID: moverd NAME exits 0 on SIGTERM and its log has no
# sanitizer report (the ASan build)
stops_clean() {
    kill -0 "$2" || fail "moverd $1 died"
    kill "$2"
    wait "$2" || fail "moverd $1 exited with $?"
    ! grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error" "$run/$1.log" ||
        fail "sanitizer report in $1.log"
}

# ---- 1: a sender ring beyond RLIMIT_MEMLOCK --------------------------------------
start_daemon b --transport rdma --log-level info --listen "$ip:$port"
b=$pid
[ -e "$run/peer.key" ] || "$build/control/moverctl" keygen "$run/peer.key" >/dev/null
(
    ulimit -l 12288
    exec setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
        "$build/moverd/moverd" -f --socket "$run/a.s" --state-dir "$run/a.rings" \
        --peer-key "$run/peer.key" --transport rdma --log-level info \
        >>"$run/a.log" 2>&1
) &
a=$!
pids+=("$a")
within 30 ctl a status >/dev/null 2>&1 || fail "moverd a did not start"
ctl a flow create small --peer "$ip:$port" --ring-size 1M >/dev/null
wait_flow a small 'state: *open'
move a b small 100 64
ctl a flow create big --peer "$ip:$port" --ring-size 16M >/dev/null
wait_flow a big 'reason: .*cannot register its ring.*RLIMIT_MEMLOCK'
sleep 5 # long enough for several tries of big's registration
flow_matches a big 'state: *reconnecting' || fail "big: $(ctl a flow show big)"
move a b small 20000 64
r=$(reconnects a small)
[ "$r" = 0 ] || fail "small reconnected $r times beside big"
tries=$(grep -c "flow big: ibv_reg_mr" "$run/a.log" || true)
say "phase 1: big waits alone ($tries registrations tried), small moved 20100 records, 0 reconnects"
prlimit --pid "$a" --memlock=unlimited:unlimited || fail "prlimit"
wait_flow a big 'state: *open'
move a b big 2000 4096
r=$(reconnects a small)
[ "$r" = 0 ] || fail "small reconnected $r times"
say "phase 1: PASS (the limit raised: big opened and moved 2000 records)"
stops_clean a "$a"
stops_clean b "$b"

# ---- 2: receiver flows destroyed mid-stream --------------------------------------
start_daemon b2 --transport rdma --log-level info --listen "$ip:$((port + 1))"
b2=$pid
start_daemon a2 --transport rdma --log-level info
a2=$pid
for f in y x1 x2 x3; do
    ctl a2 flow create $f --peer "$ip:$((port + 1))" --ring-size 1M >/dev/null
done
for f in y x1 x2 x3; do wait_flow a2 $f 'state: *open'; done
for f in y x1 x2 x3; do
    FLOWMOVER_SOCKET=$run/b2.s "$demo" consume $f --count 1000000000 \
        >"$run/c2-$f.log" 2>&1 &
    pids+=($!)
    FLOWMOVER_SOCKET=$run/a2.s "$demo" produce $f --count 1000000000 \
        --size 2000 >"$run/p2-$f.log" 2>&1 &
    pids+=($!)
done
sleep 3
for f in x1 x2 x3; do
    ctl b2 flow destroy $f >/dev/null || fail "destroy $f on b2"
    sleep 2
done
for f in x1 x2 x3; do wait_flow a2 $f 'state: *failed'; done
sleep 3 # a flow opened again would be made anew on b2 by now
list=$(ctl b2 flow list)
for f in x1 x2 x3; do
    ! grep -qw "$f" <<<"$list" || fail "$f is back on b2 after its destroy: $list"
done
r=$(reconnects a2 y)
[ "$r" = 0 ] || fail "y reconnected $r times while x1-x3 were destroyed on b2"
flow_matches a2 y 'state: *open' || fail "y: $(ctl a2 flow show y)"
ctl a2 flow create z --peer "$ip:$((port + 1))" --ring-size 1M >/dev/null
wait_flow a2 z 'state: *open'
move a2 b2 z 2000 2000
r=$(reconnects a2 y)
[ "$r" = 0 ] || fail "y reconnected $r times"
# the rings kept for x1-x3's WRITEs went with a2's CLOSEs: y's and z's left
n=$(registered b2)
[ "$n" = 2 ] || fail "b2 has $n rings registered, want 2 (y, z)"
stops_clean a2 "$a2"
stops_clean b2 "$b2"
say "phase 2: PASS (x1-x3 destroyed mid-stream on b2 and gone, y 0 reconnects, z moved 2000 records, 2 rings registered on b2)"

# ---- 3: a sender reconnecting while the receiver's registration is held ----------
# Each connection's OPEN queued one more registration of the same ring, and
# the closed connections' were pinned all the same once the hold ended.
hold=$run/hold
touch "$hold"
FLOWMOVER_TEST_REG_HOLD=$hold start_daemon b3 --transport rdma --log-level debug \
    --listen "$ip:$((port + 2))"
b3=$pid
start_daemon a3 --transport rdma --log-level info
a3=$pid
ctl a3 flow create big --peer "$ip:$((port + 2))" --ring-size 64M >/dev/null
for i in 1 2 3 4; do
    within 60 eval '[ "$(grep -c "flow big: registering its ring" "$run/b3.log")" -ge "$i" ]' ||
        fail "b3 did not start registration $i of big"
    kill -9 "$a3"
    wait "$a3" 2>/dev/null || true
    start_daemon a3 --transport rdma --log-level info
    a3=$pid
done
within 60 eval '[ "$(grep -c "flow big: registering its ring" "$run/b3.log")" -ge 5 ]' ||
    fail "b3 did not start registration 5 of big"
rm -f "$hold"
wait_flow a3 big 'state: *open'
move a3 b3 big 2000 4096
n=$(grep -c "flow big: ring registration of .* (registered)" "$run/b3.log" || true)
[ "$n" -le 2 ] || fail "b3 pinned big's ring $n times for 5 connections (want the live one's, and at most the one under way)"
stops_clean a3 "$a3"
stops_clean b3 "$b3"
say "phase 3: PASS (5 connections, big's ring pinned $n time(s) on b3, 2000 records)"

# ---- 4: the device's asynchronous events are read ------------------------------
# rxe0's network device down and up: moverd logs the port's events (before,
# nothing read them: they queued in the kernel for moverd's life).
netdev=$(rdma link show rxe0/1 | sed -n 's/.* netdev \([^ ]*\).*/\1/p')
[ -n "$netdev" ] || fail "no netdev for rxe0: $(rdma link show)"
start_daemon e --transport rdma --log-level info
e=$pid
ip link set "$netdev" down
within 30 grep -q "RDMA device rxe0 port 1: port error" "$run/e.log" ||
    { ip link set "$netdev" up; fail "no port error logged with $netdev down"; }
ip link set "$netdev" up
sleep 1.1 # past the log's once-a-second limit
within 30 grep -q "RDMA device rxe0 port 1: port active" "$run/e.log" ||
    fail "no port active logged with $netdev up"
ctl e status >/dev/null || fail "moverd e stopped answering"
stops_clean e "$e"
say "phase 4: PASS ($netdev down and up: $(grep -c 'RDMA device rxe0 port' "$run/e.log") port events logged)"
