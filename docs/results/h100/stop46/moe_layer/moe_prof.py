"""Scratch (stop 46): per-kernel device times of the seed004 MoE layer forward at large T (torch.profiler/CUPTI),
and the torch per-expert loop's GEMM time beside it."""
import collections, os, sys
import numpy as np
import cupy, torch
from cukernels import dtypes
from moe.grouped_gemm import interleave_gate_up
from moe.layer import MoELayer

H, I, E, K = 4096, 11008, 32, 2
T = int(os.environ.get("T", "65536"))
x = dtypes.random((T, H), dtypes.BF16, seed=1)
router = cupy.random.default_rng(2).standard_normal((H, E), dtype=cupy.float32)
g = dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H))
u = dtypes.random((E, I, H), dtypes.BF16, seed=4, scale=1 / np.sqrt(H))
w_up = interleave_gate_up(g, u)
del g, u
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=5, scale=1 / np.sqrt(I))
layer = MoELayer(router, w_up, w_down, K)
for _ in range(2):
    layer(x)
cupy.cuda.Device().synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        layer(x)
    cupy.cuda.Device().synchronize()
agg = collections.defaultdict(list)
for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
        agg[ev.name[:110]].append(ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total)
tot = 0
rows = T * K
fl_up = 2 * rows * 2 * I * H
fl_down = 2 * rows * H * I
for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    per = sum(v) / 3
    tot += per
    print(f"{per/1e3:9.3f} ms  x{len(v)//3}  {n}")
print(f"total {tot/1e3:.3f} ms per forward; up GEMM flops {fl_up/1e12:.2f} T, down {fl_down/1e12:.2f} T")
