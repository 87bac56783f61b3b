#!/bin/bash
# reg-offloop.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh):
# a sender's producer ring is registered (ibv_reg_mr, which pins every
# page) off moverd's event loop.  The sending daemon runs with
# FLOWMOVER_TEST_REG_HOLD=FILE: every ring registration waits while FILE
# exists (moverd/reg_thread.h), the stand-in for one that takes long.  No
# timing threshold: what is checked is what gets answered while a
# registration is held.
#
#   1. A 64 MiB flow opens while registrations are held: the sender's
#      `status` answers and another flow (registered before the hold)
#      moves every record.  With the registration on the loop, none of
#      that is answered until the hold ends.  Then the hold ends and the
#      flow moves records.
#   2. A flow destroyed on both hosts while its ring's registration is in
#      flight, and the receiving daemon killed while the sender registers:
#      the sender lives on, keeps no registration of them, and stops
#      cleanly (exit 0; under the ASan build: no leak, no use after free).
#   3. moverd stopped (SIGTERM) while a registration is held: it waits for
#      the registration and exits 0.
set -euo pipefail
build=${1:?usage: reg-offloop.sh BUILD_DIR}
ip=${FM_RDMA_ADDR:-10.77.0.1}
port=7481
count=${FM_RDMA_RECORDS:-20000}
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-regoff   # $run, $pids, cleanup
fail() {
    echo "reg-offloop.sh: FAIL: $*" >&2
    for f in "$run"/*.log; do echo "--- $f"; tail -25 "$f"; done >&2
    exit 1
}
say() { echo "reg-offloop.sh: $*"; }

[ -d /sys/class/infiniband/rxe0 ] ||
    { echo "SKIPPED: no rxe0 (run this inside contrib/softroce/vm-run.sh)" >&2; exit 77; }
ulimit -l unlimited
hold=$run/hold
# a control call that is not answered while the loop is blocked must fail,
# not hang the test: 60 s is a liveness bound for an emulated guest
ctl() { timeout 60 "$build/control/moverctl" --socket "$run/$1.s" "${@:2}"; }
rdma_daemon() { start_daemon "$1" --transport rdma --log-level debug "${@:2}"; }
# the sender's registrations wait while $hold exists
held_daemon() { FLOWMOVER_TEST_REG_HOLD=$hold rdma_daemon "$@"; }

# registering NAME FLOW: until NAME's log says FLOW's ring registration
# started
registering() {
    for _ in $(seq 600); do
        grep -q "flow $2: registering its ring" "$run/$1.log" && return 0
        sleep 0.1
    done
    fail "moverd $1 never started registering flow $2's ring"
}

# move FLOW N: N records from a to b through FLOW, each checked by flowdemo
move() {
    FLOWMOVER_SOCKET=$run/b.s timeout 120 "$build/libflowshm/flowdemo" \
        consume "$1" --count "$2" >"$run/c-$1.log" 2>&1 &
    local c=$!
    FLOWMOVER_SOCKET=$run/a.s timeout 120 "$build/libflowshm/flowdemo" \
        produce "$1" --count "$2" --size 64 >"$run/p-$1.log" 2>&1 ||
        fail "producer of $1: $(cat "$run/p-$1.log")"
    wait "$c" || fail "consumer of $1: $(cat "$run/c-$1.log")"
    grep -q "consumer: $2 records" "$run/c-$1.log" ||
        fail "$1: $(cat "$run/c-$1.log")"
}

# registered NAME: the rings registered on NAME's peer connections
registered() {
    ctl "$1" --json status | { grep -o '"registrations": *[0-9]*' || true; } |
        awk -F: '{ n += $2 } END { print n + 0 }'
}

# ---- 1: the loop answers while a registration is held --------------------
rdma_daemon b --listen "$ip:$port"; b=$pid
held_daemon a; a=$pid
ctl a flow create small --peer "$ip:$port" --ring-size 1M >/dev/null
wait_flow a small 'state: *open'
move small 100     # both of its rings are registered now
touch "$hold"
ctl a flow create big --peer "$ip:$port" --ring-size 64M >/dev/null
registering a big
ctl a status >/dev/null || fail "moverd a did not answer status while registering"
move small "$count"
if [ ! -e "$hold" ] || grep -q "flow big: ring registration .* ended" "$run/a.log"; then
    fail "the registration of big's ring ended while held"
fi
say "phase 1: while big's ring registration was held: status and $count records of another flow answered"
rm -f "$hold"
move big "$count"
grep -q "flow big: ring registration of 67108864 bytes ended .*(registered)" "$run/a.log" ||
    fail "moverd a did not register big's producer ring off the loop"
say "phase 1: PASS (big moved $count records once the hold ended)"

# ---- 2: a flow destroyed, the receiver killed, while registering -------------
before=$(registered a)
touch "$hold"
ctl a flow create gone --peer "$ip:$port" --ring-size 16M >/dev/null
registering a gone
ctl a flow destroy gone >/dev/null || fail "flow destroy gone on a"
ctl b flow destroy gone >/dev/null 2>&1 || true   # gone with a's CLOSE
ctl a flow create cut --peer "$ip:$port" --ring-size 16M >/dev/null
registering a cut
kill -9 "$b"; wait "$b" 2>/dev/null || true
# its connection closes while the registration in its PD is held
wait_flow a cut 'state: *reconnecting'
ctl a status >/dev/null || fail "moverd a stopped answering"
rm -f "$hold"
for _ in $(seq 600); do
    [ "$(grep -c "ring registration of 16777216 bytes ended" "$run/a.log")" -ge 2 ] && break
    sleep 0.1
done
[ "$(grep -c "ring registration of 16777216 bytes ended" "$run/a.log")" -ge 2 ] ||
    fail "moverd a did not take both registrations back"
kill -0 "$a" || fail "moverd a died"
after=$(registered a)
# the connection to b is gone with small's and big's rings; nothing of
# gone's or cut's may be left on any connection
[ "$after" -le "$before" ] || fail "registrations on a: $before before, $after after"
kill "$a"; wait "$a" || fail "moverd a exited with $? after phase 2"
! grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error" "$run/a.log" ||
    fail "sanitizer report in a.log"
say "phase 2: PASS (destroyed and orphaned registrations undone; $before ring(s) registered before, $after after)"

# ---- 3: stopped while a registration is held ----------------------------------
rdma_daemon b3 --listen "$ip:$((port + 1))"; b=$pid
held_daemon a3; a=$pid
touch "$hold"
ctl a3 flow create late --peer "$ip:$((port + 1))" --ring-size 16M >/dev/null
registering a3 late
kill "$a"
sleep 2      # not a threshold: the daemon must still be waiting, or done
rm -f "$hold"
wait "$a" || fail "moverd a3 exited with $? when stopped while registering"
# taken back by the loop's last turns, or by the join after them
grep -Eq "flow late: ring registration .* (ended|taken back at shutdown)" "$run/a3.log" ||
    fail "moverd a3 stopped without taking its registration back"
! grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error" "$run/a3.log" ||
    fail "sanitizer report in a3.log"
kill "$b"; wait "$b" || fail "moverd b3 exited with $?"
say "phase 3: PASS (stopped while registering: exit 0)"
say "PASS"
