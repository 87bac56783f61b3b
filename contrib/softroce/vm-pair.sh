#!/bin/bash
# vm-pair.sh — two soft-RoCE guests as two RDMA hosts: runs a command in
# each and brings back both outputs and exit statuses.
#
# Usage: contrib/softroce/vm-pair.sh [--timeout SECS] [--cache DIR] [--verbose]
#            -- COMMAND_A [ARGS...] [::: COMMAND_B [ARGS...]]
#
# Guest a (10.78.0.1) and guest b (10.78.0.2) each have a virtio NIC, eth0,
# with rxe0 bound to it; the NICs are joined by a QEMU socket link (guest a's
# QEMU listens on a free port of 127.0.0.1, guest b's connects). Guest a runs
# COMMAND_A, guest b COMMAND_B (COMMAND_A too if there is no ":::"); both get
# FM_ROLE (a or b), FM_ADDR and FM_PEER_ADDR in their environment. Each guest
# is one vm-run.sh with -smp 1, so the pair fits on two host cores.
#
# Output lines are prefixed "[a] " or "[b] ". Exit status: 0 when both
# commands exit 0; otherwise that of the first guest to end with a non-zero
# status (77 = skipped, 124 = timed out, anything else = failed). The other
# guest is then stopped: it would only wait for its peer until it timed out.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_RUN="$HERE/vm-run.sh"
GUEST_ARGS=(--smp 1 --mem 1024)   # two guests share the host's two cores
PASS_ARGS=()                      # options passed on to both vm-run.sh
declare -A PIDS=()                # role -> pid of its vm-run.sh
PREFIX_PIDS=()

log() { echo "vm-pair: $*" >&2; }

usage() {
    echo "usage: $0 [--timeout SECS] [--cache DIR] [--verbose]" \
         "-- COMMAND_A [ARGS...] [::: COMMAND_B [ARGS...]]" >&2
    exit 2
}

# Sets PASS_ARGS, CMD_A and CMD_B.
parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --timeout|--cache) [ $# -ge 2 ] || usage; PASS_ARGS+=("$1" "$2"); shift 2 ;;
            -v|--verbose) PASS_ARGS+=("$1"); shift ;;
            --) shift; break ;;
            *) usage ;;
        esac
    done
    CMD_A=()
    while [ $# -gt 0 ] && [ "$1" != ":::" ]; do CMD_A+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    CMD_B=("$@")
    [ ${#CMD_A[@]} -gt 0 ] || usage
    [ ${#CMD_B[@]} -gt 0 ] || CMD_B=("${CMD_A[@]}")
}

# A TCP port nothing on this host uses (any state, IPv4 or IPv6), for the
# link between the two QEMUs.
pick_port() {
    local port _
    for _ in $(seq 100); do
        port=$((20000 + RANDOM % 40000))
        cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
            awk -v p="$(printf ':%04X' "$port")" '$2 ~ p"$" { f = 1 } END { exit f }' &&
            { echo "$port"; return 0; }
    done
    log "error: no free TCP port found"
    exit 1
}

# start_guest ROLE NET_OPTION COMMAND...: one vm-run.sh in the background,
# its stdout and stderr read through FIFOs by prefixing processes we can
# wait for (so no line is lost or printed after we exit).
start_guest() {
    local role=$1 net=$2
    shift 2
    mkfifo "$FIFOS/$role.out" "$FIFOS/$role.err"
    sed -u "s/^/[$role] /" <"$FIFOS/$role.out" &
    PREFIX_PIDS+=($!)
    sed -u "s/^/[$role] /" <"$FIFOS/$role.err" >&2 &
    PREFIX_PIDS+=($!)
    "$VM_RUN" "${PASS_ARGS[@]}" "${GUEST_ARGS[@]}" --role "$role" "$net" "$PORT" -- "$@" \
        >"$FIFOS/$role.out" 2>"$FIFOS/$role.err" &
    PIDS[$role]=$!
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$FIFOS"
}

# Wait for both guests. The first non-zero status decides, and the other
# guest is stopped. Sets STATUS.
wait_guests() {
    local pid st role r
    STATUS=0
    while [ ${#PIDS[@]} -gt 0 ]; do
        st=0
        wait -n -p pid "${PIDS[@]}" || st=$?
        for r in "${!PIDS[@]}"; do [ "${PIDS[$r]}" = "$pid" ] && role=$r; done
        unset "PIDS[$role]"
        log "guest $role: exit status $st"
        if [ "$st" != 0 ] && [ "$STATUS" = 0 ]; then
            STATUS=$st
            for r in "${!PIDS[@]}"; do
                log "stopping guest $r: guest $role ended with status $st"
                kill "${PIDS[$r]}" 2>/dev/null || true
            done
        fi
    done
}

main() {
    local start
    parse_args "$@"
    FIFOS=$(mktemp -d "${TMPDIR:-/tmp}/flowmover-pair.XXXXXX")
    trap cleanup EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    PORT=$(pick_port)
    start=$EPOCHREALTIME
    # a listens, b connects (its vm-run.sh waits until a's QEMU listens)
    start_guest a --net-listen "${CMD_A[@]}"
    start_guest b --net-connect "${CMD_B[@]}"
    wait_guests
    wait "${PREFIX_PIDS[@]}" 2>/dev/null || true
    log "both guests done in $(awk -v a="$start" -v b="$EPOCHREALTIME" \
        'BEGIN { printf "%.1f", b - a }') s wall; exit status $STATUS"
    exit "$STATUS"
}

main "$@"
