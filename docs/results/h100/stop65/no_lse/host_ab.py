"""Host us per call of flash_attention_with_kvcache (B1 L1k 32/8 d128 q1, contiguous and pages of 16), return_lse
False against True, CuPy arrays and torch tensors, 7 interleaved rounds of 3000 calls (no synchronisation inside a
round), medians."""
import json, sys, time
import numpy as np
import cupy
import torch
from attention import flash_attention_with_kvcache
from cukernels import dtypes

N, ROUNDS = 3000, 7
dt = dtypes.from_name("bf16")
q = dtypes.random((1, 1, 32, 128), dt, seed=0)
k = dtypes.random((1, 1024, 8, 128), dt, seed=1)
v = dtypes.random((1, 1024, 8, 128), dt, seed=2)
lens = cupy.full((1,), 1024, dtype=cupy.int32)
table = cupy.asarray(np.random.default_rng(16).permutation(64).reshape(1, 64).astype(np.int32))
kp, vp = k.reshape(64, 16, 8, 128), v.reshape(64, 16, 8, 128)
tt = lambda x, bf=True: torch.as_tensor(x, device="cuda").view(torch.bfloat16) if bf else torch.as_tensor(x, device="cuda")
sets = {"cupy contig": (q, k, v, lens, None), "cupy p16": (q, kp, vp, lens, table),
        "torch contig": (tt(q), tt(k), tt(v), tt(lens, False), None),
        "torch p16": (tt(q), tt(kp), tt(vp), tt(lens, False), tt(table, False))}
fns = {}
for name, (a, b, c, l, t) in sets.items():
    for rl in (False, True):
        fns[f"{name} lse={rl}"] = (lambda a=a, b=b, c=c, l=l, t=t, rl=rl: flash_attention_with_kvcache(
            a, b, c, cache_seqlens=l, block_table=t, check_values=False, return_lse=rl))
for f in fns.values():
    for _ in range(300):
        f()
cupy.cuda.Device().synchronize()
res = {n: [] for n in fns}
for r in range(ROUNDS):
    for n, f in fns.items():
        t0 = time.perf_counter()
        for _ in range(N):
            f()
        res[n].append(1e6 * (time.perf_counter() - t0) / N)
        cupy.cuda.Device().synchronize()
med = {n: float(np.median(x)) for n, x in res.items()}
for n, m in med.items():
    print(f"{n:28s} {m:6.2f} us per call (rounds {', '.join(f'{x:.1f}' for x in res[n])})")
json.dump({"median_us": med, "rounds_us": res}, open(sys.argv[1], "w"), indent=1)
