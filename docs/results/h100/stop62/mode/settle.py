"""The held timer with a settle time: the hold lasts at least S us from its start (the L2 flush's end), so the
timed call starts >= S us after the flush whatever its host path took. Decode suite rows, the bench's own
implementations (ours contiguous / paged 16 / paged 256, SDPA flash / cuDNN) on the bench's inputs, for S in
SETTLES; 5 rotated rounds of every (impl, S), 80 ms a timer call. argv: case names (decode suite)."""
import sys
import types
import numpy as np
from attention import decode_bench as db
from cukernels import timing
SETTLES = (0, 5, 10, 20, 40)
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
            timing.HOLD_SETTLE_NS = c[1] * 1000
            res[c].append(timing.benchmark(fns[c[0]], budget_ms=80).median_ms * 1e3)
    timing.HOLD_SETTLE_NS = 0
    print(f"== {name}: held us, median of 5 rotated rounds, by settle time (us)")
    print("   impl          " + "".join(f"{s:>9d}" for s in SETTLES))
    med = {c: float(np.median(v)) for c, v in res.items()}
    for n in fns:
        print(f"   {n:14s}" + "".join(f"{med[(n, s)]:9.2f}" for s in SETTLES), flush=True)
    best = {s: min(med[(n, s)] for n in fns if n.startswith("torch")) for s in SETTLES}
    print("   ours/fastest torch " + "".join(f"{best[s] / med[('ours', s)]:9.3f}" for s in SETTLES))
    for p in ("ours-paged16", "ours-paged256"):
        if p in fns:
            print(f"   {p}/ours " + "".join(f"{med[(p, s)] / med[('ours', s)]:9.3f}" for s in SETTLES))
    print("   rounds:", {f"{c[0]}@{c[1]}": [round(x, 2) for x in v] for c, v in res.items()}, flush=True)
