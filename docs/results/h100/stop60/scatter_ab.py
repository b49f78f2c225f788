"""A/B of the combine fused into the down-projection (moe.grouped_gemm.TMA_SCATTER) on the seed004 layer (hidden
4096, intermediate 11008, E32 top-2, bf16) at T = 2048 / 32768 / 65536: the layer with the combine launch and with
the fused combine, built once each; per round (order alternating, 1 s idle before each) triton do_bench and the
engine's held timer (L2 flushed by a read); as called after the rounds; outputs compared bitwise.
Run from the repository root with PYTHONPATH=. on a GPU."""
import importlib
import json
import os
import sys
import time

import cupy
import numpy as np
import triton

from cukernels import dtypes, timing
from moe import MoELayer, interleave_gate_up

gg = importlib.import_module("moe.grouped_gemm")
layer_mod = importlib.import_module("moe.layer")
H, I, E, K = 4096, 11008, 32, 2
ROUNDS = int(os.environ.get("ROUNDS", "3"))
TS = [int(t) for t in os.environ.get("TS", "2048,32768,65536").split(",")]
rng = cupy.random.default_rng(1)
router = rng.standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                          dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
report = []
for T in TS:
    x = dtypes.random((T, H), dtypes.BF16, seed=T)
    calls, outs = {}, {}
    for fused in (False, True):
        gg.TMA_SCATTER = fused
        layer_mod._LAYER.clear()
        layer = MoELayer(router, w_up, w_down, K)
        outs[fused] = layer(x)
        again = layer(x)
        key = (*(layer_mod._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)), K,
               "swiglu")
        call = layer_mod._LAYER.get(key)
        layer_mod._LAYER.clear()
        ptrs = tuple(layer_mod._launch.view(t)[1] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down))
        calls[fused] = (lambda c=call, p=ptrs: c(*p))
        print(f"T{T} fused={fused}: down {call.down.config} scatter {call.fused_scatter}, workspace "
              f"{call.nbytes / 2**20:.0f} MiB, repeat bitwise {bool((again == outs[fused]).all())}", flush=True)
    same = bool((outs[False] == outs[True]).all())
    res = {f: {"do_bench": [], "held": []} for f in calls}
    for r in range(ROUNDS):
        for f in ((False, True) if r % 2 == 0 else (True, False)):
            time.sleep(1.0)
            res[f]["do_bench"].append(triton.testing.do_bench(calls[f], warmup=3, rep=max(50, T // 200)))
            time.sleep(0.5)
            res[f]["held"].append(timing.benchmark(calls[f], budget_ms=max(100, T // 100)).median_ms)
    called = {f: timing.as_called(calls[f]) for f in calls}
    m = {f: {k: float(np.median(v)) for k, v in res[f].items()} for f in res}
    print(f"T{T}: combine launch do_bench {m[False]['do_bench']:.3f} held {m[False]['held']:.3f} called "
          f"{called[False]:.3f} ms | fused {m[True]['do_bench']:.3f} / {m[True]['held']:.3f} / {called[True]:.3f} | "
          f"ratio (launch / fused) {m[False]['do_bench'] / m[True]['do_bench']:.4f} / "
          f"{m[False]['held'] / m[True]['held']:.4f} / {called[False] / called[True]:.4f}; bitwise equal {same}",
          flush=True)
    report.append({"T": T, "rounds": {str(f): res[f] for f in res}, "median": {str(f): m[f] for f in m},
                   "as_called_ms": {str(f): called[f] for f in called}, "bitwise_equal": same})
gg.TMA_SCATTER = True
if len(sys.argv) > 1:
    json.dump(report, open(sys.argv[1], "w"), indent=1)
