#!/bin/bash
# tests/rdma/run-perftest-in-vm.sh — host side of tests/rdma/perftest.sh:
# boots the soft-RoCE guest (contrib/softroce/vm-run.sh) and runs perftest.sh
# in it. Exit status is perftest.sh's; 77 (skipped) if the guest cannot start.
#
# Usage: tests/rdma/run-perftest-in-vm.sh [vm-run.sh options]
#   e.g. --timeout 300 --cache DIR. PERFTEST_* settings: see perftest.sh.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

# The guest starts with a clean environment: pass our PERFTEST_* settings on.
ENV_ARGS=()
for var in PERFTEST_DURATION PERFTEST_LAT_ITERS; do
    [ -n "${!var:-}" ] && ENV_ARGS+=("$var=${!var}")
done

exec "$ROOT/contrib/softroce/vm-run.sh" "$@" -- \
    env "${ENV_ARGS[@]}" "$HERE/perftest.sh"
