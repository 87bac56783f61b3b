#!/bin/bash
# stranger.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh): what
# moverd pins for RDMA peers that connect and never say hello (the audit of
# 2026-11-28: 5.2 MiB each, receive buffers and the staging buffer
# registered at accept, times --peer-max-pending).  N strangers
# (tests/rdma/stranger.c) connect to a listening moverd; its VmPin while
# they wait must grow by less than 1 MiB per stranger.  A stranger that
# posts an RDMA WRITE with immediate data (completing as an opcode the
# protocol never uses) is disconnected with the reason logged.  Then a
# real peer moves records over the same daemon: once authenticated, a
# connection gets all of its buffers.  A stranger whose connection never
# comes up (it never sends its RTU) is dropped at the hello deadline, which
# runs from its connect request; a connect of moverd's to a listener that
# never answers gives up after --peer-connect-timeout.
set -euo pipefail
build=${1:?usage: stranger.sh BUILD_DIR}
ip=10.77.0.1
port=7475
n=6            # below --peer-max-conns-per-addr (8)
count=100000
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-stranger   # $run, $pids, cleanup
need_rxe0
moverd=$build/moverd/moverd
ctl() { "$build/control/moverctl" --socket "$run/$1.s" "${@:2}"; }
pinned_kib() { awk '/^VmPin:/ { print $2 }' "/proc/$1/status"; }
"$build/control/moverctl" keygen "$run/peer.key" >/dev/null
# each daemon a state directory of its own (with both sockets in $run,
# both defaulted to $run/rings: B took A's state file of flow r for a flow
# of its own it had not re-adopted, and refused the open)
"$moverd" -f --socket "$run/b.s" --state-dir "$run/b.rings" \
    --listen "$ip:$port" --transport rdma \
    --peer-key "$run/peer.key" --peer-hello-timeout 60 >"$run/b.log" 2>&1 &
b=$!
pids+=("$b")
for _ in $(seq 100); do ctl b status >/dev/null 2>&1 && break; sleep 0.05; done
ctl b status >/dev/null || fail "moverd B did not start"

before=$(pinned_kib "$b")
for i in $(seq $n); do
    "$build/tests/rdma_stranger" "$ip" "$port" 30 >"$run/st$i.log" 2>&1 &
    pids+=($!)
done
for _ in $(seq 200); do
    [ "$(cat "$run"/st*.log 2>/dev/null | grep -c connected)" = $n ] && break
    sleep 0.1
done
[ "$(cat "$run"/st*.log | grep -c connected)" = $n ] || fail "the strangers did not connect"
sleep 1
during=$(pinned_kib "$b")
per=$(( (during - before) / n ))
echo "stranger.sh: $n strangers connected, moverd's VmPin $before -> $during KiB ($per KiB each)"
[ "$per" -lt 1024 ] || fail "$per KiB pinned per unauthenticated connection"

# a stranger that WRITEs with immediate data (0 bytes, no rkey, no hello):
# an opcode the protocol never uses fails its connection, and only it
"$build/tests/rdma_stranger" "$ip" "$port" 20 imm >"$run/imm.out" 2>&1 ||
    fail "the imm stranger: $(cat "$run/imm.out")"
cat "$run/imm.out"
grep -q disconnected "$run/imm.out" || fail "moverd kept the connection of a WRITE with immediate data"
grep -q "RDMA write with immediate data" "$run/b.log" || fail "moverd did not say why it dropped it"
kill -0 "$b" || fail "moverd died"

# a connection that never comes up (the stranger reads no CM event, so
# librdmacm never sends the RTU) holds its queue pair and pinned buffers,
# and a place among --peer-max-pending, until the hello deadline counted
# from its connect request (rdma_cm alone keeps it for minutes); and a
# connect to a listener that never answers times out as over TCP
"$moverd" -f --socket "$run/c.s" --state-dir "$run/c.rings" \
    --listen "$ip:$((port + 1))" --transport rdma --peer-key "$run/peer.key" \
    --peer-hello-timeout 2 --peer-connect-timeout 2 >"$run/c.log" 2>&1 &
mc=$!
pids+=("$mc")
within 20 ctl c status >/dev/null 2>&1 || fail "moverd C did not start"
"$build/tests/rdma_stranger" "$ip" "$((port + 1))" 60 nortu >"$run/nortu.out" 2>&1 &
pids+=($!)
within 30 grep -q "no hello within 2 s: its connection never came up" "$run/c.log" ||
    fail "moverd kept a connection that never came up: $(cat "$run/nortu.out")"
"$build/tests/rdma_stranger" "$ip" "$((port + 2))" 60 deaf >"$run/deaf.out" 2>&1 &
pids+=($!)
within 20 grep -q listening "$run/deaf.out" || fail "the deaf listener: $(cat "$run/deaf.out")"
ctl c flow create d --ring-size 1M --max-record 4K --peer "$ip:$((port + 2))" >/dev/null
within 30 grep -q "connect to $ip:$((port + 2)): timed out after 2 s" "$run/c.log" ||
    fail "a connect to a listener that never answers did not time out"
kill -0 "$mc" || fail "moverd C died"
echo "stranger.sh: a connection that never came up dropped after 2 s; a connect to a deaf listener timed out after 2 s"

# a real peer beside them: every buffer once authenticated
"$moverd" -f --socket "$run/a.s" --state-dir "$run/a.rings" --transport rdma \
    --peer-key "$run/peer.key" >"$run/a.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do ctl a status >/dev/null 2>&1 && break; sleep 0.05; done
ctl a flow create r --ring-size 1M --max-record 4K --peer "$ip:$port" >/dev/null
for _ in $(seq 100); do ctl b flow show r >/dev/null 2>&1 && break; sleep 0.1; done
FLOWMOVER_SOCKET=$run/b.s "$build/libflowshm/flowdemo" consume r --count $count \
    >"$run/c.log" 2>&1 &
c=$!
FLOWMOVER_SOCKET=$run/a.s "$build/libflowshm/flowdemo" produce r --count $count \
    --size 100 >"$run/p.log" 2>&1 || fail "producer: $(cat "$run/p.log")"
wait "$c" || fail "consumer: $(cat "$run/c.log")"
grep -q "consumer: $count records" "$run/c.log" || fail "$(cat "$run/c.log")"
ctl a flow show r | grep -q 'transport: *rdma' || fail "flow r is not on RDMA"
echo "stranger.sh: a real peer moved $count records over RDMA beside them"
echo "stranger.sh: PASS"
