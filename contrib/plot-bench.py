#!/usr/bin/python3
"""plot-bench.py OUT.png [BENCH_OUTPUT ...]

Plots throughput (MB/s, 1 MB = 1e6 bytes) against record size (log x) from
the machine-readable lines of tests/rdma/bench-in-vm.sh:

    BENCH kind=tput transport=rdma size=65536 flows=1 rec_s=... MB_s=... ok=1
    PERFTEST tool=ib_write_bw size=65536 msg_s=... MB_s=...

One line per transport (1 flow; runs with more flows as open markers), and
ib_write_bw from the same run as the reference.  Reads the files named, or
standard input.  Needs matplotlib (Debian: python3-matplotlib).
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402


def fields(line):
    out = {}
    for tok in line.split()[1:]:
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v
    return out


def size_label(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def read(lines):
    tput = {}   # (transport, flows) -> {size: MB_s}
    rate = {}   # (transport, flows) -> {size: rec_s}
    perf = {}   # size -> (MB_s, msg_s)
    title = None
    for line in lines:
        line = line.strip()
        if line.startswith("BENCH ") and "kind=tput" in line:
            f = fields(line)
            if f.get("ok") != "1":
                continue
            key = (f["transport"], int(f["flows"]))
            size = int(f["size"])
            # MB_s is rounded to 0.1 MB/s and rec_s to 1/s: take the more
            # precise of rec_s and records / secs
            mbs = float(f["MB_s"])
            if float(f.get("rec_s", 0)) >= 1000:
                mbs = float(f["rec_s"]) * size / 1e6
            elif float(f.get("secs", 0)) > 0 and "records" in f:
                mbs = int(f["records"]) / float(f["secs"]) * size / 1e6
            tput.setdefault(key, {})[size] = mbs
            rate.setdefault(key, {})[int(f["size"])] = float(f["rec_s"])
        elif line.startswith("PERFTEST ") and "tool=ib_write_bw" in line:
            f = fields(line)
            if float(f.get("msg_s", 0)) > 0:
                perf[int(f["size"])] = (float(f["MB_s"]), float(f["msg_s"]))
        elif "guest: kernel" in line and title is None:
            title = line.split("guest: ", 1)[1]
    return tput, rate, perf, title


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = sys.argv[1]
    lines = []
    if len(sys.argv) > 2:
        for path in sys.argv[2:]:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines += fh.readlines()
    else:
        lines = sys.stdin.readlines()
    tput, rate, perf, title = read(lines)
    if not tput and not perf:
        print("plot-bench.py: no BENCH or PERFTEST lines in the input",
              file=sys.stderr)
        return 1

    colors = {"rdma": "tab:blue", "tcp": "tab:orange", "auto": "tab:green"}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    sizes = set(perf)
    for (tp, flows), pts in sorted(tput.items()):
        xs = sorted(pts)
        sizes.update(xs)
        ys = [pts[x] for x in xs]
        name = {"rdma": "flowmover RDMA", "tcp": "flowmover TCP"}.get(
            tp, f"flowmover {tp}")
        if flows == 1:
            ax.plot(xs, ys, "o-", color=colors.get(tp), lw=2, ms=6,
                    label=f"{name}, 1 flow")
            below = tp != "rdma"    # keep the two lines' labels apart
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points",
                            xytext=(0, -13 if below else 7), ha="center",
                            fontsize=7, color=colors.get(tp))
        else:
            ax.plot(xs, ys, "s", color=colors.get(tp), mfc="none", ms=8,
                    mew=1.5, label=f"{name}, {flows} flows")
    if perf:
        xs = sorted(perf)
        ax.plot(xs, [perf[x][0] for x in xs], "D--", color="black", lw=1.2,
                ms=5, label="ib_write_bw (perftest), same run")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted(sizes)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([size_label(s) for s in ticks])
    ax.set_xlabel("record / message size (bytes)")
    ax.set_ylabel("throughput, MB/s (1e6 B/s, payload)")
    ax.set_title("flowmover over soft-RoCE (rxe0) vs TCP vs ib_write_bw"
                 + (f"\nguest: {title}" if title else ""), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot-bench.py: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
