"""Batch zero-copy reads (Flow.peek_batch, Batch) and flow sets with a
descriptor (flowshm.Set), issue 11: every call and exception, the views'
lifetime after a release, a flow closed while in a set, fairness over a
busy flow and two sparse ones, and asyncio over a set's fd."""
import asyncio
import errno
import gc
import os
import threading
import time

import numpy as np
import pytest

import flowshm
from rings import ring_pair

def recs(n, tag=b"r"):
    return [tag + i.to_bytes(4, "little") for i in range(n)]


# ---- peek_batch ---------------------------------------------------------------

def test_peek_batch_views_are_read_only_zero_copy_numpy(ring):
    p, c = ring
    p.send_batch(recs(10))
    b = c.peek_batch(max=4, timeout=1)
    assert isinstance(b, flowshm.Batch) and b.live and len(b) == 4
    assert [bytes(v) for v in b] == recs(10)[:4]
    assert all(isinstance(v, memoryview) and v.readonly for v in b)
    assert len(b.producers) == 4 and b.producers[0] == c.last_producer
    a = np.frombuffer(b[1], np.uint8)
    assert not a.flags.writeable and a.tobytes() == recs(10)[1]
    # zero copy: the array's memory is the view's (in the ring)
    assert np.shares_memory(a, np.frombuffer(b[1], np.uint8))
    with pytest.raises(TypeError):
        b[0][0] = 1
    del a
    b.release()
    assert not b.live
    assert [bytes(v) for v in c.peek_batch(max=64)] == recs(10)[4:]
    c.release_batch()
    with pytest.raises(BlockingIOError):
        c.peek_batch(timeout=0)


def test_every_view_of_a_released_batch_raises():
    p, c = ring_pair()
    p.send_batch(recs(5))
    b = c.peek_batch()
    views = list(b)
    saved = b[2]
    b.release()
    for v in views + [saved]:
        with pytest.raises(ValueError):
            bytes(v)
        with pytest.raises(ValueError):
            np.frombuffer(v, np.uint8)
    with pytest.raises(ValueError):
        b[0]
    with pytest.raises(ValueError):
        list(b)
    b.release()                               # a no-op once released
    # the ring memory is reused meanwhile: nothing reads it through b
    for _ in range(3):                        # laps of the 64 KiB ring
        p.send_batch([b"x" * 900] * 50, timeout=5)
        assert c.recv_batch(max=1000) == [b"x" * 900] * 50


def test_with_block_releases_the_batch_and_its_views():
    p, c = ring_pair()
    p.send_batch(recs(3))
    with c.peek_batch() as views:
        assert isinstance(views, list)
        assert [bytes(v) for v in views] == recs(3)
        keep = views[0]
    with pytest.raises(ValueError):
        keep.tobytes()
    with pytest.raises(BlockingIOError):
        c.recv(timeout=0)                     # consumed


def test_release_refused_while_numpy_holds_a_view():
    p, c = ring_pair()
    p.send_batch(recs(3))
    b = c.peek_batch()
    a = np.frombuffer(b[2], np.uint8)
    sub = b[1][1:]                            # a slice of a view
    with pytest.raises(BufferError):
        b.release()
    assert b.live
    assert a.tobytes() == recs(3)[2]          # still in the ring, unreleased
    with pytest.raises(BufferError):
        c.close()
    del a
    with pytest.raises(BufferError):
        b.release()                           # the slice still holds it
    assert sub.tobytes() == recs(3)[1][1:]
    sub.release()
    b.release()
    assert not b.live
    with pytest.raises(BlockingIOError):
        c.recv(timeout=0)


def test_with_that_raises_leaves_the_batch_next():
    p, c = ring_pair()
    p.send_batch(recs(4))
    with pytest.raises(KeyError):
        with c.peek_batch(max=3) as views:
            keep = views[0]
            raise KeyError("stage failed")
    with pytest.raises(ValueError):
        keep.tobytes()                        # views go with the block
    with pytest.raises(RuntimeError):
        c.recv(timeout=0)                     # the batch is pending
    with pytest.raises(RuntimeError):
        c.peek(timeout=0)
    again = c.peek_batch(max=1)               # the same records again
    assert [bytes(v) for v in again] == recs(4)[:3]
    del again                                 # dropped unreleased: pending
    gc.collect()
    c.release_batch()                         # consumes the pending batch
    assert c.recv(timeout=0) == recs(4)[3]


def test_batch_calls_refused_while_held(ring):
    p, c = ring
    p.send_batch(recs(4))
    b = c.peek_batch(max=2)
    for call in (c.recv, c.peek, c.peek_batch, c.recv_batch):
        with pytest.raises(RuntimeError):
            call(timeout=0)
    with pytest.raises(BufferError):
        memoryview(b)                         # only per record: b[i]
    c.release_batch()                         # the Flow's way to release it
    assert not b.live
    with pytest.raises(flowshm.Error) as e:
        c.release_batch()                     # nothing held
    assert e.value.errno == errno.EINVAL
    r = c.peek()
    with pytest.raises(RuntimeError):
        c.peek_batch(timeout=0)               # a Record is held
    r.release()
    assert [bytes(v) for v in c.peek_batch()] == recs(4)[3:]
    c.release_batch()


def test_peek_batch_errors(ring):
    p, c = ring
    with pytest.raises(BlockingIOError) as e:
        c.peek_batch(timeout=0)
    assert e.value.errno == errno.EAGAIN
    with pytest.raises(TimeoutError):
        c.peek_batch(timeout=0.05)
    with pytest.raises(ValueError):
        c.peek_batch(max=0)
    with pytest.raises(ValueError):
        c.peek_batch(timeout=-1)
    with pytest.raises(flowshm.Error) as e:
        p.peek_batch()
    assert e.value.errno == errno.EINVAL
    with pytest.raises(flowshm.Error):
        p.release_batch()
    p.send(b"last")
    p.shutdown()
    assert [bytes(v) for v in c.peek_batch(timeout=0)] == [b"last"]
    c.release_batch()
    with pytest.raises(BrokenPipeError):
        c.peek_batch(timeout=0)


def test_peek_batch_end_of_stream_and_wait():
    p, c = ring_pair()
    threading.Timer(0.1, lambda: p.send(b"late")).start()
    with c.peek_batch(timeout=5) as views:    # waits for the first
        assert [bytes(v) for v in views] == [b"late"]
    p.end()
    with pytest.raises(flowshm.EndOfStream):
        c.peek_batch(timeout=0)


def test_close_with_a_batch_leaves_it_for_the_next_consumer():
    fd = flowshm.ring_create(1 << 16, 1024)
    try:
        p = flowshm.open_fd(fd, "producer")
        c = flowshm.open_fd(fd, "consumer")
        p.send_batch(recs(3))
        b = c.peek_batch()
        v = b[0]
        c.close()
        assert not b.live and c.closed
        with pytest.raises(ValueError):
            v.tobytes()
        with flowshm.open_fd(fd, "consumer") as c2:
            assert c2.recv_batch() == recs(3)
    finally:
        os.close(fd)


def test_batches_across_laps_of_the_ring_exactly_once():
    p, c = ring_pair(size=1 << 12, max_record=256)
    n, got = 5000, []

    def produce():
        for i in range(n):
            p.send(i.to_bytes(4, "little") * (1 + i % 7), timeout=10)

    t = threading.Thread(target=produce)
    t.start()
    while len(got) < n:
        with c.peek_batch(max=32, timeout=10) as views:
            got.extend(bytes(v) for v in views)
    t.join()
    assert got == [i.to_bytes(4, "little") * (1 + i % 7) for i in range(n)]


# ---- Set ------------------------------------------------------------------------

def test_set_add_remove_poll_and_errors():
    pcs = [ring_pair() for _ in range(3)]
    cs = [c for _, c in pcs]
    s = flowshm.Set()
    with pytest.raises(flowshm.Error) as e:
        s.poll(timeout=0)                     # empty
    assert e.value.errno == errno.EINVAL
    for c in cs:
        s.add(c)
    assert len(s) == 3 and cs[1] in s and s.flows == tuple(cs)
    with pytest.raises(flowshm.Error) as e:
        s.add(cs[0])
    assert e.value.errno == errno.EEXIST
    with pytest.raises(flowshm.Error) as e:
        s.add(pcs[0][0])                      # a producer
    assert e.value.errno == errno.EINVAL
    with pytest.raises(TypeError):
        s.add(object())
    with pytest.raises(BlockingIOError):
        s.poll(timeout=0)
    with pytest.raises(TimeoutError):
        s.poll(timeout=0.05)
    pcs[2][0].send(b"two")
    pcs[0][0].send(b"zero")
    ready = s.poll(timeout=1)
    assert sorted(ready, key=cs.index) == [cs[0], cs[2]]
    assert len(s.poll(timeout=0, max=1)) == 1
    with pytest.raises(ValueError):
        s.poll(max=0)
    s.remove(cs[0])
    assert cs[0] not in s and len(s) == 2
    with pytest.raises(KeyError):
        s.remove(cs[0])
    assert s.poll(timeout=0) == [cs[2]]
    assert cs[2].recv() == b"two"
    s.close()
    assert s.closed
    s.close()                                 # idempotent
    for call in (lambda: s.poll(timeout=0), lambda: s.add(cs[1]),
                 s.fileno):
        with pytest.raises(ValueError):
            call()


def test_set_poll_waits_without_the_gil():
    p, c = ring_pair()
    ticks = [0]
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.01)

    threading.Thread(target=tick).start()
    threading.Timer(0.3, lambda: p.send(b"late")).start()
    with flowshm.Set() as s:
        s.add(c)
        try:
            assert s.poll(timeout=10) == [c]
        finally:
            stop.set()
    assert ticks[0] >= 5                      # ran while poll waited
    assert c.recv(timeout=0) == b"late"


def test_set_holds_its_flows_and_a_closed_flow_leaves_it():
    (p1, c1), (p2, c2) = ring_pair(), ring_pair()
    s = flowshm.Set()
    s.add(c1)
    s.add(c2)
    del c2
    gc.collect()
    c2 = s.flows[1]                           # kept alive by the set
    p1.send(b"one")
    p2.send(b"two")
    c1.close()                                # leaves every set it is in
    assert c1 not in s and len(s) == 1
    with pytest.raises(KeyError):
        s.remove(c1)
    assert s.poll(timeout=0) == [c2]
    with pytest.raises(ValueError):
        s.add(c1)                             # closed
    assert c2.recv() == b"two"
    with pytest.raises(BlockingIOError):
        s.poll(timeout=0)
    c2.close()
    assert len(s) == 0
    with pytest.raises(flowshm.Error):
        s.poll(timeout=0)
    s.close()


def test_set_close_and_flow_in_two_sets():
    p, c = ring_pair()
    a, b = flowshm.Set(), flowshm.Set()
    a.add(c)
    b.add(c)
    a.fileno()
    p.send(b"x")
    assert a.poll(timeout=0) == [c] and b.poll(timeout=0) == [c]
    a.close()
    assert b.poll(timeout=0) == [c]
    c.close()
    assert len(b) == 0
    b.close()


def test_set_refuses_a_flow_in_use_by_another_thread():
    p, c = ring_pair()
    s = flowshm.Set()
    s.add(c)
    def waits():
        with pytest.raises(TimeoutError):
            s.poll(timeout=0.5)

    t = threading.Thread(target=waits)
    t.start()
    time.sleep(0.1)
    with pytest.raises(RuntimeError):
        c.recv(timeout=0)
    with pytest.raises(RuntimeError):
        s.poll(timeout=0)
    with pytest.raises(RuntimeError):
        c.close()
    t.join()
    s.close()


def test_set_fairness_busy_flow_and_two_sparse_ones():
    """Serving only the first ready flow of each poll: the two sparse
    flows get every record while the third is flooded."""
    pcs = [ring_pair(size=1 << 20, max_record=64) for _ in range(3)]
    cs = [c for _, c in pcs]
    busy_p, busy = pcs[0]
    per_sparse = 20
    stop = threading.Event()

    def flood():
        i = 0
        while not stop.is_set():
            try:
                busy_p.send(i.to_bytes(8, "little"), timeout=0.1)
                i += 1
            except TimeoutError:
                pass

    def sparse():
        for i in range(per_sparse):
            for p, _ in pcs[1:]:
                p.send(i.to_bytes(8, "little"), timeout=5)
            time.sleep(0.005)

    busy_p.send_batch([b"f" * 8] * 5000)     # ready from the first poll
    s = flowshm.Set()
    for c in cs:
        s.add(c)
    got = {id(c): [] for c in cs}
    threads = [threading.Thread(target=flood), threading.Thread(target=sparse)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30          # a bound on failure only
    try:
        while (len(got[id(cs[1])]) < per_sparse or
               len(got[id(cs[2])]) < per_sparse):
            assert time.monotonic() < deadline, \
                {i: len(got[id(c)]) for i, c in enumerate(cs)}
            f = s.poll(timeout=1, max=1)[0]   # serve the first only
            got[id(f)].append(f.recv(timeout=0))
    finally:
        stop.set()
        for t in threads:
            t.join()
        s.close()
    for c in cs[1:]:
        assert got[id(c)] == [i.to_bytes(8, "little")
                              for i in range(per_sparse)]
    assert len(got[id(busy)]) > 0


def test_set_fairness_in_turn_when_all_are_ready():
    pcs = [ring_pair() for _ in range(3)]
    cs = [c for _, c in pcs]
    pcs[0][0].send_batch([b"busy"] * 1000)
    for p, _ in pcs[1:]:
        p.send_batch([b"s"] * 5)
    served = {id(c): 0 for c in cs}
    with flowshm.Set() as s:
        for c in cs:
            s.add(c)
        for _ in range(3 * 5):                # each in turn: 5 rounds
            f = s.poll(timeout=0, max=1)[0]
            f.recv(timeout=0)
            served[id(f)] += 1
    assert list(served.values()) == [5, 5, 5]


def test_asyncio_awaits_records_of_two_flows_through_the_set_fd():
    (p1, c1), (p2, c2) = ring_pair(), ring_pair()
    n = 300

    async def main():
        loop = asyncio.get_running_loop()
        q = asyncio.Queue()
        s = flowshm.Set()
        s.add(c1)
        s.add(c2)

        def readable():
            try:
                ready = s.poll(timeout=0)     # BlockingIOError re-arms
            except BlockingIOError:
                return
            for f in ready:
                try:
                    for rec in f.recv_batch(max=16, timeout=0):
                        q.put_nowait((f, rec))
                except BlockingIOError:
                    pass
            loop.call_soon(readable)          # poll again, after others

        loop.add_reader(s.fileno(), readable)

        def produce(p, tag):
            for i in range(n):
                p.send(tag + i.to_bytes(2, "little"), timeout=5)
                if i % 25 == 0:
                    time.sleep(0.01)          # let the loop go idle

        ts = [threading.Thread(target=produce, args=(p1, b"a")),
              threading.Thread(target=produce, args=(p2, b"b"))]
        for t in ts:
            t.start()
        got = {c1: [], c2: []}
        try:
            for _ in range(2 * n):
                f, rec = await asyncio.wait_for(q.get(), 20)
                got[f].append(rec)
        finally:
            loop.remove_reader(s.fileno())
            for t in ts:
                t.join()
            s.close()
        return got

    got = asyncio.run(main())
    assert got[c1] == [b"a" + i.to_bytes(2, "little") for i in range(n)]
    assert got[c2] == [b"b" + i.to_bytes(2, "little") for i in range(n)]


def test_new_calls_have_docstrings():
    for obj in (flowshm.Batch, flowshm.Set, flowshm.Flow.peek_batch,
                flowshm.Flow.release_batch, flowshm.Batch.release,
                flowshm.Set.add, flowshm.Set.remove, flowshm.Set.poll,
                flowshm.Set.fileno, flowshm.Set.close):
        assert obj.__doc__, obj
    assert flowshm.SET_MAX == 127
    with pytest.raises(TypeError):
        flowshm.Set(1)
    s = flowshm.Set()
    assert repr(s) == "<flowshm.Set of 0 flow(s)>"
    s.close()
    assert repr(s).endswith(" closed>")
