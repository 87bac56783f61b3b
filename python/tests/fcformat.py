"""The records of tests/flowcheck.c (and tests/testutil.h's tu_fill), made
and checked in Python, so a Python stage and flowcheck can be each other's
producer and consumer and check every byte."""
import struct

M64 = (1 << 64) - 1
HDR = 16          # struct tu_rec_hdr: producer u32, len u32, seq u64


def mix(x):
    """tu_mix: splitmix64's finaliser."""
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def salt(flow):
    """flowcheck's flow_salt: FNV-1a of the name, high 24 bits."""
    h = 2166136261
    for ch in flow.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h & ~0xFF & 0xFFFFFFFF


def rec_size(wire_id, seq, max_size=4096, max_record=1 << 16):
    """flowcheck's rec_size (min 16 bytes)."""
    m = max_size
    if (mix(((wire_id << 32) ^ seq ^ 0xB16) & M64) & 63) == 0:
        m *= 4
    m = min(m, max_record)
    return HDR + mix(((wire_id << 40) ^ seq) & M64) % (m - HDR + 1)


def fill(wire_id, seq, n):
    """tu_fill: the header, then bytes of a mix chain from (id, seq)."""
    out = bytearray(struct.pack("<IIQ", wire_id, n, seq)[:n])
    x = ((wire_id << 48) ^ seq) & M64
    for _ in range(HDR, n, 8):
        x = mix(x)
        out += x.to_bytes(8, "little")
    del out[n:]
    return bytes(out)


def records(flow, producer_id, count, max_size=4096, max_record=1 << 16):
    """(seq, payload) of what `flowcheck produce FLOW --id ID` sends."""
    wire = salt(flow) | producer_id
    for seq in range(count):
        yield seq, fill(wire, seq, rec_size(wire, seq, max_size, max_record))
