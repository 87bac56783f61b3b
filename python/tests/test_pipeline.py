"""contrib/pipeline as run.sh runs it (two moverd over TCP on loopback,
the C ingest on A, the Python transform, the C sink and the Python monitor
on B), with the
transform killed (SIGKILL) mid-stream and started again, twice: every
frame must reach the sink's file exactly once, checked by the sink against
the frame recomputed from its sequence number."""
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

import flowshm
from conftest import tool

PIPELINE = os.path.join(os.path.dirname(__file__), "..", "..", "contrib",
                        "pipeline")
FRAMES = 30000
RATE = 6000


def stage(cmd, daemon, log):
    return subprocess.Popen(cmd, env=daemon.env, stdout=log,
                            stderr=subprocess.STDOUT)


def lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def wait_lines(path, n, procs, timeout=60):
    until = time.monotonic() + timeout
    while lines(path) < n:
        for p in procs:
            assert p.poll() is None, f"{p.args[0]} exited {p.returncode}"
        assert time.monotonic() < until, f"{path}: {lines(path)} < {n}"
        time.sleep(0.05)


def several_subscribers(daemon):
    """Ring format 2: a second consumer of a flow may attach."""
    daemon.ctl("flow", "create", "probe")
    os.environ["FLOWMOVER_SOCKET"] = daemon.sock
    try:
        with flowshm.attach("probe", "consumer"):
            try:
                flowshm.attach("probe", "consumer").close()
                return True
            except flowshm.Error:
                return False
    finally:
        del os.environ["FLOWMOVER_SOCKET"]
        daemon.ctl("flow", "destroy", "probe")


@pytest.mark.parametrize("monitor", ["ticks", "subscribe"])
def test_transform_killed_and_restarted_every_frame_once(pair, tmp_path,
                                                         monitor):
    ingest = tool("FM_PIPELINE_INGEST")
    sink = tool("FM_PIPELINE_SINK")
    if monitor == "subscribe" and not several_subscribers(pair.b):
        pytest.skip("one consumer per flow (ring format 1)")
    pair.create("frames", ring_size="1M", max_record="64K")
    pair.b.ctl("flow", "create", "results", "--ring-size", "256K",
               "--max-record", "4K")
    transform_cmd = [sys.executable, os.path.join(PIPELINE, "transform.py"),
                     "frames", "results"]
    monitor_cmd = [sys.executable, os.path.join(PIPELINE, "monitor.py"),
                   "--interval", "0.5"]
    if monitor == "ticks":
        pair.b.ctl("flow", "create", "monitor", "--ring-size", "64K",
                   "--max-record", "64")
        transform_cmd += ["--monitor", "monitor"]
        monitor_cmd += ["monitor"]
    else:   # a second subscriber of the results, beside the sink
        monitor_cmd += ["--subscribe", "results"]
    out = tmp_path / "results.txt"
    log = open(tmp_path / "stages.log", "w")
    mlog = open(tmp_path / "monitor.log", "w")
    m = stage(monitor_cmd, pair.b, mlog)
    s = stage([sink, "results", "--out", str(out), "--count", str(FRAMES)],
              pair.b, log)
    t = stage(transform_cmd, pair.b, log)
    i = stage([ingest, "frames", "--count", str(FRAMES), "--rate",
               str(RATE)], pair.a, log)
    procs = [s, i, t, m]
    try:
        for k in (1, 2):
            # the sink writes lines as results arrive (flushed when idle
            # or at the end): kill the transform once some are in
            wait_lines(out, k * FRAMES // 4, [s, i, t])
            t.send_signal(signal.SIGKILL)
            t.wait()
            time.sleep(0.3)            # frames pile up in the rings
            t = stage(transform_cmd, pair.b, log)
            procs.append(t)
        assert i.wait(60) == 0
        assert s.wait(60) == 0, open(tmp_path / "stages.log").read()
        assert m.poll() is None, "the monitor died"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()
        mlog.close()
    report = open(tmp_path / "stages.log").read()
    assert f"sink: {FRAMES} frames written once each" in report, report
    seqs = [int(line.split()[0]) for line in open(out)]
    assert seqs == list(range(FRAMES))
    printed = open(tmp_path / "monitor.log").read()
    assert "frames/s" in printed, printed
    if monitor == "ticks":
        assert "transform restarted" in printed, printed


def test_transform_drops_records_that_are_not_frames(pair, tmp_path):
    """A record of the frames flow that is not a frame (shorter than the
    header: struct.error; another magic, or fewer samples than it says:
    ValueError) is logged and released, and the transform goes on with the
    next frame.  Kept, it stopped the transform, and every restart again
    at the same record."""
    b = pair.b
    for name in ("frames", "results"):
        b.ctl("flow", "create", name, "--ring-size", "64K",
              "--max-record", "4K")
    hdr = struct.Struct("<IIQQII")                    # frame.h, transform.py
    result = struct.Struct("<IIQQII4d")
    magic = 0x4D415246
    samples = struct.pack("<4f", 1.0, -2.0, 3.0, 0.5)
    os.environ["FLOWMOVER_SOCKET"] = b.sock
    try:
        src = flowshm.attach("frames", "producer")
        res = flowshm.attach("results", "consumer")
    finally:
        del os.environ["FLOWMOVER_SOCKET"]
    cmd = [sys.executable, os.path.join(PIPELINE, "transform.py"), "frames",
           "results"]
    log = open(tmp_path / "transform.log", "w")
    procs = []

    def next_result(t, timeout=15):
        until = time.monotonic() + timeout
        while True:
            assert t.poll() is None, \
                f"the transform exited {t.returncode}: " + \
                open(tmp_path / "transform.log").read()
            try:
                return result.unpack(res.recv(timeout=0.1))
            except TimeoutError:
                assert time.monotonic() < until, "no result"

    try:
        src.send(b"short")
        src.send(hdr.pack(0x12345678, 0, 1, 0, 4, 0) + samples)
        src.send(hdr.pack(magic, 0, 2, 0, 9, 0) + samples)
        src.send(hdr.pack(magic, 1, 3, 0, 4, 0) + samples)     # a frame
        t = stage(cmd, b, log)
        procs.append(t)
        r = next_result(t)
        assert r[:3] == (0x544C5352, 1, 3) and r[4] == 4, r
        assert r[6:] == pytest.approx((0.625, -2.0, 3.0, 1.887458), rel=1e-6)
        # a restart does not meet them again: the next frame passes too
        t.send_signal(signal.SIGKILL)
        t.wait()
        src.send(hdr.pack(magic, 2, 4, 0, 4, 0) + samples)
        t = stage(cmd, b, log)
        procs.append(t)
        r = next_result(t)
        # killed between its send of frame 3's result and its release of
        # frame 3: the restarted one gets frame 3 again (at least once)
        again = r[2] == 3
        if again:
            r = next_result(t)
        assert r[2] == 4, r
        # its result is sent, counted, then the frame released: stopped
        # before the release, it would print one fewer (at least once)
        until = time.monotonic() + 15
        while (f := b.flow("frames"))["head"] != f["tail"]:
            assert time.monotonic() < until, f
            time.sleep(0.02)
        t.terminate()
        assert t.wait(15) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()
        src.close()
        res.close()
    printed = open(tmp_path / "transform.log").read()
    assert printed.count("dropping a record that is not a frame") == 3, printed
    # the restarted one's count
    assert f"transform: {1 + again} frames\n" in printed, printed


def test_ingest_and_sink_refuse_what_cannot_work(pair, tmp_path):
    """The ingest refuses --samples its flow's max record cannot hold (a
    64K record: 32 + 4 * 16376 bytes at most) before it sends anything;
    the sink fails when its file cannot be written (it said every frame
    was written), and names no frame for a result too short to hold one
    (it printed an unset number)."""
    ingest = tool("FM_PIPELINE_INGEST")
    sink = tool("FM_PIPELINE_SINK")
    b = pair.b
    b.ctl("flow", "create", "frames", "--ring-size", "1M", "--max-record",
          "64K")
    b.ctl("flow", "create", "small", "--ring-size", "64K", "--max-record",
          "1K")
    b.ctl("flow", "create", "results", "--ring-size", "64K", "--max-record",
          "4K")

    def run(*argv):
        return subprocess.run(argv, env=b.env, capture_output=True,
                              text=True, timeout=30)
    for flow, samples in (("frames", 16384), ("frames", 16377),
                          ("small", 249)):
        r = run(ingest, flow, "--count", "1", "--samples", str(samples))
        assert r.returncode == 2, (flow, samples, r)
        assert "ingest: --samples" in r.stderr, r.stderr
    r = run(ingest, "frames", "--count", "1", "--samples", "16376")
    assert r.returncode == 0 and "sent 1 frames" in r.stdout, r
    r = run(ingest, "small", "--count", "1", "--samples", "248")
    assert r.returncode == 0 and "sent 1 frames" in r.stdout, r

    # one good result, then the sink's file is /dev/full
    results = [sys.executable, os.path.join(PIPELINE, "transform.py"),
               "frames", "results"]
    t = subprocess.Popen(results, env=b.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        r = run(sink, "results", "--out", "/dev/full", "--count", "1")
    finally:
        t.terminate()
        t.wait()
    assert r.returncode == 1, r
    assert "/dev/full: No space left on device" in r.stderr, r.stderr
    assert "FAILED" in r.stdout, r.stdout

    os.environ["FLOWMOVER_SOCKET"] = b.sock
    try:
        with flowshm.attach("results", "producer") as p:
            p.send(b"tiny")
    finally:
        del os.environ["FLOWMOVER_SOCKET"]
    r = run(sink, "results", "--out", str(tmp_path / "out.txt"))
    assert r.returncode == 1, r
    assert "bad result of 4 bytes (too short to name its frame)" in \
        r.stderr, r.stderr
