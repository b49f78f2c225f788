"""B8 L1k h16-16 d64 q1 contiguous decode (the bench's inputs and callables): held time by (programmatic launch
on / off) x (hold settle 0 / 20 us) x (host busy-wait before the launch 0 / 30 us); SDPA cuDNN beside. 7 rotated
rounds, 80 ms a timer call; the fraction of samples over 16.9 us."""
import time
import types
import numpy as np
from attention import decode_bench as db
from cukernels import timing, launch
args = types.SimpleNamespace(dtype="bf16")
case = {c.name: c for c in db.cases("decode", args)}["decode_b8_L1k_h16-16_d64_q1"]
inputs = db.make_inputs(case, 0)
impls = {i.name: i for i in db.impls(args)}
ours = impls["ours"].prepare(case, inputs)
cudnn = impls["torch-cudnn"].prepare(case, inputs)
def wrap(f, pdl, wait_us):
    def g():
        if wait_us:
            t = time.perf_counter() + wait_us * 1e-6
            while time.perf_counter() < t:
                pass
        launch.PDL[0] = pdl
        try:
            return f()
        finally:
            launch.PDL[0] = True
    return g
combos = [(n, pdl, settle, w) for n in ("ours", "cudnn") for pdl in ((True, False) if n == "ours" else (True,))
          for settle in (0, 20) for w in (0, 30)]
fns = {c: wrap(ours if c[0] == "ours" else cudnn, c[1], c[3]) for c in combos}
for f in fns.values():
    f()
res = {c: [] for c in combos}
for r in range(7):
    for c in combos[r * 3 % len(combos):] + combos[:r * 3 % len(combos)]:
        timing.HOLD_SETTLE_NS = c[2] * 1000
        t = timing.benchmark(fns[c], budget_ms=80)
        res[c].append((t.median_ms * 1e3, float(np.mean(np.array(t.times_ms) * 1e3 > 16.9))))
timing.HOLD_SETTLE_NS = 0
print("impl   pdl   settle_us wait_us   median us   frac>16.9   per round")
for c in combos:
    v = np.array(res[c])
    print(f"{c[0]:6s} {str(c[1]):5s} {c[2]:6d} {c[3]:8d}   {np.median(v[:, 0]):8.2f}   {np.median(v[:, 1]):8.2f}   "
          f"{[round(x, 2) for x in v[:, 0]]}", flush=True)
