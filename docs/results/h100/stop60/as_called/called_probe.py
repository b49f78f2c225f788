"""Why the seed004 b32 x 2048 layer's as-called time (single calls, a device sync after each) reads ~10 % over its
event-timed median: per call, the host's enqueue time and the wall time, with and without the torch baselines'
memory held; the CuPy pool's state."""
import time, sys
import numpy as np
import cupy
from cukernels import timing
from moe import bench as mb, suites

name = sys.argv[1] if len(sys.argv) > 1 else "seed004_b32x2048"
(case,) = [c for c in mb.cases_for(suites.suite("seed004"), "bf16") if c.name == f"{name} layer"]
inp = mb.make_inputs(case, 0)

layer, x = inp.layer, inp.x
f = lambda: layer(x)
f(); cupy.cuda.Device().synchronize()
pool = cupy.get_default_memory_pool()
print(type(x), "pool used / total GB", pool.used_bytes() / 1e9, pool.total_bytes() / 1e9, flush=True)

def one():
    t0 = time.perf_counter(); out = f(); t1 = time.perf_counter(); cupy.cuda.Device().synchronize(); t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3

for label in ("single calls", "again"):
    rows = [one() for _ in range(6)]
    print(label, "enqueue ms", [round(a, 3) for a, _ in rows], "wall ms", [round(b, 3) for _, b in rows], flush=True)
print("as_called", timing.as_called(f), flush=True)
print("benchmark (events)", timing.benchmark(f, budget_ms=500), flush=True)
t0 = time.perf_counter()
for _ in range(10): f()
cupy.cuda.Device().synchronize(); print("10 back to back, ms per call", (time.perf_counter() - t0) * 100, flush=True)
ev = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(5)]
for a, b in ev:
    a.record(); f(); b.record()
cupy.cuda.Device().synchronize()
print("events per call", [round(cupy.cuda.get_elapsed_time(a, b), 3) for a, b in ev], flush=True)
print("pool used / total GB", pool.used_bytes() / 1e9, pool.total_bytes() / 1e9, flush=True)
