#!/bin/bash
# moverd-rdma.sh BUILD_DIR - runs INSIDE the soft-RoCE guest (vm-run.sh):
# two moverd daemons over RDMA (rxe0, 10.77.0.1), several flows with
# producer and consumer processes checking every record's sequence number;
# then the receiving moverd is killed (SIGKILL) mid-stream and restarted,
# and every record must still arrive exactly once.
set -euo pipefail
build=${1:?usage: moverd-rdma.sh BUILD_DIR}
ip=${FM_RDMA_ADDR:-10.77.0.1}
port=7471
count=${FM_RDMA_RECORDS:-300000}
# shellcheck source=tests/rdma/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" fm-rdma   # $run, $pids, cleanup

ulimit -l unlimited
moverd=$build/moverd/moverd
ctl() { "$build/control/moverctl" --socket "$run/$1/s" "${@:2}"; }
# both daemons prove the same key (an address off loopback needs one)
"$build/control/moverctl" keygen "$run/peer.key" >/dev/null
start_b() {
    "$moverd" -f --socket "$run/b/s" --listen "$ip:$port" --transport rdma \
        --peer-key "$run/peer.key" >>"$run/b.log" 2>&1 &
    pids+=($!)
    b=$!
    for _ in $(seq 100); do ctl b status >/dev/null 2>&1 && return 0; sleep 0.05; done
    fail "moverd B did not start"
}
"$moverd" -f --socket "$run/a/s" --transport rdma --peer-key "$run/peer.key" \
    >"$run/a.log" 2>&1 &
pids+=($!)
start_b
for _ in $(seq 100); do ctl a status >/dev/null 2>&1 && break; sleep 0.05; done

flows=4
for i in $(seq $flows); do
    ctl a flow create "r$i" --ring-size 1M --max-record 64K --peer "$ip:$port" >/dev/null
done
for _ in $(seq 100); do
    [ "$(ctl b flow list --json | grep -o '"name"' | wc -l)" = $flows ] && break
    sleep 0.1
done
ctl a flow list
ctl a flow show r1 | grep -q 'transport: *rdma' || fail "flow r1 is not on RDMA"

cons=()
for i in $(seq $flows); do
    FLOWMOVER_SOCKET=$run/b/s "$build/libflowshm/flowdemo" consume "r$i" \
        --count "$count" >"$run/c$i.log" 2>&1 &
    cons+=($!)
    FLOWMOVER_SOCKET=$run/a/s "$build/libflowshm/flowdemo" produce "r$i" \
        --count "$count" --size $((64 + 200 * i)) >"$run/p$i.log" 2>&1 &
    pids+=($!)
done
sleep 1
echo "moverd-rdma.sh: killing the receiving moverd mid-stream"
kill -9 "$b"
sleep 0.5
start_b
for i in $(seq $flows); do
    wait "${cons[$((i - 1))]}" || fail "consumer of r$i failed: $(cat "$run/c$i.log")"
    grep -q "consumer: $count records" "$run/c$i.log" || fail "r$i: $(cat "$run/c$i.log")"
done
cat "$run"/c*.log
ctl a status

# The counters over RDMA (issue 10), on a clean connection now: one more
# flow moves $n records; between a snapshot before and one after, on the
# sender's peer record: work requests posted >= 2 per batch (a WRITE and
# the header's SEND) and >= sends; completions polled = one per send
# chain (only its last WR is signalled) + one per frame received, give or
# take the one send that may be in flight at each snapshot.  Registrations
# (a gauge) = the open flows' rings on each side, pinned bytes = their
# sizes; one less of each once a flow is destroyed.  Record counters: N
# committed and sent on the sender, N deposited and consumed on the
# receiver.
n=20000
snap() { sleep 1.3; ctl "$1" top --once --json; }  # an idle daemon rewrites a flow's counters once a second
check_counters() {  # STAGE BEFORE_A AFTER_A AFTER_B [EXPECTED_REGS]
    python3 - "$@" <<'EOF'
import json, sys
stage, a0, a1, b1 = (sys.argv[1], json.loads(sys.argv[2]),
                     json.loads(sys.argv[3]), json.loads(sys.argv[4]))
regs = int(sys.argv[5])
def peer(d):
    ps = [p for p in d["peers"] if p["rdma"] == 1 and p["state"] == 2]
    assert len(ps) == 1, "one RDMA peer up: %s" % d["peers"]
    return ps[0]
def flow(d, name):
    return [f for f in d["flows"] if f["name"] == name]
def fail(why):
    print("moverd-rdma.sh: FAIL: counters (%s): %s" % (stage, why)); sys.exit(1)
p0, p1, pb = peer(a0), peer(a1), peer(b1)
d = {k: p1[k] - p0[k] for k in ("wr_posted", "wc_polled", "sends",
                                 "frames_rx", "frames_tx")}
print("counters (%s): sender peer: +%d WRs posted, +%d completions polled, "
      "+%d sends, +%d frames received; registrations %d (%d bytes pinned); "
      "receiver peer: registrations %d (%d bytes pinned)" % (
          stage, d["wr_posted"], d["wc_polled"], d["sends"], d["frames_rx"],
          p1["registrations"], p1["pinned_bytes"], pb["registrations"],
          pb["pinned_bytes"]))
for side, p, d_ in (("sender", p1, a1), ("receiver", pb, b1)):
    rings = sum(f["ring_bytes"] for f in d_["flows"] if f["state"] == 0)
    if p["registrations"] != regs:
        fail("%s: %d registrations, %d flows open" % (side, p["registrations"], regs))
    if p["pinned_bytes"] != rings:
        fail("%s: %d bytes pinned, rings of %d bytes open" % (side, p["pinned_bytes"], rings))
if stage != "transfer":
    sys.exit(0)
f, fb = flow(a1, "cnt"), flow(b1, "cnt")
if not f or not fb:
    fail("flow cnt missing")
f, fb = f[0], fb[0]
n = int(sys.argv[6])
print("counters (transfer): flow cnt: sender %d records committed, %d sent in "
      "%d batches; receiver %d deposited, %d consumed" % (
          f["records_committed"], f["records_sent"], f["batches"],
          fb["records_deposited"], fb["records_consumed"]))
if f["records_committed"] != n or f["records_sent"] != n:
    fail("sender records %d committed, %d sent, not %d" % (
        f["records_committed"], f["records_sent"], n))
if fb["records_deposited"] != n or fb["records_consumed"] != n:
    fail("receiver records %d deposited, %d consumed, not %d" % (
        fb["records_deposited"], fb["records_consumed"], n))
if d["wr_posted"] < 2 * f["batches"] or d["wr_posted"] < d["sends"]:
    fail("%d WRs posted for %d batches in %d sends" % (
        d["wr_posted"], f["batches"], d["sends"]))
if f["batches"] == 0 or d["sends"] < 1:
    fail("no batch counted")
if abs(d["wc_polled"] - (d["sends"] + d["frames_rx"])) > 1:
    fail("%d completions polled for %d sends and %d frames received" % (
        d["wc_polled"], d["sends"], d["frames_rx"]))
EOF
}
ctl a flow create cnt --ring-size 1M --peer "$ip:$port" >/dev/null
for _ in $(seq 100); do ctl b flow show cnt >/dev/null 2>&1 && break; sleep 0.1; done
a0=$(snap a)
FLOWMOVER_SOCKET=$run/b/s "$build/libflowshm/flowdemo" consume cnt \
    --count $n >"$run/ccnt.log" 2>&1 &
ccnt=$!
FLOWMOVER_SOCKET=$run/a/s "$build/libflowshm/flowdemo" produce cnt \
    --count $n --size 100 >"$run/pcnt.log" 2>&1 || fail "producer of cnt failed"
wait "$ccnt" || fail "consumer of cnt failed: $(cat "$run/ccnt.log")"
sleep 0.5  # the last acknowledgement
check_counters transfer "$a0" "$(snap a)" "$(snap b)" $((flows + 1)) $n || fail "counters"
ctl a flow destroy cnt >/dev/null
ok=
for _ in $(seq 30); do  # an orphaned registration goes with the next completion
    a1=$(snap a)
    check_counters destroyed "$a0" "$a1" "$(snap b)" $flows >/dev/null 2>&1 && { ok=1; break; }
done
[ -n "$ok" ] || check_counters destroyed "$a0" "$a1" "$(snap b)" $flows || fail "counters after a destroy"
check_counters destroyed "$a0" "$a1" "$(snap b)" $flows
echo "moverd-rdma.sh: PASS ($flows flows x $count records over RDMA, receiver killed and restarted; RDMA and record counters)"
