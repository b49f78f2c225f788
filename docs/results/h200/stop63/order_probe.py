"""Stop 63: the held timer's three sample orders, in one process, on the rows they move most: the MoE decode
layer (E64 top-8 T1 / T4, ours), the attention decode B8 L1k h16-16 d64 q1 (ours, cuDNN) and B1 L1k 32/8 d128 q1
(ours, cuDNN), and a longer row (B8 L8k 32/8 d128 q1). 5 rotated rounds, 80 ms a timer call; the host's enqueue
time of each call beside (what flush-sync leaves the device idle for)."""
import sys, time, types
import numpy as np
import cupy
from attention import decode_bench as db
from moe import bench as mb, suites
from cukernels import timing

args = types.SimpleNamespace(dtype="bf16")
fns = {}
dcases = {c.name: c for c in db.cases("decode", args)}
dimpls = {i.name: i for i in db.impls(args)}
for cname in ("decode_b8_L1k_h16-16_d64_q1", "decode_b1_L1k_h32-8_d128_q1", "decode_b8_L8k_h32-8_d128_q1"):
    inputs = db.make_inputs(dcases[cname], 0)
    short = cname.replace("decode_", "")
    fns[f"{short} ours"] = dimpls["ours"].prepare(dcases[cname], inputs)
    fns[f"{short} cudnn"] = dimpls["torch-cudnn"].prepare(dcases[cname], inputs)
mcases = {c.name: c for c in mb.cases_for(suites.suite("decode"), "bf16")}
for cname in ("decode_E64top8_T1 layer", "decode_E64top8_T4 layer"):
    inp = mb.make_inputs(mcases[cname], 0)
    fns[cname.replace("decode_", "moe ").replace(" layer", "")] = (lambda l, x: lambda: l(x))(inp.layer, inp.x)
for f in fns.values():
    f()
cupy.cuda.Device().synchronize()
enq = {}
for n, f in fns.items():
    ts = []
    for _ in range(20):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        cupy.cuda.Device().synchronize()
    enq[n] = np.median(ts) * 1e6
orders = timing.SAMPLE_ORDERS
combos = [(n, o) for n in fns for o in orders]
res = {c: [] for c in combos}
R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for r in range(R):
    k = r * 7 % len(combos)
    for c in combos[k:] + combos[:k]:
        timing.SAMPLE_ORDER = c[1]
        try:
            res[c].append(timing.benchmark(fns[c[0]], budget_ms=80).median_ms * 1e3)
        finally:
            timing.SAMPLE_ORDER = "flush-sync"
print(f"== held us, median of {R} rotated rounds; host enqueue us per call")
print(f"   {'row':28s} " + " ".join(f"{o:>11s}" for o in orders) + "   enqueue")
for n in fns:
    print(f"   {n:28s} " + " ".join(f"{np.median(res[(n, o)]):11.2f}" for o in orders) + f"   {enq[n]:7.1f}   "
          + " | ".join(str([round(x, 1) for x in res[(n, o)]]) for o in orders), flush=True)
