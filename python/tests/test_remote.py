"""A Python producer against a C consumer (tests/flowcheck) and the reverse,
through two real moverd over TCP on loopback: every record exactly once,
in order, byte for byte."""
import errno
import os
import subprocess

import numpy as np
import pytest

import flowshm
from conftest import tool
from fcformat import records

COUNT = 3000
MAX_SIZE = 2048


def test_python_producer_to_c_consumer_over_tcp(pair, monkeypatch):
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.a.sock)
    pair.create("py2c", ring_size="256K", max_record="64K")
    consumer = subprocess.Popen(
        [tool("FM_FLOWCHECK"), "consume", "py2c", "--producers", "1",
         "--count", str(COUNT), "--max-size", str(MAX_SIZE)],
        env=pair.b.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        with flowshm.attach("py2c", "producer") as p:
            assert p.name == "py2c" and p.max_record == 65536
            batch = []
            for seq, rec in records("py2c", 1, COUNT, MAX_SIZE, 65536):
                # every way of sending, 8 records each in turn: copy, zero
                # copy, a batch
                mode = seq // 8 % 3
                if mode == 0:
                    p.send(rec, timeout=30)
                elif mode == 1:
                    with p.reserve(len(rec), timeout=30) as v:
                        np.frombuffer(v, np.uint8)[:] = np.frombuffer(
                            rec, np.uint8)
                else:
                    batch.append(rec)
                    if len(batch) == 8 or seq == COUNT - 1:
                        assert p.send_batch(batch, timeout=30) == len(batch)
                        batch = []
            assert not batch
        out, _ = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 0, out
    assert f"{COUNT} records from 1 producers" in out and "all checked" in out


def test_c_producer_to_python_consumer_over_tcp(pair, monkeypatch):
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.b.sock)
    pair.create("c2py", ring_size="256K", max_record="64K")
    with flowshm.attach("c2py", "consumer") as c:
        producer = subprocess.Popen(
            [tool("FM_FLOWCHECK"), "produce", "c2py", "--id", "1",
             "--count", str(COUNT), "--max-size", str(MAX_SIZE)],
            env=pair.a.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            want = records("c2py", 1, COUNT, MAX_SIZE, 65536)
            got = 0
            while got < COUNT:
                # every way of receiving, in turn: copy, zero copy, batches
                if got % 3 == 0:
                    seq, rec = next(want)
                    assert c.recv(timeout=30) == rec, f"record {seq}"
                    got += 1
                elif got % 3 == 1:
                    seq, rec = next(want)
                    with c.peek(timeout=30) as v:
                        assert v == rec, f"record {seq}"
                    got += 1
                else:
                    for r in c.recv_batch(min(16, COUNT - got), timeout=30):
                        seq, rec = next(want)
                        assert r == rec, f"record {seq}"
                        got += 1
            # exactly once: nothing after the last record
            with pytest.raises(BlockingIOError):
                c.recv(timeout=0)
            out, _ = producer.communicate(timeout=60)
            assert producer.returncode == 0, out
            with pytest.raises(TimeoutError):
                c.recv(timeout=0.3)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()


def test_attach_errors_from_a_daemon(pair, monkeypatch):
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.b.sock)
    with pytest.raises(FileNotFoundError) as e:
        flowshm.attach("nosuch", "consumer")
    assert e.value.errno == errno.ENOENT and "nosuch" in str(e.value)
    pair.create("busy")
    # one consumer place (ring format 1) or 16 subscriber slots (format 2):
    # the attach past the last place is refused with EBUSY
    held = []
    try:
        with pytest.raises(flowshm.Error) as e:
            for _ in range(17):
                held.append(flowshm.attach("busy", "consumer"))
        assert e.value.errno == errno.EBUSY and len(held) in (1, 16)
    finally:
        for f in held:
            f.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be another uid")
def test_attach_as_another_user_is_permission_error(pair):
    """A flow's owner (root here) has not allowed uid 65534."""
    pair.a.ctl("flow", "create", "mine")
    code = ("import flowshm, sys\n"
            "try:\n"
            "    flowshm.attach('mine', 'producer')\n"
            "except PermissionError as e:\n"
            "    print('PermissionError', e.errno, e); sys.exit(0)\n"
            "sys.exit(1)\n")
    mod_dir = os.path.dirname(flowshm.__file__)
    if subprocess.run(["/usr/bin/python3", "-c", "import flowshm"],
                      user=65534, group=65534, cwd="/",
                      env=dict(pair.a.env, PYTHONPATH=mod_dir)).returncode:
        pytest.skip("the build tree is not readable by uid 65534")
    r = subprocess.run(["/usr/bin/python3", "-c", code], user=65534,
                       group=65534, cwd="/", capture_output=True, text=True,
                       env=dict(pair.a.env, PYTHONPATH=mod_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"PermissionError {errno.EACCES}" in r.stdout


def test_attach_owner(pair, monkeypatch):
    """owner=: only a flow that uid owns; another owner's is refused with
    its uid named, before anything is attached."""
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.a.sock)
    pair.a.ctl("flow", "create", "owned")
    me = os.geteuid()
    with flowshm.attach("owned", "producer", owner=me) as f:
        f.send(b"x")
    with pytest.raises(PermissionError) as e:
        flowshm.attach("owned", "consumer", owner=me + 1)
    assert e.value.errno == errno.EACCES
    assert f"owned by uid {me}, not by uid {me + 1}" in str(e.value)
    assert pair.a.flow("owned")["consumers"] == 0
    for bad in (-1, 2**32 - 1, "0"):
        with pytest.raises((ValueError, TypeError)):
            flowshm.attach("owned", "consumer", owner=bad)
