#!/bin/bash
# demo.sh - build flowmover, start moverd on a private socket, create a flow,
# run a producer process and a consumer process through it, print the rates.
# Usage: contrib/demo.sh [--count N] [--size BYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
count=20000000
size=64
while [ $# -gt 0 ]; do
    case $1 in
        --count) count=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        *) echo "usage: $0 [--count N] [--size BYTES]" >&2; exit 2 ;;
    esac
done

contrib/install-deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target moverd moverctl flowdemo >/dev/null

run=$(mktemp -d /tmp/flowmover-demo.XXXXXX)
export FLOWMOVER_SOCKET=$run/moverd.sock
bin=build
cleanup() {
    [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    rm -rf "$run"
}
trap cleanup EXIT

"$bin/moverd/moverd" --foreground --log-level warn &
daemon=$!
for _ in $(seq 100); do
    "$bin/control/moverctl" status >/dev/null 2>&1 && break
    sleep 0.05
done
"$bin/control/moverctl" flow create demo --ring-size 4M --max-record 64K
"$bin/libflowshm/flowdemo" consume demo --count "$count" &
consumer=$!
"$bin/libflowshm/flowdemo" produce demo --count "$count" --size "$size"
wait "$consumer"
"$bin/control/moverctl" flow show demo
"$bin/control/moverctl" flow destroy demo
