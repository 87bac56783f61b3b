"""Handle lifetime and safety in the module: a poll whose list changes (or
whose flows lose their last reference) during the wait, a Set closed by
two threads at once, handles inherited by a child of fork, a peeked
record released after this consumer was cut off (ESTALE), Records,
Reservations and Batches dropped without the cyclic collector, a Record
let go before peek_batch, and arguments C cannot hold."""
import errno
import gc
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

import flowshm
from rings import ring_pair


def run_script(body):
    """Run body in a fresh interpreter (it forks, or may crash or hang on
    a broken module); its stdout.  The timeout only guards against a
    hang: it is no measure of anything."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(body)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture
def no_gc():
    """Nothing the tests drop may wait for the cyclic collector."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


# ---- poll: the caller's list is not the module's -----------------------------

def test_poll_keeps_its_flows_while_the_list_changes():
    p, c = ring_pair()
    w = weakref.ref(c)
    flows = [c]
    del c                       # the list holds the only reference

    done = threading.Event()

    def mutate():
        # poll holds the flow (busy) once it waits: then empty the list,
        # dropping the last reference of ours, and wake it with a record
        while not done.is_set():
            try:
                w().info()
            except RuntimeError:
                break
        flows.clear()
        p.send(b"wake")

    t = threading.Thread(target=mutate)
    t.start()
    try:
        ready = flowshm.poll(flows, timeout=None)
    finally:
        done.set()
        t.join()
    assert len(ready) == 1 and ready[0] is w()
    assert ready[0].recv(timeout=0) == b"wake"


def test_send_batch_takes_any_iterable_of_records():
    p, c = ring_pair()
    assert p.send_batch(b"r%d" % i for i in range(3)) == 3
    assert p.send_batch((b"a", bytearray(b"b"))) == 2
    assert c.recv_batch() == [b"r0", b"r1", b"r2", b"a", b"b"]
    with pytest.raises(TypeError):
        p.send_batch(5)


# ---- Set.close from two threads ----------------------------------------------

def test_set_closed_by_two_threads_at_once():
    out = run_script("""
        import threading, flowshm
        fd = flowshm.ring_create(1 << 16, 1024)
        c = flowshm.open_fd(fd, "consumer")
        for it in range(200):
            s = flowshm.Set(); s.add(c); s.fileno()  # a helper thread
            stop = False
            def hammer():
                while not stop:
                    try:
                        s.close()
                    except RuntimeError:
                        pass
            t = threading.Thread(target=hammer); t.start()
            s.close()
            stop = True; t.join()
            assert s.closed and len(s) == 0
        print("ok", c.closed)
    """)
    assert out.split() == ["ok", "False"]


# ---- fork ---------------------------------------------------------------------

def test_child_of_fork_leaves_the_parents_handles_alone():
    out = run_script("""
        import os, sys, flowshm
        fd = flowshm.ring_create(1 << 16, 1024)
        p = flowshm.open_fd(fd, "producer")
        c = flowshm.open_fd(fd, "consumer")
        w = flowshm.open_fd(fd, "consumer")
        p.send(b"one")
        s = flowshm.Set(); s.add(w); s.fileno()     # a helper thread, armed
        for _ in range(2):
            try:
                s.poll(timeout=0)
            except BlockingIOError:
                pass
        c.fileno()                                  # its own set, too
        r = p.reserve(4)                            # a claim of the parent's
        pid = os.fork()
        if pid == 0:
            for call in (lambda: c.recv(timeout=0), lambda: p.send(b"x"),
                         lambda: s.poll(timeout=0), lambda: r.commit(),
                         lambda: flowshm.Set().add(c)):
                try:
                    call()
                except RuntimeError as e:
                    assert "used after fork" in str(e), e
                else:
                    sys.exit("a call in the child did not raise")
            c.close()                               # forgets, no error
            assert c.closed
            sys.exit(0)     # finalization deallocates the rest
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0, st
        r.view[:] = b"abcd"
        r.commit()
        print(c.recv(timeout=0), c.recv(timeout=0), w.recv(timeout=0))
        p.send(b"two", timeout=0)
        print(c.recv(timeout=0), s.poll(timeout=0) == [w])
    """)
    assert out.split("\n")[:2] == ["b'one' b'abcd' b'one'", "b'two' True"]


# ---- release after a cut (ESTALE) -------------------------------------------

def test_record_released_after_a_cut_raises_estale(pair, monkeypatch):
    d = pair.a
    d.ctl("flow", "create", "lag", "--ring-size", "64K", "--max-record",
          "1K", "--max-lag", "16K")
    monkeypatch.setenv("FLOWMOVER_SOCKET", d.sock)
    with flowshm.attach("lag", "consumer") as slow, \
         flowshm.attach("lag", "consumer") as fast, \
         flowshm.attach("lag", "producer") as p:
        p.send(b"first")
        r = slow.peek(timeout=0)
        for _ in range(300):    # ~300 KB through a 64 KiB ring
            p.send(b"x" * 1000, timeout=10)
            fast.recv(timeout=0)
        # what r looked at in place may have been overwritten meanwhile
        with pytest.raises(flowshm.Error) as e:
            r.release()
        assert e.value.errno == errno.ESTALE and not r.live
        with pytest.raises(flowshm.Error) as e:
            slow.recv(timeout=0)
        assert e.value.errno == errno.ESTALE


# ---- dropped without the collector -------------------------------------------

def test_dropped_batch_is_pending_at_once(no_gc):
    p, c = ring_pair()
    p.send_batch([b"a", b"b", b"c"])
    b = c.peek_batch(max=2)
    views = list(b)
    assert [bytes(v) for v in views] == [b"a", b"b"]
    del b, views
    b = c.peek_batch()                          # the same, pending
    assert [bytes(v) for v in b] == [b"a", b"b"]
    b.release()
    del b
    assert c.recv(timeout=0) == b"c"


def test_dropped_record_with_a_view_is_let_go_at_once(no_gc):
    p, c = ring_pair()
    p.send(b"rec")
    r = c.peek()
    assert bytes(r.view) == b"rec"
    del r
    with c.peek() as v:                         # the same record again
        assert bytes(v) == b"rec"
    with pytest.raises(BlockingIOError):
        c.recv(timeout=0)


def test_dropped_reservation_with_a_view_is_published_at_once(no_gc):
    fd = flowshm.ring_create(1 << 16, 1024)
    p1 = flowshm.open_fd(fd, "producer")
    p2 = flowshm.open_fd(fd, "producer")
    c = flowshm.open_fd(fd, "consumer")
    os.close(fd)
    r = p1.reserve(8)
    r.view[:] = b"A" * 8
    del r                                       # published on dealloc
    p2.send(b"from p2")
    p1.send(b"x", timeout=0)
    assert c.recv_batch() == [b"A" * 8, b"from p2", b"x"]


def test_views_are_released_with_their_record_or_batch(no_gc):
    p, c = ring_pair()
    p.send_batch([b"a", b"b"])
    r = c.peek()
    v1 = r.view
    assert r.view is v1                         # one at a time
    r.release()
    with pytest.raises(ValueError):
        bytes(v1)
    b = c.peek_batch()
    v2 = b[0]
    assert b[0] is v2
    b.release()
    with pytest.raises(ValueError):
        bytes(v2)


# ---- a Record let go, then peek_batch ----------------------------------------

def test_peek_batch_after_a_record_let_go():
    p, c = ring_pair()
    p.send_batch([b"a", b"b", b"c"])
    r = c.peek()
    del r                                       # let go, not consumed
    b = c.peek_batch()
    assert [bytes(v) for v in b] == [b"a"]      # the record let go
    del b
    c.release_batch()                           # pending: consumed now
    try:
        with c.peek() as v:
            assert bytes(v) == b"b"
            raise KeyError                      # a failed stage: kept
    except KeyError:
        pass
    with c.peek_batch() as views:
        assert [bytes(v) for v in views] == [b"b"]
    assert [bytes(v) for v in c.peek_batch()] == [b"c"]


# ---- what C cannot hold --------------------------------------------------------

def test_ring_create_refuses_what_c_would_wrap():
    for size, max_record in ((2**64 + 65536, 1024), (-(2**64) + 65536, 1024),
                             (-1, 1024), (65536, 2**32 + 1024),
                             (65536, -(2**32) + 1024)):
        with pytest.raises(OverflowError):
            flowshm.ring_create(size, max_record)
    with pytest.raises(TypeError):
        flowshm.ring_create(65536.0, 1024)
    os.close(flowshm.ring_create(65536, 1024))


def test_strerror_refuses_what_an_int_cannot_hold():
    for e in (2**31, -(2**31), -(2**63), 2**63 - 1):
        with pytest.raises(OverflowError):
            flowshm.strerror(e)
    assert flowshm.strerror(-errno.EPIPE) == flowshm.strerror(errno.EPIPE)


def test_names_with_a_null_character_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWMOVER_SOCKET", str(tmp_path / "none.sock"))
    with pytest.raises(ValueError, match="null"):
        flowshm.attach("a\0b", "consumer")
    p, c = ring_pair()
    if hasattr(c, "set_wait"):
        with pytest.raises(ValueError):
            c.set_wait("spin\0")
