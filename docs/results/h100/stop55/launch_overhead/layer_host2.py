"""Per-piece host time of the MoE layer's call (seed004 config, CuPy inputs) in held bursts of 8 calls: each
launcher's launch, the tensor-map binds, the workspace and output allocations, the whole call."""
import collections
import os
import time

import cupy
import numpy as np

from cukernels import dtypes, timing, tma
from cukernels import launch as L
from moe import MoELayer, interleave_gate_up

H, I, E, K = 4096, 11008, 32, 2
router = cupy.random.default_rng(1).standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                          dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
layer = MoELayer(router, w_up, w_down, K)
dev = cupy.cuda.Device().id
acc = collections.defaultdict(list)
pc = time.perf_counter_ns


def wrap(owner, attr, key):
    orig = getattr(owner, attr)

    def w(self, *a, **k):
        t = pc()
        r = orig(self, *a, **k)
        acc[key(self)].append(pc() - t)
        return r
    setattr(owner, attr, w)


wrap(L.Launcher, "launch", lambda s: "launch " + s.name.split("<")[0])
wrap(tma.TensorMap, "bind", lambda s: "bind")
wrap(L.CupyFrame, "workspace", lambda s: "workspace")
wrap(L._Frame, "empty", lambda s: "empty")
_raw = L.Launcher.launch
for T in [int(t) for t in os.environ.get("TOKENS", "1,16,2048,32768").split(",")]:
    x = dtypes.random((T, H), dtypes.BF16, seed=T)
    for _ in range(3):
        layer(x)
    cupy.cuda.Device().synchronize()
    acc.clear()
    n = 8 if T <= 2048 else 1
    whole = []
    for b in range(6):
        release = timing._hold(dev)
        for _ in range(n):
            t = pc()
            layer(x)
            whole.append(pc() - t)
        release()
        cupy.cuda.Device().synchronize()
    print(f"T{T}: whole call {np.median(whole) / 1e3:.1f} us (bursts of {n})")
    for k, v in sorted(acc.items()):
        print(f"   {k:40s} x{len(v) / len(whole):.1f} per call, median {np.median(v) / 1e3:6.1f} us, "
              f"max {max(v) / 1e3:6.1f}")
    # raw cuLaunchKernel of an empty kernel, for scale
