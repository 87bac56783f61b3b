#!/bin/bash
# tests/rdma/perftest.sh — reference RDMA figures from perftest on soft-RoCE.
#
# Runs INSIDE the soft-RoCE guest (see tests/rdma/run-perftest-in-vm.sh and
# contrib/softroce/vm-run.sh): checks that rxe0 is PORT_ACTIVE, then runs
# ib_write_bw and ib_write_lat server/client pairs in this machine against its
# own address (rxe delivers to itself) at 32 B and 64 KiB. Fails if any of
# them fails; prints their figures, one "PERFTEST ..." line per run.
#
# Exit 77 (skipped) when there is no such RDMA device, e.g. on a plain host.
#
# Environment (defaults suit the guest of vm-run.sh):
#   RDMA_DEV=rxe0  RDMA_ADDR=10.77.0.1  PERFTEST_DURATION=2 (s, bw tests)
#   PERFTEST_LAT_ITERS=1000 (lat tests)

set -euo pipefail

DEV=${RDMA_DEV:-rxe0}
ADDR=${RDMA_ADDR:-10.77.0.1}
DURATION=${PERFTEST_DURATION:-2}
LAT_ITERS=${PERFTEST_LAT_ITERS:-1000}
SIZES=(32 65536)
PORT=18600          # each server/client pair gets its own TCP port
STEP_TIMEOUT=120    # seconds; a hung perftest must not hang the run

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILED=0

log()  { echo "perftest.sh: $*"; }
fail() { echo "perftest.sh: FAIL: $*" >&2; FAILED=1; }
# shellcheck source=tests/rdma/perftest-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/perftest-lib.sh"   # run_pair, result_line
skip() { echo "SKIPPED: $*" >&2; exit 77; }

# rxe0 must exist and its port must be active.
check_device() {
    command -v ib_write_bw >/dev/null || skip "perftest is not installed"
    [ -d "/sys/class/infiniband/$DEV" ] ||
        skip "no RDMA device $DEV here (run tests/rdma/run-perftest-in-vm.sh)"
    if ! ibv_devinfo -d "$DEV" >"$WORK/devinfo" 2>&1 ||
       ! grep -q 'state:[[:space:]]*PORT_ACTIVE' "$WORK/devinfo"; then
        cat "$WORK/devinfo"
        echo "perftest.sh: FAIL: $DEV port is not PORT_ACTIVE" >&2
        exit 1
    fi
    log "$DEV: $(grep -E 'state:|active_mtu:|link_layer:' "$WORK/devinfo" |
                 awk '{ $1 = $1; print }' | paste -sd ';')"
}

# bw columns: #bytes #iterations BW-peak BW-average[MB/sec] MsgRate[Mpps]
bw_test() {
    local size=$1 line
    run_pair ib_write_bw "$size" -D "$DURATION" || return 0
    line=$(result_line "$size")
    [ -n "$line" ] || { log "FAIL: no result from ib_write_bw -s $size"; cat "$WORK/client"; FAILED=1; return 0; }
    echo "$line" | awk '{ printf "PERFTEST ib_write_bw  size=%-6s msg_per_s=%.0f MB_per_s=%s\n", $1, $5 * 1e6, $4 }'
}

# lat columns: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (usec)
lat_test() {
    local size=$1 line
    run_pair ib_write_lat "$size" -n "$LAT_ITERS" || return 0
    line=$(result_line "$size")
    [ -n "$line" ] || { log "FAIL: no result from ib_write_lat -s $size"; cat "$WORK/client"; FAILED=1; return 0; }
    echo "$line" | awk '{ printf "PERFTEST ib_write_lat size=%-6s typical_us=%s avg_us=%s p99_us=%s\n", $1, $5, $6, $8 }'
}

main() {
    local size
    check_device
    for size in "${SIZES[@]}"; do bw_test "$size"; done
    for size in "${SIZES[@]}"; do lat_test "$size"; done
    if [ "$FAILED" != 0 ]; then
        echo "perftest.sh: FAIL" >&2
        exit 1
    fi
    log "PASS"
}

main "$@"
