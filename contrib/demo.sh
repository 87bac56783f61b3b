#!/bin/bash
# demo.sh - build flowmover, start two moverd daemons on loopback (the
# producer's host and the consumer's host), create a flow between them, run
# a producer process against one and a consumer process against the other,
# and print the rates.  No RDMA hardware needed: the daemons use TCP.
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
bin=build
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$run"
}
trap cleanup EXIT

# A free TCP port on loopback for the receiving daemon.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ctl_a() { "$bin/control/moverctl" --socket "$run/a/moverd.sock" "$@"; }
ctl_b() { "$bin/control/moverctl" --socket "$run/b/moverd.sock" "$@"; }

echo "== two moverd daemons: A (producer's host) and B (consumer's host, listening on 127.0.0.1:$port)"
"$bin/moverd/moverd" --foreground --log-level warn --socket "$run/a/moverd.sock" &
pids+=($!)
"$bin/moverd/moverd" --foreground --log-level warn --socket "$run/b/moverd.sock" \
    --listen "127.0.0.1:$port" &
pids+=($!)
for _ in $(seq 100); do
    ctl_a status >/dev/null 2>&1 && ctl_b status >/dev/null 2>&1 && break
    sleep 0.05
done

echo "== flow 'demo' from A to B"
ctl_a flow create demo --ring-size 8M --max-record 64K --peer "127.0.0.1:$port"
for _ in $(seq 100); do
    ctl_b flow show demo >/dev/null 2>&1 && break
    sleep 0.05
done

echo "== a consumer on B, a producer on A: $count records of $size bytes"
FLOWMOVER_SOCKET=$run/b/moverd.sock "$bin/libflowshm/flowdemo" consume demo --count "$count" &
consumer=$!
FLOWMOVER_SOCKET=$run/a/moverd.sock "$bin/libflowshm/flowdemo" produce demo --count "$count" --size "$size"
wait "$consumer"
echo
ctl_a flow list
ctl_b flow list
ctl_a flow destroy demo
