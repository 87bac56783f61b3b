"""contrib/pipeline as run.sh runs it (two moverd over TCP on loopback,
the C ingest on A, the Python transform, the C sink and the Python monitor
on B), with the
transform killed (SIGKILL) mid-stream and started again, twice: every
frame must reach the sink's file exactly once, checked by the sink against
the frame recomputed from its sequence number."""
import os
import signal
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
