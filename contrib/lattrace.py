#!/usr/bin/env python3
"""Hop table of one record's way from FM_LATTRACE dumps (ipc/lattrace.h).

  FM_LATTRACE=/tmp/lt flowbench remote --only pingpong --sizes 32
  contrib/lattrace.py pingpong /tmp/lt          # pinger send .. echo back
  FM_LATTRACE=/tmp/lt flowbench remote --only latency --sizes 32
  contrib/lattrace.py oneway /tmp/lt 3000       # records >= 3 ms apart
                                                #   (the sparse run)

moverd A is the daemon with the lower pid (flowbench starts it first).
Each exchange (or record) is the list of marks of every process between
its first and last mark; exchanges are grouped by that sequence and the
most common sequences are printed with the p50/p90 of every step, in us.
"""
import collections
import glob
import os
import sys

NAMES = {1: 'sleep', 2: 'wake', 3: 'bell', 4: 'txsub', 5: 'txdone',
         7: 'publish', 9: 'rxhdr', 10: 'rxbody', 11: 'work', 20: 'send',
         21: 'sent', 22: 'got', 30: 'got', 31: 'sent', 40: 'bellwake',
         41: 'conswake', 42: 'cwait', 43: 'cwoke', 50: 'send', 52: 'got'}
TAGS = {'pinger': 'p', 'echo': 'e', 'prod': 'P', 'cons': 'C'}


def load(d):
    files = glob.glob(os.path.join(d, '*.*'))
    daemons = sorted(int(f.rsplit('.', 1)[1]) for f in files
                     if os.path.basename(f).startswith('moverd.'))
    tag_of = {pid: 'AB'[i] for i, pid in enumerate(daemons[:2])}
    ev = []
    for f in files:
        who, pid = os.path.basename(f).rsplit('.', 1)
        tag = tag_of.get(int(pid), TAGS.get(who, '?'))
        with open(f) as fh:
            for line in fh:
                ns, e, _, arg = line.split()
                ev.append((int(ns), tag, int(e), int(arg)))
    ev.sort()
    return ev


def chains(ev, start, end, gap_ns):
    prev = None
    for i, (ns, tag, e, _) in enumerate(ev):
        if (tag, e) != start:
            continue
        ok = prev is None or ns - prev >= gap_ns
        prev = ns
        if not ok:
            continue
        out = []
        for j in range(i, len(ev)):  # not ev[i:]: a copy per chain
            out.append(ev[j])
            if (ev[j][1], ev[j][2]) == end:
                yield out
                break


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ('pingpong', 'oneway'):
        sys.exit(__doc__)
    ev = load(sys.argv[2])
    if sys.argv[1] == 'pingpong':
        start, end, gap = ('p', 20), ('p', 22), 0
    else:
        start, end = ('P', 50), ('C', 52)
        gap = float(sys.argv[3]) * 1e3 if len(sys.argv) > 3 else 0
    groups = collections.defaultdict(list)
    totals = []
    for c in chains(ev, start, end, gap):
        key = tuple(f'{t}:{NAMES.get(e, e)}' for _, t, e, _ in c)
        groups[key].append([b[0] - a[0] for a, b in zip(c, c[1:])])
        totals.append(c[-1][0] - c[0][0])
    if not totals:
        sys.exit('no complete exchange in the trail')
    totals.sort()
    print(f'{len(totals)} chains, first to last mark p50 '
          f'{totals[len(totals) // 2] / 1e3:.1f} us')
    for key, rows in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:3]:
        print(f'\n{len(rows)} chains with this sequence:')
        for k in range(len(key) - 1):
            col = sorted(r[k] for r in rows)
            print(f'  {key[k]:>12} -> {key[k + 1]:<12} p50 '
                  f'{col[len(col) // 2] / 1e3:7.1f}  p90 '
                  f'{col[len(col) * 9 // 10] / 1e3:7.1f}')


if __name__ == '__main__':
    main()
