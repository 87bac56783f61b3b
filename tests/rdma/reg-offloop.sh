#!/bin/bash
# reg-offloop.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh):
# a ring's RDMA registration (ibv_reg_mr, which pins every page) runs off
# moverd's event loop, on the sender (its producer ring) and on the
# receiver (its consumer ring, before the OPEN is answered).  A daemon
# run with FLOWMOVER_TEST_REG_HOLD=FILE holds every ring registration
# while FILE exists (moverd/reg_thread.h), the stand-in for one that takes
# long.  No timing threshold: what is checked is what gets answered while
# a registration is held.
#
#   1. Sender: a 64 MiB flow opens while the sender's registrations are
#      held: its `status` answers and another flow (registered before the
#      hold) moves every record.  With the registration on the loop, none
#      of that is answered until the hold ends.  Then the hold ends and
#      the flow moves records.
#   2. Sender: a flow destroyed on both hosts while its ring's
#      registration is in flight, and the receiving daemon killed while
#      the sender registers: the sender lives on, keeps no registration of
#      them (the one queued behind the held one is dropped with its
#      connection, never pinned), and stops cleanly (exit 0; under the
#      ASan build: no leak, no use after free).
#   3. Sender: moverd stopped (SIGTERM) while a registration is held: it
#      waits for the registration and exits 0.
#   4. Receiver: a 64 MiB flow's OPEN waits for its consumer ring's
#      registration, held: the receiver's `flow show` says so, its
#      `status` answers, another flow moves every record, and the sender's
#      flow is still connecting.  Then the hold ends: the OPEN is answered
#      and the flow moves records.
#   5. Receiver: a flow destroyed on the receiver while its ring's
#      registration is held: the sender's open is refused with that
#      reason.  One destroyed on the sender meanwhile: the receiver's flow
#      goes with the sender's close, as after an answered open.  The
#      sending daemon killed while the receiver registers:
#      the receiver lives on, its flow waits for its sender, no
#      registration of it is left, and it stops cleanly.
#   6. Deregistrations (ibv_dereg_mr, which unpins every page) run off the
#      loop too, held the same way: a flow destroyed on the sender, then
#      the receiving daemon killed (its connection's rings go), then the
#      sender stopped, each while its deregistration is held: the sender
#      answers `status` and moves another flow's records meanwhile, logs
#      the deregistration only once the hold ends, its `status` counts the
#      held ring's bytes as pinned until then, and it exits 0 (under the
#      ASan build: the connection's PD freed after its last one, no leak).
set -euo pipefail
build=${1:?usage: reg-offloop.sh BUILD_DIR}
ip=${FM_RDMA_ADDR:-10.77.0.1}
port=7481
count=${FM_RDMA_RECORDS:-20000}
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-regoff   # $run, $pids, cleanup
need_rxe0
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
    within 60 grep -q "flow $2: registering its ring" "$run/$1.log" ||
        fail "moverd $1 never started registering flow $2's ring"
}

# ended16 NAME N: NAME's log says N registrations of 16 MiB ended
ended16() {
    [ "$(grep -c "ring registration of 16777216 bytes ended" "$run/$1.log")" -ge "$2" ]
}

# move FLOW N [FROM TO]: N records from daemon FROM (a) to TO (b) through
# FLOW, each checked by flowdemo
move() {
    FLOWMOVER_SOCKET=$run/${4:-b}.s timeout 120 "$build/libflowshm/flowdemo" \
        consume "$1" --count "$2" >"$run/c-$1.log" 2>&1 &
    local c=$!
    FLOWMOVER_SOCKET=$run/${3:-a}.s timeout 120 "$build/libflowshm/flowdemo" \
        produce "$1" --count "$2" --size 64 >"$run/p-$1.log" 2>&1 ||
        fail "producer of $1: $(cat "$run/p-$1.log")"
    wait "$c" || fail "consumer of $1: $(cat "$run/c-$1.log")"
    grep -q "consumer: $2 records" "$run/c-$1.log" ||
        fail "$1: $(cat "$run/c-$1.log")"
}

# still_held NAME: the hold is there and NAME has not ended big's
# registration
still_held() {
    if [ ! -e "$hold" ] || grep -q "flow big: ring registration .* ended" "$run/$1.log"; then
        fail "moverd $1 ended the registration of big's ring while held"
    fi
}

# release_big PHASE NAME WHAT [FROM TO]: the hold ends; big moves $count
# records (from FROM to TO, a and b by default) and NAME's log says its
# WHAT ring of big was registered off the loop
release_big() {
    rm -f "$hold"
    move big "$count" "${4:-a}" "${5:-b}"
    grep -q "flow big: ring registration of 67108864 bytes ended .*(registered)" "$run/$2.log" ||
        fail "moverd $2 did not register big's $3 ring off the loop"
    say "phase $1: PASS (big moved $count records once the hold ended)"
}

# no_reports NAME: NAME's log has no sanitizer report (the ASan build)
no_reports() {
    ! grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error" "$run/$1.log" ||
        fail "sanitizer report in $1.log"
}

# stops_clean PHASE NAME PID BEFORE: moverd NAME (PID) is alive, has at
# most BEFORE rings registered (sets $after), exits 0 on SIGTERM and
# logged no sanitizer report
stops_clean() {
    kill -0 "$3" || fail "moverd $2 died"
    after=$(registered "$2")
    [ "$after" -le "$4" ] || fail "registrations on $2: $4 before, $after after"
    kill "$3"
    wait "$3" || fail "moverd $2 exited with $? after phase $1"
    no_reports "$2"
}

# registered NAME: the rings registered on NAME's peer connections
registered() {
    ctl "$1" --json status | { grep -o '"registrations": *[0-9]*' || true; } |
        awk -F: '{ n += $2 } END { print n + 0 }'
}
# pinned NAME: the bytes NAME's status says its peers' rings pin
pinned() {
    ctl "$1" --json status | { grep -o '"registered_bytes": *[0-9]*' || true; } |
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
still_held a
say "phase 1: while big's ring registration was held: status and $count records of another flow answered"
release_big 1 a producer

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
# gone's, under way at the hold, ends; cut's, queued behind it, is dropped
# when its connection closes (before: pinned once the hold ended, then undone)
within 60 ended16 a 1 || fail "moverd a did not take gone's registration back"
grep -q "flow cut: ring registration of 16777216 bytes dropped before it began" "$run/a.log" ||
    fail "moverd a did not drop cut's queued registration with its connection"
# the connection to b is gone with small's and big's rings; nothing of
# gone's or cut's may be left on any connection
stops_clean 2 a "$a" "$before"
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
no_reports a3
kill "$b"; wait "$b" || fail "moverd b3 exited with $?"
say "phase 3: PASS (stopped while registering: exit 0)"

# ---- 4: the receiver's loop answers while its OPEN waits ---------------------
# (b4's registrations wait while $hold exists; a4's never do)
port=$((port + 2))
FLOWMOVER_TEST_REG_HOLD=$hold rdma_daemon b4 --listen "$ip:$port"; b=$pid
rdma_daemon a4; a=$pid
rdma_move() { move "$1" "$2" a4 b4; }
ctl a4 flow create small --peer "$ip:$port" --ring-size 1M >/dev/null
wait_flow a4 small 'state: *open'
rdma_move small 100
touch "$hold"
ctl a4 flow create big --peer "$ip:$port" --ring-size 64M >/dev/null
registering b4 big
ctl b4 flow show big | grep -q 'reason: *its ring is being registered' ||
    fail "flow big on b4: $(ctl b4 flow show big 2>&1)"
ctl b4 status >/dev/null || fail "moverd b4 did not answer status while registering"
rdma_move small "$count"
ctl a4 flow show big | grep -q 'state: *connecting' ||
    fail "flow big on a4 while b4 registers: $(ctl a4 flow show big 2>&1)"
still_held b4
say "phase 4: while big's consumer ring registration was held: flow show, status and $count records of another flow answered; the sender still connecting"
release_big 4 b4 consumer a4 b4

# ---- 5: the receiver's flow destroyed, its sender killed, while registering --
before=$(registered b4)
touch "$hold"
ctl a4 flow create gone --peer "$ip:$port" --ring-size 16M >/dev/null
registering b4 gone
ctl b4 flow destroy gone >/dev/null || fail "flow destroy gone on b4"
rm -f "$hold"
wait_flow a4 gone 'destroyed on this host while its ring was being registered'
ctl a4 flow destroy gone >/dev/null || fail "flow destroy gone on a4"
# the sender closes its flow while the receiver's answer waits: the
# receiver's flow goes, as after an answered open
touch "$hold"
ctl a4 flow create closed --peer "$ip:$port" --ring-size 16M >/dev/null
registering b4 closed
ctl a4 flow destroy closed >/dev/null || fail "flow destroy closed on a4"
gone_on() { ! ctl "$1" flow show "$2" >/dev/null 2>&1; }
within 60 gone_on b4 closed ||
    fail "flow closed on b4 outlived its sender's close: $(ctl b4 flow show closed 2>&1)"
ctl a4 flow create cut --peer "$ip:$port" --ring-size 16M >/dev/null
registering b4 cut
kill -9 "$a"; wait "$a" 2>/dev/null || true
ctl b4 status >/dev/null || fail "moverd b4 stopped answering"
rm -f "$hold"
# gone's and closed's end; cut's, queued behind closed's at the hold, is
# dropped with the sender's connection (before: pinned, then undone)
within 60 ended16 b4 2 || fail "moverd b4 did not take its two registrations back"
grep -q "flow cut: ring registration of 16777216 bytes dropped before it began" "$run/b4.log" ||
    fail "moverd b4 did not drop cut's queued registration with its connection"
# the sender's connection is gone, and with it what was registered there
wait_flow b4 cut 'state: *reconnecting'
stops_clean 5 b4 "$b" "$before"
say "phase 5: PASS (the destroyed flow's open refused with its reason; the closed flow gone; the sender's death left $after registration(s), $before before)"

# ---- 6: deregistrations held: the loop answers, moves, and stops -------------
port=$((port + 1))
rdma_daemon b6 --listen "$ip:$port"; b=$pid
held_daemon a6; a=$pid
# dereg_ended NAME FLOW BYTES: NAME's log says FLOW's deregistration ended
dereg_ended() {
    grep -q "flow $2: ring deregistration of $3 bytes ended" "$run/$1.log"
}
for f in small big; do
    ctl a6 flow create "$f" --peer "$ip:$port" \
        --ring-size "$([ $f = big ] && echo 64M || echo 1M)" >/dev/null
    wait_flow a6 "$f" 'state: *open'
    move "$f" 100 a6 b6     # both of its rings are registered now
done
touch "$hold"
ctl a6 flow destroy big >/dev/null || fail "flow destroy big on a6"
ctl a6 status >/dev/null || fail "moverd a6 did not answer status while deregistering"
move small "$count" a6 b6
! dereg_ended a6 big 67108864 || fail "moverd a6 deregistered big's ring while held"
# status counts what is still pinned: big's ring until its end, then not
held_pins=$(pinned a6)
[ "$held_pins" -ge 67108864 ] ||
    fail "moverd a6's status says $held_pins bytes pinned while big's 64 MiB deregistration is held"
rm -f "$hold"
within 60 dereg_ended a6 big 67108864 ||
    fail "moverd a6 never deregistered big's ring once the hold ended"
unpinned() { [ "$(pinned a6)" -lt 67108864 ]; }
within 10 unpinned || fail "moverd a6's status says $(pinned a6) bytes pinned after big's deregistration"
after_pins=$(pinned a6)
big_ms=$(grep -o "flow big: ring deregistration of 67108864 bytes ended in [0-9.]* ms" "$run/a6.log" |
    awk '{ print $(NF - 1) }')
touch "$hold"
kill -9 "$b"; wait "$b" 2>/dev/null || true
wait_flow a6 small 'state: *reconnecting'   # its connection closed
ctl a6 status >/dev/null || fail "moverd a6 stopped answering"
! dereg_ended a6 small 1048576 || fail "moverd a6 deregistered small's ring while held"
kill "$a"
sleep 2      # not a threshold: the daemon must still be waiting, or done
rm -f "$hold"
wait "$a" || fail "moverd a6 exited with $? when stopped while deregistering"
dereg_ended a6 small 1048576 || fail "moverd a6 stopped without deregistering small's ring"
no_reports a6
say "phase 6: PASS (deregistrations held: status ($held_pins bytes pinned, then $after_pins) and $count records answered; each ended once the hold did, big's 64 MiB in $big_ms ms off the loop; stopped cleanly)"
say "PASS"
