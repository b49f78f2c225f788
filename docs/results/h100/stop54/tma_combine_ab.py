"""A/B of the top-2 combine done in the down-projection's epilogue (moe.grouped_gemm.TMA_COMBINE) on the seed004
layer (hidden 4096, intermediate 11008, E32 top-2, bf16) at T = 2048 / 32768 / 65536: the layer with the combine
launch and with the fused combine, built once each, do_bench alternating (1 s idle before each), three rounds;
outputs compared bitwise. Run from the repository root with PYTHONPATH=. on a GPU."""
import importlib
import time

import cupy
import numpy as np
import triton

from cukernels import dtypes
from moe import MoELayer, interleave_gate_up

gg = importlib.import_module("moe.grouped_gemm")
layer_mod = importlib.import_module("moe.layer")
H, I, E, K = 4096, 11008, 32, 2
rng = cupy.random.default_rng(1)
router = rng.standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                          dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
for T in (2048, 32768, 65536):
    x = dtypes.random((T, H), dtypes.BF16, seed=T)
    calls, outs = {}, {}
    for fused in (False, True):
        gg.TMA_COMBINE = fused
        layer_mod._LAYER.clear()
        layer = MoELayer(router, w_up, w_down, K)
        outs[fused] = layer(x)
        key = (*(layer_mod._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)), K,
               "swiglu")
        call = layer_mod._LAYER.get(key)
        layer_mod._LAYER.clear()
        calls[fused] = (lambda c=call, lay=layer: c(*(layer_mod._launch.view(t)[1] for t in
                                                       (x, lay.router_b, lay.w_gate_up, lay.w_down))))
        print(f"T{T} fused={fused}: down {call.down.config} combine in GEMM {call.fused_combine}", flush=True)
    same = bool((outs[False] == outs[True]).all())
    res = {f: [] for f in calls}
    for r in range(3):
        for f in ((False, True) if r % 2 == 0 else (True, False)):
            time.sleep(1.0)
            res[f].append(triton.testing.do_bench(calls[f], warmup=3, rep=max(50, T // 200)))
    m = {f: float(np.median(v)) for f, v in res.items()}
    print(f"T{T}: combine launch {m[False]:.3f} ms, fused {m[True]:.3f} ms, ratio {m[False] / m[True]:.3f}, "
          f"rounds {res}, bitwise equal {same}", flush=True)
gg.TMA_COMBINE = True
