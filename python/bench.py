#!/usr/bin/python3
"""python/bench.py - flowshm from Python against the C library, same run.

Not a test: it prints figures and sets no thresholds.  Producer and
consumer are two processes (fork) on one memfd ring, as flowbench local
does; the consumer checks every record's sequence number.  Cases:

  copy    send(bytes) / recv() -> bytes
  view    reserve(n) + write in place / peek() + read in place (32 B:
          struct.pack_into / unpack_from on the Reservation and Record, which
          are buffers themselves; 1 MiB: the payload copied in from a numpy
          array through the memoryview, and copied out into a preallocated
          buffer, i.e. one memcpy each way as in C's send/recv)
  batch   32 B only: send_batch() of 64 records / peek_batch(max=64) and
          each record's sequence number read in place through its
          memoryview (the batch API: one synchronisation per batch)
  view-0  1 MiB only: as view, but the consumer reads just the sequence
          number in place (zero copy: what a numpy stage that reduces the
          record where it lies costs)

and, in the same run, `flowbench local --only tput --producers 0` at the
same sizes and ring size (its per-record send/recv: the reference).  The
host is shared: C and Python cases alternate, --rounds times (default 3),
and each figure is the median of its rounds.

Usage: python/bench.py [--build DIR] [--seconds S] [--json]
(PYTHONPATH must reach the built module: DIR/python.)
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RING = 8 << 20
SEQ = struct.Struct("<Q")
BATCH = 64


def producer(fd, size, mode):
    import flowshm
    p = flowshm.open_fd(fd, "producer")
    seq = 0
    src = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    payload = bytearray(src.tobytes())
    try:
        if mode == "copy":
            while True:
                SEQ.pack_into(payload, 0, seq)
                p.send(payload)
                seq += 1
        elif mode == "batch":
            bufs = [bytearray(payload) for _ in range(BATCH)]
            while True:
                for b in bufs:
                    SEQ.pack_into(b, 0, seq)
                    seq += 1
                p.send_batch(bufs)
        elif size <= 64:
            while True:
                r = p.reserve(size)
                SEQ.pack_into(r, 0, seq)
                r.commit()
                seq += 1
        else:
            while True:
                with p.reserve(size) as v:
                    a = np.frombuffer(v, np.uint8)
                    a[:] = src
                    del a
                    SEQ.pack_into(v, 0, seq)
                seq += 1
    except BrokenPipeError:
        pass
    os._exit(0)


def consumer(c, size, mode, seconds, warmup):
    """records counted over `seconds` after `warmup`; checks sequence."""
    out = bytearray(size)
    seq = 0
    t_start = time.monotonic()
    t0 = n0 = None
    while True:
        if mode == "batch":
            with c.peek_batch(max=BATCH) as views:
                for v in views:
                    got = SEQ.unpack_from(v, 0)[0]
                    if got != seq:
                        raise SystemExit(f"record {seq}: got {got}")
                    seq += 1
            now = time.monotonic()      # once per batch
            if t0 is None and now - t_start >= warmup:
                t0, n0 = now, seq
            elif t0 is not None and now - t0 >= seconds:
                return seq - n0, now - t0
            continue
        if mode == "copy":
            rec = c.recv()
            got = SEQ.unpack_from(rec, 0)[0]
        elif size <= 64 or mode == "view-0":
            r = c.peek()
            got = SEQ.unpack_from(r, 0)[0]
            r.release()
        else:
            with c.peek() as v:
                got = SEQ.unpack_from(v, 0)[0]
                out[:] = v
        if got != seq:
            raise SystemExit(f"record {seq}: got sequence {got}")
        seq += 1
        if seq & 63 == 0:
            now = time.monotonic()
            if t0 is None and now - t_start >= warmup:
                t0, n0 = now, seq
            elif t0 is not None and now - t0 >= seconds:
                return seq - n0, now - t0


def run_case(size, mode, seconds, warmup):
    import flowshm
    fd = flowshm.ring_create(RING, max(size, 64))
    pid = os.fork()
    if pid == 0:
        try:
            producer(fd, size, mode)
        finally:
            os._exit(1)
    c = flowshm.open_fd(fd, "consumer")
    os.close(fd)
    n, secs = consumer(c, size, mode, seconds, warmup)
    c.shutdown()
    while True:      # drain so the producer sees the end at once
        try:
            c.recv(timeout=0)
        except (BlockingIOError, BrokenPipeError):
            break
    c.close()
    os.waitpid(pid, 0)
    return {"size": size, "api": mode, "records_per_s": n / secs,
            "gb_per_s": n * size / secs / 1e9}


def flowbench(build, seconds):
    out = subprocess.run(
        [os.path.join(build, "tests/bench/flowbench"), "local", "--only",
         "tput", "--producers", "0", "--sizes", "32,1M", "--ring-size",
         str(RING), "--seconds", str(seconds), "--json"],
        check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    rows = [r for r in doc["throughput"]
            if r["api"] == "record" and r["producers"] == 1]
    return doc["machine"], rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build, "python"))

    runs = {}
    for _ in range(a.rounds):
        machine, rows = flowbench(a.build, a.seconds)
        for r in rows:
            runs.setdefault((r["size"], "C"), []).append(r)
        for size, modes in ((32, ("copy", "view", "batch")),
                            (1 << 20, ("copy", "view", "view-0"))):
            for mode in modes:
                runs.setdefault((size, mode), []).append(
                    run_case(size, mode, a.seconds, 0.2))
    med = {k: sorted(v, key=lambda r: r["records_per_s"])[len(v) // 2]
           for k, v in runs.items()}
    c_rows = [r for (size, api), r in med.items() if api == "C"]
    py_rows = [r for (size, api), r in med.items() if api != "C"]
    if a.json:
        print(json.dumps({"machine": machine, "c": c_rows,
                          "python": py_rows}, indent=2))
        return
    ref = {r["size"]: r for r in c_rows}
    print(f"machine: {machine['cpus']} cpus, {machine['model']}, "
          f"kernel {machine['kernel']}; ring {RING >> 20} MiB, "
          f"{a.seconds:g} s per case, median of {a.rounds} rounds")
    print(f"{'size':>8} {'api':<16} {'records/s':>12} {'GB/s':>8} "
          f"{'vs C':>6}")
    for r in c_rows:
        print(f"{r['size']:>8} {'C send/recv':<16} "
              f"{r['records_per_s']:>12,.0f} {r['gb_per_s']:>8.3f} "
              f"{1:>6.2f}")
    for r in py_rows:
        c = ref[r["size"]]
        print(f"{r['size']:>8} {'Python ' + r['api']:<16} "
              f"{r['records_per_s']:>12,.0f} {r['gb_per_s']:>8.3f} "
              f"{r['records_per_s'] / c['records_per_s']:>6.2f}")


if __name__ == "__main__":
    main()
