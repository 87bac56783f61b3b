"""Every call of the flowshm module, every exception, the lifetime of the
views of ring memory, and threads: on rings made in the test (no daemon),
except where an error only a daemon gives is the point."""
import errno
import gc
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

import flowshm


# ---- module level -----------------------------------------------------------

def test_module_surface():
    assert flowshm.__version__
    assert issubclass(flowshm.Error, OSError)
    for name in ("attach", "open_fd", "ring_create", "strerror", "Flow",
                 "Reservation", "Record", "Error"):
        assert getattr(flowshm, name).__doc__, name
    assert flowshm.strerror(errno.EPIPE).startswith("flow closed")
    assert flowshm.strerror(errno.EAGAIN).startswith("ring full or empty")


def test_stubs_name_every_public_call():
    stubs = os.path.join(os.path.dirname(flowshm.__file__), "flowshm.pyi")
    text = open(stubs).read()
    for name in [n for n in dir(flowshm) if not n.startswith("_")]:
        assert name in text, name
    classes = [flowshm.Flow, flowshm.Record, flowshm.Reservation]
    classes += [getattr(flowshm, n) for n in ("Batch", "Set")
                if hasattr(flowshm, n)]
    for cls in classes:
        for name in [n for n in dir(cls) if not n.startswith("_")]:
            assert f"def {name}" in text, f"{cls.__name__}.{name}"


def test_ring_create_bad_geometry_is_flowshm_error():
    with pytest.raises(flowshm.Error) as e:
        flowshm.ring_create(1000, 100)          # not a power of two
    assert e.value.errno == errno.EINVAL
    assert "invalid argument" in str(e.value)


def test_ring_at_path_and_read_only_fd_is_permission_error():
    d = tempfile.mkdtemp()
    path = os.path.join(d, "ring")
    os.close(flowshm.ring_create(1 << 16, 1024, path))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(PermissionError) as e:   # mmap PROT_WRITE: EACCES
            flowshm.open_fd(fd, "consumer")
        assert e.value.errno == errno.EACCES
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDWR)
    with flowshm.open_fd(fd, "producer") as p, \
            flowshm.open_fd(fd, "consumer") as c:
        os.close(fd)
        p.send(b"through a file")
        assert c.recv() == b"through a file"
    os.unlink(path)
    os.rmdir(d)


def test_open_fd_of_garbage_is_eproto():
    with tempfile.TemporaryFile() as t:
        t.write(b"\xa5" * 65536 * 2)
        t.flush()
        with pytest.raises(flowshm.Error) as e:
            flowshm.open_fd(t.fileno(), "consumer")
        assert e.value.errno == errno.EPROTO


def test_bad_role_and_timeout():
    fd = flowshm.ring_create(1 << 16, 1024)
    try:
        with pytest.raises(ValueError, match="role must be"):
            flowshm.open_fd(fd, "reader")
        with flowshm.open_fd(fd, "consumer") as c:
            with pytest.raises(ValueError, match="timeout"):
                c.recv(-1)
            with pytest.raises(ValueError):
                c.recv(float("nan"))
    finally:
        os.close(fd)


def test_attach_without_daemon_is_flowshm_error(monkeypatch):
    monkeypatch.setenv("FLOWMOVER_SOCKET", "/nonexistent/moverd.sock")
    with pytest.raises(flowshm.Error) as e:
        flowshm.attach("x", "consumer")
    assert e.value.errno == errno.ECONNREFUSED
    assert "moverd is not running" in str(e.value)
    with pytest.raises(flowshm.Error) as e:
        flowshm.attach("bad name!", "consumer")
    assert e.value.errno == errno.EINVAL
    assert "invalid flow name" in str(e.value)


# ---- send / recv ------------------------------------------------------------

def test_send_recv_every_bytes_like(ring):
    p, c = ring
    assert (p.role, c.role) == ("producer", "consumer")
    assert p.name is None and p.max_record == 4096 and not p.closed
    for data in (b"bytes", bytearray(b"bytearray"), memoryview(b"view"),
                 np.arange(5, dtype=np.int16), b"x" * 4096):
        p.send(data)
        assert c.recv() == bytes(memoryview(data).cast("B"))
    with pytest.raises(TypeError):
        p.send("str is not bytes")


def test_batches(ring):
    p, c = ring
    recs = [bytes([i]) * (i + 1) for i in range(50)]
    assert p.send_batch(recs) == 50
    got = c.recv_batch(20)
    assert got == recs[:20]
    got += c.recv_batch(max=1000)
    assert got == recs
    assert p.send_batch([]) == 0
    with pytest.raises(ValueError):
        c.recv_batch(0)
    with pytest.raises(TypeError):
        p.send_batch([b"ok", 5])
    with pytest.raises(BlockingIOError):
        c.recv_batch(10, timeout=0)


def test_send_batch_timeout_says_how_many_went(ring):
    p, c = ring
    with pytest.raises(TimeoutError) as e:
        p.send_batch([b"z" * 4000] * 100, timeout=0.1)
    sent = e.value.sent
    assert 0 < sent < 100
    assert len(c.recv_batch(1000)) == sent


def test_errors_of_send_and_recv(ring):
    p, c = ring
    with pytest.raises(BlockingIOError) as e:
        c.recv(timeout=0)
    assert e.value.errno == errno.EAGAIN
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        c.recv(timeout=0.05)
    assert e.value.errno == errno.ETIMEDOUT
    assert time.monotonic() - t0 >= 0.05
    with pytest.raises(flowshm.Error) as e:
        p.send(b"x" * 4097)
    assert e.value.errno == errno.EMSGSIZE
    assert "record too large" in str(e.value)
    with pytest.raises(flowshm.Error) as e:
        p.send(b"")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(flowshm.Error, match="needs a producer end") as e:
        c.send(b"x")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(flowshm.Error, match="needs a consumer end"):
        p.recv()
    with pytest.raises(flowshm.Error, match="needs a consumer end"):
        iter(p)
    # full: timeout 0 and a short wait
    while True:
        try:
            p.send(b"f" * 4000, timeout=0)
        except BlockingIOError:
            break
    with pytest.raises(TimeoutError):
        p.send(b"f", timeout=0.02)


def test_set_wait_polls_and_still_times_out(ring):
    p, c = ring
    for how in ("yield", "spin", "sleep"):
        c.set_wait(how)
        p.set_wait(how)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.recv(timeout=0.05)
        assert time.monotonic() - t0 >= 0.05
    for bad in ("fast", "", 1, None):
        with pytest.raises((ValueError, TypeError)):
            c.set_wait(bad)
    # a polling consumer in another thread gets every record of a polling
    # producer held back by the full ring
    c.set_wait("yield")
    p.set_wait("yield")
    got = []
    t = threading.Thread(target=lambda: got.extend(
        c.recv(timeout=5) for _ in range(2000)))
    t.start()
    for i in range(2000):
        p.send(i.to_bytes(4, "little") * 300, timeout=5)
    t.join(10)
    assert [int.from_bytes(r[:4], "little") for r in got] == list(range(2000))
    c.close()
    with pytest.raises(ValueError, match="closed flow"):
        c.set_wait("yield")


def test_shutdown_pipe_and_iteration_end(ring):
    p, c = ring
    p.send_batch([b"1", b"2", b"3"])
    p.shutdown()
    assert c.info()["closed"] is True
    with pytest.raises(BrokenPipeError) as e:
        p.send(b"late")
    assert e.value.errno == errno.EPIPE
    assert list(c) == [b"1", b"2", b"3"]         # drained, then the end
    with pytest.raises(BrokenPipeError):
        c.recv()
    with pytest.raises(BrokenPipeError):
        p.reserve(8)


def test_info_and_close(ring):
    p, c = ring
    p.send(b"abc")
    i = c.info()
    assert i["ring_size"] == 1 << 16 and i["max_record"] == 4096
    assert i["tail"] > i["head"] and i["deposit"] is False
    assert i["recovered"] == 0
    c.recv()
    assert c.info()["head"] == c.info()["tail"]
    c.close()
    c.close()                                   # idempotent
    assert c.closed and "closed" in repr(c)
    for call in (c.recv, c.peek, c.info, c.shutdown):
        with pytest.raises(ValueError, match="closed flow"):
            call()
    with pytest.raises(ValueError):
        with c:
            pass


# ---- reserve (zero copy out) ------------------------------------------------

def test_reserve_with_commits_and_numpy_writes_in_place(ring):
    p, c = ring
    with p.reserve(16) as v:
        assert isinstance(v, memoryview) and not v.readonly and len(v) == 16
        a = np.frombuffer(v, dtype=np.float32)
        assert a.flags.writeable
        a[:] = [1.5, 2.5, 3.5, 4.5]             # written in the ring
        del a
    assert np.array_equal(np.frombuffer(c.recv(), np.float32),
                          [1.5, 2.5, 3.5, 4.5])


def test_reserve_explicit_commit_and_errors(ring):
    p, c = ring
    r = p.reserve(4)
    assert isinstance(r, flowshm.Reservation) and len(r) == 4 and r.live
    memoryview(r)[:] = b"abcd"
    with pytest.raises(RuntimeError, match="commit it first"):
        p.send(b"x")                             # one claim at a time
    with pytest.raises(RuntimeError):
        p.reserve(4)
    r.commit()
    r.commit()                                   # a no-op once committed
    assert not r.live
    with pytest.raises(BufferError, match="already committed"):
        memoryview(r)
    with pytest.raises(ValueError, match="already committed"):
        r.view
    assert c.recv() == b"abcd"
    with pytest.raises(flowshm.Error) as e:
        p.reserve(0)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(flowshm.Error) as e:
        p.reserve(5000)
    assert e.value.errno == errno.EMSGSIZE
    with pytest.raises(ValueError):
        p.reserve(-1)


def test_reserve_exception_still_commits(ring):
    """No abort in flowshm.h: a claim must be published (else every
    producer stalls), so the record goes out as written."""
    p, c = ring
    with pytest.raises(KeyError):
        with p.reserve(3) as v:
            v[:] = b"abc"
            raise KeyError("stage failed")
    assert c.recv() == b"abc"
    p.send(b"next")                              # the handle is usable
    assert c.recv() == b"next"


def test_reservation_commit_refused_while_viewed(ring):
    p, c = ring
    r = p.reserve(8)
    m = memoryview(r)
    with pytest.raises(BufferError, match="still in use"):
        r.commit()
    with pytest.raises(BufferError):
        p.close()
    m[:] = b"12345678"
    m.release()
    r.commit()
    assert c.recv() == b"12345678"


def test_forgotten_reservation_is_committed_when_collected(ring):
    p, c = ring
    r = p.reserve(2)
    memoryview(r)[:] = b"ok"
    del r
    assert c.recv() == b"ok"


# ---- peek (zero copy in) ----------------------------------------------------

def test_peek_is_zero_copy_numpy(ring):
    p, c = ring
    x = np.arange(256, dtype=np.float64)
    p.send(x)
    p.send(x * 2)
    r1 = c.peek()
    a1 = np.frombuffer(r1, dtype=np.float64)
    assert np.array_equal(a1, x) and not a1.flags.writeable
    # the same memory twice, not a copy each time
    assert np.frombuffer(r1, np.float64).ctypes.data == a1.ctypes.data
    del a1
    addr1 = np.frombuffer(r1, np.uint8).ctypes.data
    r1.release()
    r2 = c.peek()
    a2 = np.frombuffer(r2, dtype=np.float64)
    assert np.array_equal(a2, x * 2)
    # the next record lies right after the first in the ring: a record
    # header (16 bytes) past the first's 2048, not somewhere on the heap
    assert a2.ctypes.data - addr1 == 2048 + 16
    del a2
    r2.release()


def test_peek_with_releases_and_view_is_dead_after(ring):
    p, c = ring
    p.send(b"first")
    p.send(b"second")
    with c.peek() as v:
        assert v.readonly and bytes(v) == b"first"
        with pytest.raises(TypeError):
            v[0] = 1
    with pytest.raises(ValueError, match="released"):
        v.tobytes()                              # never the freed memory
    with pytest.raises(ValueError):
        v[0]
    assert c.recv() == b"second"


def test_record_explicit_release_and_errors(ring):
    p, c = ring
    p.send(b"abc")
    r = c.peek()
    assert isinstance(r, flowshm.Record) and len(r) == 3 and r.live
    assert bytes(r) == b"abc"
    v = r.view
    assert v is r.view                           # one view per record
    with pytest.raises(RuntimeError, match="release it first"):
        c.recv()
    with pytest.raises(RuntimeError):
        c.peek()
    with pytest.raises(RuntimeError):
        next(iter(c))
    r.release()
    r.release()                                  # a no-op
    assert not r.live
    with pytest.raises(ValueError):
        v.tobytes()
    with pytest.raises(BufferError, match="already released"):
        memoryview(r)
    with pytest.raises(BufferError):
        np.frombuffer(r, np.uint8)
    with pytest.raises(BlockingIOError):
        c.peek(timeout=0)
    p.send(b"x")
    p.send(b"y")
    assert bytes(c.peek(timeout=1)) == b"x"       # dropped, not released:
    r = c.peek()                                 # still next
    assert bytes(r) == b"x"
    r.release()
    # a record and its view dropped together: a cycle the collector frees
    assert c.peek().view.tobytes() == b"y"
    gc.collect()
    assert c.recv(0) == b"y"
    with pytest.raises(BlockingIOError):
        c.recv(0)


def test_with_that_raises_leaves_the_record_next(ring):
    """A stage that fails on a record does not lose it."""
    p, c = ring
    p.send(b"poison")
    p.send(b"ok")
    with pytest.raises(ZeroDivisionError):
        with c.peek() as v:
            assert bytes(v) == b"poison"
            1 / 0
    with pytest.raises(ValueError):
        v.tobytes()                              # the view is gone anyway
    assert c.recv() == b"poison"
    assert c.recv() == b"ok"


def test_release_refused_while_numpy_holds_the_record(ring):
    p, c = ring
    p.send(np.ones(8, np.int32))
    p.send(b"after")
    r = c.peek()
    a = np.frombuffer(r, np.int32)
    with pytest.raises(BufferError, match="still in use"):
        r.release()
    with pytest.raises(BufferError):
        c.close()
    assert a.sum() == 8                          # still the ring's bytes
    with pytest.raises(BufferError):
        with r as v:
            b = np.frombuffer(v, np.int32)       # a view of the view
    with pytest.raises(BufferError):
        r.release()
    del a, b
    r.release()
    assert c.recv() == b"after"


def test_views_keep_the_ring_mapped_after_the_flow_is_dropped():
    fd = flowshm.ring_create(1 << 16, 1024)
    p = flowshm.open_fd(fd, "producer")
    c = flowshm.open_fd(fd, "consumer")
    os.close(fd)
    p.send(b"kept")
    a = np.frombuffer(c.peek(), np.uint8)
    del c, p                                     # the array holds them
    assert a.tobytes() == b"kept"


def test_close_leaves_a_peeked_record_for_the_next_consumer():
    fd = flowshm.ring_create(1 << 16, 1024)
    try:
        p = flowshm.open_fd(fd, "producer")
        c = flowshm.open_fd(fd, "consumer")
        p.send(b"one")
        r = c.peek()
        c.close()
        assert not r.live and c.closed
        with flowshm.open_fd(fd, "consumer") as c2:
            assert c2.recv() == b"one"
    finally:
        os.close(fd)


# ---- threads and signals ----------------------------------------------------

def test_blocking_recv_in_a_thread_while_another_sends(ring):
    p, c = ring
    got, ticks = [], [0]

    def reader():
        got.append(c.recv(timeout=10))

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.1)
    # the reader is blocked in recv; it released the GIL, so this thread
    # runs Python meanwhile
    until = time.monotonic() + 0.2
    while time.monotonic() < until:
        ticks[0] += 1
    assert t.is_alive() and not got
    with pytest.raises(RuntimeError, match="another thread"):
        c.recv(0)                                # one thread per handle
    with pytest.raises(RuntimeError, match="another thread"):
        c.close()
    p.send(b"wake up")
    t.join(5)
    assert got == [b"wake up"] and ticks[0] > 1000


def test_producer_and_consumer_threads_exactly_once(ring):
    p, c = ring
    n = 20000
    out = []

    def consume():
        for _ in range(n):
            out.append(c.recv(timeout=10))

    t = threading.Thread(target=consume)
    t.start()
    for i in range(n):
        p.send(i.to_bytes(4, "little") * (1 + i % 64), timeout=10)
    t.join(30)
    assert len(out) == n
    for i, rec in enumerate(out):
        assert rec == i.to_bytes(4, "little") * (1 + i % 64)


def test_signal_interrupts_a_forever_wait(ring):
    _, c = ring

    class Alarm(Exception):
        pass

    def handler(sig, frame):
        raise Alarm()

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Alarm):
            c.recv()                             # timeout None: forever
        assert time.monotonic() - t0 < 2
        with pytest.raises(BlockingIOError):     # the handle still works
            c.recv(0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
