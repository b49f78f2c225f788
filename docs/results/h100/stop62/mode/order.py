"""The held timer's sample order: flush then hold (as landed), hold then flush (the whole sample enqueued before the
device runs the flush), flush then a host wait for it, then the hold. Decode suite rows, the bench's own
implementations (ours contiguous / paged 16 / paged 256, SDPA flash / cuDNN) on the bench's inputs; 5 rotated
rounds of every (impl, order), 80 ms a timer call. argv: case names (decode suite)."""
import sys
import types
import numpy as np
from attention import decode_bench as db
from cukernels import timing
SETTLES = ("flush-hold", "hold-flush", "flush-sync")
args = types.SimpleNamespace(dtype="bf16")
allc = {c.name: c for c in db.cases("decode", args)}
for name in sys.argv[1:]:
    case = allc[name]
    inputs = db.make_inputs(case, 0)
    fns = {}
    for impl in db.impls(args):
        if impl.unavailable() or impl.supports(case):
            continue
        fns[impl.name] = impl.prepare(case, inputs)
    for f in fns.values():
        f()
    combos = [(n, s) for n in fns for s in SETTLES]
    res = {c: [] for c in combos}
    for r in range(5):
        for c in combos[r * 7 % len(combos):] + combos[:r * 7 % len(combos)]:
            timing.SAMPLE_ORDER = c[1]
            res[c].append(timing.benchmark(fns[c[0]], budget_ms=80).median_ms * 1e3)
    timing.SAMPLE_ORDER = "flush-hold"
    print(f"== {name}: held us, median of 5 rotated rounds, by sample order")
    print("   impl          " + "".join(f"{s:>12s}" for s in SETTLES))
    med = {c: float(np.median(v)) for c, v in res.items()}
    for n in fns:
        print(f"   {n:14s}" + "".join(f"{med[(n, s)]:12.2f}" for s in SETTLES), flush=True)
    best = {s: min(med[(n, s)] for n in fns if n.startswith("torch")) for s in SETTLES}
    print("   ours/fastest torch " + "".join(f"{best[s] / med[('ours', s)]:12.3f}" for s in SETTLES))
    for p in ("ours-paged16", "ours-paged256"):
        if p in fns:
            print(f"   {p}/ours " + "".join(f"{med[(p, s)] / med[('ours', s)]:12.3f}" for s in SETTLES))
    print("   rounds:", {f"{c[0]}@{c[1]}": [round(x, 2) for x in v] for c, v in res.items()}, flush=True)
