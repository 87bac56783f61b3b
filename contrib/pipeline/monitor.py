#!/usr/bin/python3
"""contrib/pipeline/monitor.py - the pipeline's live rate.

    monitor.py FLOW [--interval S]              ticks from the transform
    monitor.py --subscribe FLOW [--interval S]  a subscriber of the results

Default: reads the (frames so far, time) ticks the transform stage sends
to FLOW and prints the frame rate once per interval.  A tick whose total
went down means the transform restarted (it counts from 0 again).

--subscribe: attaches to the results flow as one more consumer (ring
format 2: every subscriber sees every record at its own pace) and counts
the results itself; also prints the age of the newest frame (ingest to
here, across both hosts).  On a ring with one consumer place moverd
answers EBUSY.
"""
import argparse
import errno
import signal
import struct
import sys
import time

import flowshm

TICK = struct.Struct("<QQ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("flow")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--subscribe", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    until = time.monotonic() + 15
    while True:
        try:
            f = flowshm.attach(a.flow, "consumer")
            break
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EBUSY) or \
                    time.monotonic() > until:
                raise
            time.sleep(0.05)
    if a.subscribe:
        return subscribe(f, a.interval)
    base = 0            # frames of earlier transform runs
    last = None         # (total, t_ns) of the previous tick
    shown = None        # (total, t_ns) at the last line printed
    try:
        with f:
            while True:
                try:
                    done, t_ns = TICK.unpack(f.recv(timeout=a.interval))
                except TimeoutError:
                    print("monitor: no ticks (transform down?)", flush=True)
                    continue
                if last and done < last[0] - base:
                    base = last[0]            # the transform restarted
                    print("monitor: transform restarted", flush=True)
                last = (base + done, t_ns)
                if shown is None:
                    shown = last
                elif t_ns - shown[1] >= a.interval * 1e9:
                    rate = (last[0] - shown[0]) / ((t_ns - shown[1]) / 1e9)
                    print(f"monitor: {rate:10,.0f} frames/s  "
                          f"{last[0]:>12,} frames", flush=True)
                    shown = last
    except (KeyboardInterrupt, BrokenPipeError):
        pass


RESULT_T_NS = struct.Struct("<IIQQ")     # magic, sensor, seq, t_ns


def subscribe(f, interval):
    """Count the results flow's records; print rate and newest age."""
    n, t0 = 0, time.monotonic()
    age = None
    try:
        with f:
            while True:
                try:
                    recs = f.recv_batch(256, timeout=interval)
                    n += len(recs)
                    t_ns = RESULT_T_NS.unpack_from(recs[-1])[3]
                    age = (time.time_ns() - t_ns) / 1e6
                except TimeoutError:
                    pass
                now = time.monotonic()
                if now - t0 >= interval:
                    print(f"monitor: {n / (now - t0):10,.0f} frames/s  "
                          f"newest {age if age is not None else 0:8.2f} ms "
                          f"old", flush=True)
                    n, t0 = 0, now
    except (KeyboardInterrupt, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
