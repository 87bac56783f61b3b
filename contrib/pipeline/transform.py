#!/usr/bin/python3
"""contrib/pipeline/transform.py - stage 2 (Python/numpy, host B).

    transform.py FRAMES RESULTS [--monitor FLOW]

Reads sensor frames from FRAMES in place (peek: a numpy array over the
ring's memory, no copy), reduces each to its statistics, sends the result
to RESULTS, and only then releases the frame.  That order is what makes the
pipeline exactly once across a kill of this stage at any instant:

  - killed before the send: the frame was never released, so it is still
    next in FRAMES and the restarted stage transforms it (nothing lost);
  - killed during the send (claimed, not committed): the sink's library
    turns the dead producer's claim into padding, and the restarted stage
    sends the result again;
  - killed after the send, before the release: the restarted stage sends
    that frame's result a second time (and, where the ring records a
    consumer's position lazily, ring format 2, a few results before it);
    the sink knows them (results carry the frame's sequence number, in
    order) and drops them.

So every frame reaches the sink's file exactly once.  With --monitor, a
small (total, time) record goes to that flow ten times a second, never
waiting: a slow or absent monitor cannot hold the pipeline back.

A record that is not a frame (shorter than its header, another magic, a
length its sample count does not give) is logged on stderr and released
unsent: kept, it would stop this stage at the same record after every
restart.  The sink then reports the frame missing, if it was one.
"""
import argparse
import errno
import signal
import struct
import sys
import time

import numpy as np

import flowshm

FRAME = struct.Struct("<IIQQII")          # contrib/pipeline/frame.h
RESULT = struct.Struct("<IIQQII4d")
FRAME_MAGIC, RESULT_MAGIC = 0x4D415246, 0x544C5352
TICK = struct.Struct("<QQ")               # frames so far, time (ns)
# the input is over: closed, or its stream ended (where flowshm has ends)
INPUT_OVER = (BrokenPipeError, getattr(flowshm, "EndOfStream",
                                       BrokenPipeError))


def attach(name, role, timeout=15.0):
    """Attach, waiting while the flow does not exist yet or (consumer)
    moverd has not yet seen the previous consumer go."""
    until = time.monotonic() + timeout
    while True:
        try:
            return flowshm.attach(name, role)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EBUSY) or \
                    time.monotonic() > until:
                raise
            time.sleep(0.05)


def reduce_frame(view):
    """The result record of the frame in `view` (read in place);
    struct.error or ValueError if it is not a frame."""
    magic, sensor, seq, t_ns, n, _ = FRAME.unpack_from(view)
    if magic != FRAME_MAGIC or FRAME.size + 4 * n != len(view):
        raise ValueError(f"not a frame: magic {magic:#x}, {n} samples, "
                         f"{len(view)} bytes")
    x = np.frombuffer(view, np.float32, count=n, offset=FRAME.size)
    x64 = x.astype(np.float64)            # the one copy: float32 -> float64
    return RESULT.pack(RESULT_MAGIC, sensor, seq, t_ns, n, 0, x64.mean(),
                       x64.min(), x64.max(), np.sqrt(np.mean(x64 * x64)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frames")
    ap.add_argument("results")
    ap.add_argument("--monitor")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    done = bad = 0
    src = attach(a.frames, "consumer")
    dst = attach(a.results, "producer")
    mon = attach(a.monitor, "producer") if a.monitor else None
    next_tick = time.monotonic()
    try:
        while True:
            try:
                rec = src.peek(timeout=0.2)
            except TimeoutError:
                rec = None
            except INPUT_OVER:
                break
            if rec is not None:
                try:
                    result = reduce_frame(rec.view)
                except (struct.error, ValueError) as e:
                    result = None
                    print(f"transform: dropping a record that is not a "
                          f"frame: {e}", file=sys.stderr, flush=True)
                # (out of the except: its traceback, and any numpy view
                # of the record in it, is gone before the release)
                if result is not None:
                    dst.send(result)      # 1. the result is in RESULTS
                    done += 1             # (counted before the release:
                else:                     # a frame seen released is counted)
                    bad += 1
                rec.release()             # 2. only then the frame goes
            if mon and time.monotonic() >= next_tick:
                next_tick += 0.1
                try:
                    mon.send(TICK.pack(done, time.time_ns()), timeout=0)
                except BlockingIOError:
                    pass                  # the monitor is behind: skip
    except KeyboardInterrupt:
        pass
    finally:
        print(f"transform: {done} frames"
              + (f", {bad} records that were not frames dropped" if bad else ""),
              flush=True)
        for f in (src, dst, mon):
            try:
                if f:
                    f.close()
            except BufferError:
                pass    # stopped inside reduce_frame: its frame stays next


if __name__ == "__main__":
    main()
