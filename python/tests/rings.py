"""Rings without a daemon, for the tests that need more than conftest's
`ring` fixture (several rings, other sizes)."""
import os

import flowshm


def ring_pair(size=1 << 16, max_record=1024):
    """(producer, consumer) of a fresh ring; its fd is closed."""
    fd = flowshm.ring_create(size, max_record)
    p = flowshm.open_fd(fd, "producer")
    c = flowshm.open_fd(fd, "consumer")
    os.close(fd)
    return p, c
