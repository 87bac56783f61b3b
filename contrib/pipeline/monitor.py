#!/usr/bin/python3
"""contrib/pipeline/monitor.py - the pipeline's live rate.

    monitor.py FLOW [--interval S]

Reads the (frames so far, time) ticks the transform stage sends to FLOW
and prints the frame rate once per interval.  A tick whose total went
down means the transform restarted (it counts from 0 again).
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


if __name__ == "__main__":
    main()
