# tests/rdma/common.sh - sourced by the test scripts that run in the guest
# (moverd-rdma.sh, moverd-pair.sh, device-removal.sh, reg-offloop.sh,
# flow-alone.sh, stranger.sh, ...): `. common.sh NAME` makes a scratch
# directory $run (/tmp/NAME.XXXXXX, the guest's tmpfs) and an empty list
# $pids; at exit every process in $pids is killed and $run removed, so a
# failed check leaves no daemon or client behind to keep the guest busy.
# Only those are waited for: a process stuck in the kernel (a blocked
# `rdma link delete`) must not keep a failed test from reporting.
# shellcheck shell=bash
run=$(mktemp -d "/tmp/${1:?usage: . common.sh NAME}.XXXXXX")
pids=()

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}" 2>/dev/null || true
    rm -rf "$run"
}
trap cleanup EXIT

# fail WHY: say it and the tail of every log in $run, and exit 1; say
# WHAT: a line of progress; both named after the script.  A script with
# more to do on failure (moverd-pair.sh) defines its own after this.
me=$(basename "$0")
fail() {
    echo "$me: FAIL: $*" >&2
    for f in "$run"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done >&2
    exit 1
}
say() { echo "$me: $*"; }

# need_rxe0: skipped (exit 77) outside the soft-RoCE guest; rings are
# registered (pinned) beyond the default memlock limit
need_rxe0() {
    [ -d /sys/class/infiniband/rxe0 ] ||
        { echo "SKIPPED: no rxe0 (run this inside contrib/softroce/vm-run.sh)" >&2; exit 77; }
    ulimit -l unlimited
}

# The helpers below need the caller's $build, ctl (moverctl on
# $run/NAME.s) and fail.
#
# start_daemon NAME [ARGS...]: moverd in the background on $run/NAME.s
# with its rings in $run/NAME.rings, its log in $run/NAME.log, proving
# $run/peer.key (made on first use: an address off loopback needs one),
# until it answers; sets $pid
start_daemon() {
    local name=$1
    shift
    [ -e "$run/peer.key" ] || "$build/control/moverctl" keygen "$run/peer.key" >/dev/null
    "$build/moverd/moverd" -f --socket "$run/$name.s" \
        --state-dir "$run/$name.rings" --peer-key "$run/peer.key" \
        "$@" >>"$run/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 200); do
        ctl "$name" status >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || fail "moverd $name exited at start"
        sleep 0.05
    done
    fail "moverd $name did not start"
}

# within SECS CMD...: CMD again every 0.1 s until it succeeds (0) or SECS
# have passed (1).  A clock, not a count of tries: under TCG a fork and
# exec of a small command takes a good part of a second.
within() {
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.1
    done
}

# flow_matches NAME FLOW REGEX: `flow show` on NAME matches (the state or
# the reason)
flow_matches() { ctl "$1" flow show "$2" 2>/dev/null | grep -Eq "$3"; }

# wait_flow NAME FLOW REGEX: until flow_matches; 60 s is a liveness bound
# for an emulated guest
wait_flow() {
    within 60 flow_matches "$@" ||
        fail "flow $2 on $1 never matched '$3': $(ctl "$1" flow show "$2" 2>&1)"
}
