"""Offline analysis of tl_raw.py's stamps (saved per CTA: start, Q landed, first K, loop done, stored, SM id; global
timer ns): time each SM spends with 0 / 1 / 2 CTAs resident, the fixed share of a CTA's time, and the gap between a
CTA's end and the next CTA's start on the same SM. python analyse.py tl_seed004a_causal.npy ..."""
import sys
import numpy as np

for path in sys.argv[1:]:
    a = np.load(path)[-1]
    rows = a[a[:, 0] > 0].astype(np.float64)
    t = (rows[:, :5] - rows[:, 0].min()) / 1e3
    sm = rows[:, 5].astype(int)
    T, sms = t[:, 4].max(), np.unique(sm)
    at = np.zeros(4)
    gaps = []
    for s in sms:
        ev = sorted([(x, 1) for x in t[sm == s, 0]] + [(x, -1) for x in t[sm == s, 4]])
        c, last = 0, 0.0
        for x, d in ev:
            at[min(c, 3)] += x - last
            c, last = c + d, x
        at[0] += T - last
        starts = np.sort(t[sm == s, 0])
        for e in np.sort(t[sm == s, 4]):
            nxt = starts[starts >= e]
            if len(nxt):
                gaps.append(nxt[0] - e)
    dur = t[:, 4] - t[:, 0]
    fixed = (t[:, 2] - t[:, 0]) + (t[:, 4] - t[:, 3])
    g = np.array(gaps) if gaps else np.zeros(1)
    print(f"{path}: {len(rows)} CTAs, kernel {T:.1f} us; per SM us at 0/1/2 resident CTAs "
          + " / ".join(f"{x / len(sms):.1f}" for x in at[:3])
          + f"; fixed (start->first K + store) {fixed.sum() / dur.sum():.3f} of CTA time; end->next start on an SM "
          f"p50 {np.percentile(g, 50):.2f} us (p10 {np.percentile(g, 10):.2f}, p90 {np.percentile(g, 90):.2f})")
