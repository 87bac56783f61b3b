# tests/rdma/perftest-lib.sh - sourced by the scripts that run perftest in
# the guest (perftest.sh, bench-in-vm.sh): one server/client pair at a time
# against our own address.  The caller sets DEV, ADDR, PORT (the next free
# TCP port; each pair takes one), WORK (a scratch dir), STEP_TIMEOUT (s)
# and defines fail MESSAGE (report and remember a failure, do not exit).
# shellcheck shell=bash

# Wait until something listens on TCP port $1 (perftest's out-of-band
# exchange), reading /proc/net/tcp{,6}: state 0A is LISTEN.
wait_listening() {
    local hex _
    hex=$(printf ':%04X' "$1")
    for _ in $(seq 1 300); do
        if cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
           awk -v p="$hex" '$2 ~ p"$" && $4 == "0A" { found = 1 } END { exit !found }'; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# run_pair TOOL SIZE ARGS...: server in the background, client against
# ADDR; both must succeed. Leaves the client output in $WORK/client.
run_pair() {
    local tool=$1 size=$2 port=$((PORT++)) server_status=0 client_status=0
    shift 2
    local args=(-d "$DEV" -s "$size" -p "$port" -F "$@")

    timeout "$STEP_TIMEOUT" "$tool" "${args[@]}" >"$WORK/server" 2>&1 &
    local server=$!
    if ! wait_listening "$port"; then
        kill "$server" 2>/dev/null || true
    fi
    timeout "$STEP_TIMEOUT" "$tool" "${args[@]}" "$ADDR" >"$WORK/client" 2>&1 ||
        client_status=$?
    wait "$server" || server_status=$?

    if [ "$client_status" != 0 ] || [ "$server_status" != 0 ]; then
        fail "$tool -s $size $*: client status $client_status, server status $server_status"
        echo "---- server ----"; cat "$WORK/server"
        echo "---- client ----"; cat "$WORK/client"
        return 1
    fi
}

# The figures line is the one that starts with the message size.
result_line() {
    awk -v s="$1" '$1 == s && NF >= 5 { line = $0 } END { print line }' "$WORK/client"
}
