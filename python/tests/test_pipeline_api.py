"""The pipeline calls (issues 11 and 15), where the library has them:
end of stream (alone and through two moverd over TCP), poll over several
flows and its fairness, the flow's state, producer identity, and fileno()
under asyncio."""
import asyncio
import errno
import os
import threading
import time

import pytest

import flowshm

pytestmark = pytest.mark.skipif(
    not hasattr(flowshm, "poll"),
    reason="built against a flowshm.h without the pipeline calls")


def ring_pair(size=1 << 16, max_record=1024):
    fd = flowshm.ring_create(size, max_record)
    p = flowshm.open_fd(fd, "producer")
    c = flowshm.open_fd(fd, "consumer")
    return fd, p, c


def test_end_of_stream_alone():
    fd, p, c = ring_pair()
    os.close(fd)
    p.send_batch([b"1", b"2"])
    p.end()
    with pytest.raises(BrokenPipeError):
        p.send(b"late")
    assert list(c) == [b"1", b"2"]              # then StopIteration
    with pytest.raises(flowshm.EndOfStream) as e:
        c.recv()
    assert e.value.errno == errno.ENODATA
    assert isinstance(e.value, flowshm.Error)
    with pytest.raises(flowshm.EndOfStream):
        c.peek(timeout=0)
    assert c.state()["state"] in ("ended", "unknown")


def test_end_of_stream_across_two_daemons(pair, monkeypatch):
    pair.create("eos")
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.b.sock)
    c = flowshm.attach("eos", "consumer")
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.a.sock)
    with flowshm.attach("eos", "producer") as p:
        for i in range(1000):
            p.send(i.to_bytes(4, "little"), timeout=10)
        p.end()
    got = []
    deadline = time.monotonic() + 30
    while True:
        try:
            got.append(c.recv(timeout=1))
        except flowshm.EndOfStream:
            break
        except TimeoutError:
            assert time.monotonic() < deadline, f"{len(got)} records"
    assert got == [i.to_bytes(4, "little") for i in range(1000)]
    assert c.state()["state"] == "ended"
    c.close()


def test_state_of_a_flow_through_moverd(pair, monkeypatch):
    pair.create("st")
    monkeypatch.setenv("FLOWMOVER_SOCKET", pair.a.sock)
    with flowshm.attach("st", "producer") as p:
        st = p.state()
        assert st["state"] == "open" and st["daemon"] == "up"
        assert st["producers"] >= 1 and st["reason"] == 0
        assert set(st) == {"state", "reason", "since", "producers",
                           "consumers", "lag_bytes", "daemon"}
    fd, p, c = ring_pair()
    os.close(fd)
    assert c.state()["daemon"] == "none"


def test_poll_returns_the_ready_flows_in_turn():
    rings = [ring_pair() for _ in range(3)]
    for fd, _, _ in rings:
        os.close(fd)
    cs = [c for _, _, c in rings]
    with pytest.raises(BlockingIOError):
        flowshm.poll(cs, timeout=0)
    with pytest.raises(TimeoutError):
        flowshm.poll(cs, timeout=0.05)
    rings[1][1].send(b"x")
    assert flowshm.poll(cs, timeout=1) == [cs[1]]
    # every flow busy: the first of the list moves on by one each call
    rings[0][1].send(b"y")
    rings[2][1].send(b"z")
    firsts = {flowshm.poll(cs, timeout=0)[0] for _ in range(3)}
    assert firsts == set(cs)
    with pytest.raises(flowshm.Error) as e:
        flowshm.poll([rings[0][1]])              # a producer
    assert e.value.errno == errno.EINVAL
    with pytest.raises(TypeError):
        flowshm.poll([object()])
    with pytest.raises(ValueError):
        flowshm.poll([])


def test_poll_wakes_when_another_thread_sends():
    fd, p, c = ring_pair()
    os.close(fd)
    threading.Timer(0.1, lambda: p.send(b"late")).start()
    t0 = time.monotonic()
    assert flowshm.poll([c], timeout=5) == [c]
    assert time.monotonic() - t0 < 4
    assert c.recv() == b"late"


def test_last_producer_tells_producers_apart():
    fd, p1, c = ring_pair()
    p2 = flowshm.open_fd(fd, "producer")
    os.close(fd)
    p1.send(b"a")
    p2.send(b"b")
    c.recv()
    one = c.last_producer
    c.recv()
    two = c.last_producer
    assert one and two and one != two


def test_fileno_under_asyncio():
    fd, p, c = ring_pair()
    os.close(fd)
    n = 200

    async def main():
        loop = asyncio.get_running_loop()
        got, done = [], asyncio.Event()

        def readable():
            while True:                      # until BlockingIOError:
                try:                         # that re-arms the fd
                    got.append(c.recv(timeout=0))
                except BlockingIOError:
                    break
            if len(got) >= n:
                done.set()

        loop.add_reader(c.fileno(), readable)

        def produce():
            for i in range(n):
                p.send(i.to_bytes(2, "little"), timeout=5)
                if i % 20 == 0:
                    time.sleep(0.01)         # let the loop go idle

        t = threading.Thread(target=produce)
        t.start()
        try:
            await asyncio.wait_for(done.wait(), 20)
        finally:
            loop.remove_reader(c.fileno())
            t.join()
        return got

    got = asyncio.run(main())
    assert got == [i.to_bytes(2, "little") for i in range(n)]
    with pytest.raises(flowshm.Error):
        p.fileno()
    c.close()
