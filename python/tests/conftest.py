"""Fixtures: rings without a daemon, and two real moverd over TCP."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import flowshm  # noqa: E402  (the build tree's, through PYTHONPATH)
from moverd_pair import Pair  # noqa: E402


def tool(var):
    path = os.environ.get(var)
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"{var} not set (ctest sets it)")
    return path


@pytest.fixture
def ring():
    """(producer, consumer) of a fresh 64 KiB ring, max record 4 KiB."""
    fd = flowshm.ring_create(1 << 16, 4096)
    p = flowshm.open_fd(fd, "producer")
    c = flowshm.open_fd(fd, "consumer")
    os.close(fd)
    yield p, c
    for f in (p, c):
        try:
            f.close()
        except (BufferError, RuntimeError):
            pass


@pytest.fixture
def pair():
    p = Pair(tool("FM_MOVERD"), tool("FM_MOVERCTL"))
    try:
        yield p.start()
    finally:
        p.a.alive()
        p.b.alive()
        p.cleanup()
