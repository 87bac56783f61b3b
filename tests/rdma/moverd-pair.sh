#!/bin/bash
# moverd-pair.sh BUILD_DIR - runs INSIDE both guests of a soft-RoCE pair
# (contrib/softroce/vm-pair.sh): moverd on two hosts, flows between them
# over RDMA across the guests' link.
#   guest a (FM_ROLE=a): the sending host: moverd A, flows to moverd B,
#                        producers (flowcheck: random sizes, numbered,
#                        checkable contents);
#   guest b (FM_ROLE=b): the receiving host: moverd B listening on
#                        FM_ADDR:7471 over RDMA, consumers that check the
#                        size, number and every byte of each record.
# Every record must arrive exactly once: each consumer gets exactly the
# expected records in order, nothing after them, and moverd B's published
# position of each flow equals moverd A's (no byte more, none less).
#
# The guests share only the network, so they coordinate over one TCP
# connection that b opens to a (port 7470), one line per message:
#   b: ready             moverd B is up: a creates its flows only now, so
#                        they connect at once instead of after a back-off
#   b: done FLOW=POS...  every consumer got every record; B's positions
#   a: ok                a's checks passed
#   either: fail REASON  the sender gave up (the other stops too)
# a listens (busybox nc: bash can connect but not listen), b connects.
# Neither guest powers off before it knows the other has its last message:
# a waits for "done" (moverd A going down earlier would strand records in
# flight), b waits for a's answer, and a for b to close the connection.
#
# Environment: FM_ROLE, FM_ADDR, FM_PEER_ADDR (from vm-run.sh --role);
# FM_PAIR_RECORDS records per producer (default 4000); FM_PAIR_WAIT seconds
# to wait for the peer, the records, the verdict (default 300); FM_PAIR_SKIP=SEQ
# makes a producer leave out record SEQ (a dropped record: the test must
# fail; for checking the test by hand).
set -euo pipefail
build=${1:?usage: moverd-pair.sh BUILD_DIR}
role=${FM_ROLE:?FM_ROLE unset: run me with contrib/softroce/vm-pair.sh}
addr=${FM_ADDR:?} peer=${FM_PEER_ADDR:?}
port=7471           # moverd B's peer port (TCP and RDMA CM)
chan_port=7470      # the control channel, on a
count=${FM_PAIR_RECORDS:-4000}
flows=3
producers=2         # per flow
wait_s=${FM_PAIR_WAIT:-300}  # s, for the peer, the records, the verdict: generous (TCG)
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-pair   # $run, $pids, cleanup

log() { echo "moverd-pair.sh[$role]: $*"; }
fail() {
    echo "moverd-pair.sh[$role]: FAIL: $*" >&2
    { echo "fail $*" >&3; } 2>/dev/null || true   # tell the other guest
    for f in "$run"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done >&2
    exit 1
}

ctl() { "$build/control/moverctl" --socket "$run/$role/s" "$@"; }
# json FIELD: the value of FIELD in moverctl's JSON on stdin (one per line)
json() { sed -n "s/^ *\"$1\": *\"\{0,1\}\([^\",]*\).*/\1/p" | head -n1; }

start_moverd() {
    local status
    "$build/moverd/moverd" -f --socket "$run/$role/s" --transport rdma "$@" \
        >"$run/moverd-$role.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do ctl status >/dev/null 2>&1 && break; sleep 0.05; done
    status=$(ctl status) || fail "moverd did not start"
    grep -q '^transports:.*rdma' <<<"$status" || fail "moverd has no RDMA: $status"
}

# flow_is FLOW FIELD VALUE: moverctl flow show --json says so
flow_is() { [ "$(ctl --json flow show "$1" | json "$2")" = "$3" ]; }

# wait_for TEST...: until TEST succeeds; fails after $wait_s seconds
wait_for() {
    local end=$((SECONDS + wait_s))
    until "$@"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.2
    done
}

# ---- guest a: the sending host ---------------------------------------------

# The channel: nc's output (b's lines) in $run/chan; a's lines go to fd 3,
# the FIFO nc reads; $run/chan.closed appears when b has closed.
chan_listen() {
    mkfifo "$run/chan.in"
    { busybox nc -l -p "$chan_port" <"$run/chan.in" >"$run/chan" 2>"$run/nc.log"
      : >"$run/chan.closed"; } &
    pids+=($!)
    exec 3<>"$run/chan.in"
}

chan_has() { grep -q "^$1" "$run/chan" || grep -q '^fail' "$run/chan"; }

# chan_wait WORD: until b's line WORD (or fail) arrives; sets CHAN_LINE
chan_wait() {
    wait_for chan_has "$1" || fail "no '$1' from guest b ($peer) in $wait_s s"
    if grep -q '^fail' "$run/chan"; then fail "guest b: $(grep '^fail' "$run/chan")"; fi
    CHAN_LINE=$(grep "^$1" "$run/chan")
}

create_flows() {
    local i
    for i in $(seq $flows); do
        ctl flow create "r$i" --ring-size 1M --max-record 64K --peer "$peer:$port" >/dev/null
    done
    for i in $(seq $flows); do
        wait_for flow_is "r$i" state open || fail "flow r$i did not open: $(ctl flow show "r$i")"
        flow_is "r$i" transport rdma || fail "flow r$i is not on RDMA: $(ctl flow show "r$i")"
    done
    ctl flow list
}

run_producers() {
    local i id skip prods=()
    for i in $(seq $flows); do
        for id in $(seq $producers); do
            skip=()
            [ "$i$id" = 11 ] && [ -n "${FM_PAIR_SKIP:-}" ] && skip=(--skip "$FM_PAIR_SKIP")
            FLOWMOVER_SOCKET=$run/a/s timeout "$wait_s" "$build/tests/flowcheck" produce "r$i" --id "$id" \
                --count "$count" "${skip[@]}" >"$run/p$i.$id.log" 2>&1 &
            prods+=($!)
            pids+=($!)
        done
    done
    for i in "${!prods[@]}"; do
        wait "${prods[$i]}" || fail "a producer failed (see the logs)"
    done
    cat "$run"/p*.log
}

# B's published position of each flow must be A's: every byte A's
# producers committed arrived, and nothing else. A's acknowledged bytes
# too: moverd A knows it was all delivered. Sets total (bytes, all flows).
compare_positions() {
    local done_line=$1 i tail_a acked pos_b
    total=0
    for i in $(seq $flows); do
        tail_a=$(ctl --json flow show "r$i" | json tail)
        acked=$(ctl --json flow show "r$i" | json bytes_acked)
        pos_b=$(tr ' ' '\n' <<<"$done_line" | sed -n "s/^r$i=//p")
        [ "$pos_b" = "$tail_a" ] || fail "r$i: moverd B published $pos_b bytes, A's producers wrote $tail_a"
        [ "$acked" = "$tail_a" ] || fail "r$i: moverd A has $acked of $tail_a bytes acknowledged"
        log "r$i: $tail_a bytes written on a, published on b, acknowledged"
        total=$((total + tail_a))
    done
}

role_a() {
    local start elapsed
    chan_listen     # b retries until a listens
    start_moverd
    chan_wait ready
    log "moverd B is up on $peer; creating $flows flows to it"
    create_flows
    start=$EPOCHREALTIME
    run_producers
    ctl status
    chan_wait "done"
    compare_positions "$CHAN_LINE"
    # for information only: it includes the consumers' checks and our polls
    elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    log "$((total / 1000000)) MB of ring moved and checked in $elapsed s"
    echo ok >&3
    wait_for test -e "$run/chan.closed" || log "guest b did not close the channel"
    log "PASS ($flows flows x $producers producers x $count records, a -> b over RDMA)"
}

# ---- guest b: the receiving host -------------------------------------------

chan_connect() { exec 3<>"/dev/tcp/$peer/$chan_port"; } 2>/dev/null
flows_here() { [ "$(ctl --json flow list | grep -c '"name"')" = $flows ]; }

run_consumers() {
    local i cons=()
    for i in $(seq $flows); do
        FLOWMOVER_SOCKET=$run/b/s timeout "$wait_s" "$build/tests/flowcheck" consume "r$i" \
            --producers $producers --count "$count" >"$run/c$i.log" 2>&1 &
        cons+=($!)
        pids+=($!)
    done
    for i in $(seq $flows); do
        wait "${cons[$((i - 1))]}" || fail "consumer of r$i failed: $(cat "$run/c$i.log")"
    done
    cat "$run"/c*.log
}

# Every flow drained (head = tail) and on RDMA; sets positions to
# "r1=POS r2=POS ...".
positions_b() {
    local i json out=()
    for i in $(seq $flows); do
        json=$(ctl --json flow show "r$i")
        [ "$(json transport <<<"$json")" = rdma ] || fail "flow r$i is not on RDMA: $json"
        [ "$(json head <<<"$json")" = "$(json tail <<<"$json")" ] || fail "r$i not drained: $json"
        out+=("r$i=$(json tail <<<"$json")")
    done
    positions=${out[*]}
}

role_b() {
    local positions answer
    # two guests with no shared secret: unauthenticated on purpose (the
    # handshake is tested by test_auth; this script measures the transport)
    start_moverd --listen "$addr:$port" --insecure-peers
    wait_for chan_connect || fail "cannot reach guest a ($peer:$chan_port) in $wait_s s"
    echo ready >&3
    log "moverd B is up; told guest a"
    wait_for flows_here || fail "the flows from a did not arrive: $(ctl flow list)"
    run_consumers
    positions_b
    ctl status
    echo "done $positions" >&3
    read -r -t "$wait_s" answer <&3 || fail "no answer from guest a"
    [ "$answer" = ok ] || fail "guest a: $answer"
    exec 3>&-
    log "PASS (consumers got every record; positions $positions; guest a agrees)"
}

ulimit -l unlimited
mkdir -p "$run/$role"
case "$role" in
    a) role_a ;;
    b) role_b ;;
    *) fail "FM_ROLE must be a or b" ;;
esac
