"""Data-dependent power at the cap: the layer-sized up-projection (65,536 rows in 32 equal groups, K 4096, N 22016,
SwiGLU) with A random, A with the second 64 rows of every 128-row tile zero (what an idle consumer warpgroup
multiplies when the gather zero-fills rows past a group), and A all zero. 3 s back to back each (timing.sustained:
ms, mJ per call, W, SM clock), two passes in opposite orders."""
import json, os, sys
import numpy as np
import cupy
sys.path.insert(0, '.')
from cukernels import dtypes, timing
from moe.grouped_gemm import grouped_gemm

E, ROWS = 32, 65536
bf = dtypes.from_name("bf16")
a = dtypes.random((ROWS, 4096), bf, seed=1)
b = dtypes.random((E, 22016, 4096), bf, seed=2, scale=1 / 64)
half = a.copy().reshape(ROWS // 128, 128, 4096)
half[:, 64:, :] = 0
half = half.reshape(ROWS, 4096)
zero = cupy.zeros_like(a)
offs = cupy.asarray(np.arange(E + 1, dtype=np.int32) * (ROWS // E))
fns = {k: (lambda x=x: grouped_gemm(x, b, offs, epilogue="swiglu")) for k, x in
       (("random", a), ("half_zero_rows", half), ("zero", zero))}
for f in fns.values():
    f()
cupy.cuda.Device().synchronize()
res = {k: [] for k in fns}
for order in (list(fns), list(fns)[::-1]):
    for k in order:
        res[k].append(timing.sustained(fns[k], 3.0))
for k, rs in res.items():
    ms = np.mean([r["ms_per_call"] for r in rs]); mj = np.mean([r["mj_per_call"] for r in rs])
    w = np.mean([r["power_w"] for r in rs]); mhz = np.mean([r["sm_clock_mean_mhz"] for r in rs])
    print(f"{k:16s} {ms:8.3f} ms/call {mj:9.1f} mJ/call {w:6.0f} W {mhz:6.0f} MHz  ({ms / np.mean([r['ms_per_call'] for r in res['random']]):.3f} of random)")
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "zeros.json"), "w"), indent=1, default=str)
