# tests/rdma/common.sh - sourced by the test scripts that run in the guest
# (moverd-rdma.sh, moverd-pair.sh): `. common.sh NAME` makes a scratch
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
