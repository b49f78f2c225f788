"""Stop 55: the skinny tiles' item size bound (moe.gemm_configs.SKINNY_MAX_ITEM_BYTES: none, 1 MiB, 1.5 MiB) on
the decode layers (seed 004 E32 top-2 4096 / 11008 at T 1 / 4 / 16 / 64, E64 top-8 2048 / 1408 at T 16; bf16): every
variant's layer built once, triton do_bench (L2 flushed) and the engine's held timer in rotated order per round;
outputs against the uncapped plan's (rel L2) and over two calls (bitwise); as-called (200 back-to-back calls) after.
From the repository root with PYTHONPATH=. on a GPU; CASES=name:T,... picks cases."""
import importlib
import json
import os
import time

import cupy
import numpy as np
import triton

from cukernels import dtypes, timing
from moe import MoELayer, interleave_gate_up

gg = importlib.import_module("moe.grouped_gemm")
L = importlib.import_module("moe.layer")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OUT = os.environ.get("OUT", "/tmp")


def f32(a):
    return (a.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)


gc = importlib.import_module("moe.gemm_configs")
ml = importlib.import_module("moe.launch")
VARIANTS = {"nocap": 0, "cap1m": 1 << 20, "cap1.5m": 3 << 19}
CASES = [c.split(":") for c in os.environ.get("CASES", "seed004:1,seed004:4,seed004:16,seed004:64,E64top8:16").split(",")]


def configure(v):
    gc.SKINNY_MAX_ITEM_BYTES = VARIANTS[v]
    ml._plan.cache_clear()
    L._LAYER.clear()


print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
rows = []
SHAPES = {"E64top8": (64, 8, 2048, 1408), "seed004": (32, 2, 4096, 11008)}
for name in dict.fromkeys(c[0] for c in CASES):
    E, K, H, I = SHAPES[name]
    router = cupy.random.default_rng(E).standard_normal((H, E), dtype=cupy.float32)
    w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                              dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
    w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
    for T in [int(c[1]) for c in CASES if c[0] == name]:
        x = dtypes.random((T, H), dtypes.BF16, seed=10 + T)
        calls, outs, info = {}, {}, {}
        for v in VARIANTS:
            configure(v)
            layer = MoELayer(router, w_up, w_down, K)
            outs[v] = [layer(x) for _ in range(2)]
            key = (*(L._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)), K, "swiglu")
            call = L._LAYER.get(key)
            info[v] = dict(up=str(call.up.config), down=str(call.down.config), fused=call.decode is not None)
            ptrs = [L._launch.view(t)[1] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)]
            calls[v] = (lambda c=call, p=ptrs: c(*p), layer)
        ref = next(iter(VARIANTS))
        res = {"case": f"{name} T{T}", "info": info,
               "rel_l2_vs_" + ref: {v: float(cupy.linalg.norm(f32(outs[v][0]) - f32(outs[ref][0])) / cupy.linalg.norm(f32(outs[ref][0])))
                                   for v in VARIANTS}, "same_over_calls": {v: bool((outs[v][0] == outs[v][1]).all()) for v in VARIANTS}}
        names = list(VARIANTS)
        for r in range(ROUNDS):
            order = names[r % len(names):] + names[:r % len(names)]
            for v in order:
                time.sleep(0.3)
                res.setdefault(f"db_{v}", []).append(round(triton.testing.do_bench(calls[v][0], warmup=25, rep=150) * 1e3, 2))
                res.setdefault(f"held_{v}", []).append(round(timing.benchmark(calls[v][0], budget_ms=60).median_ms * 1e3, 2))
        for v in names:
            res[f"db_{v}_med"] = round(float(np.median(res[f"db_{v}"])), 2)
            res[f"held_{v}_med"] = round(float(np.median(res[f"held_{v}"])), 2)
        for v in names:  # as called: the public call, the variant's plan in the cache
            configure(v)
            layer = calls[v][1]
            for _ in range(20):
                layer(x)
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                layer(x)
            cupy.cuda.Device().synchronize()
            res[f"called_{v}"] = round((time.perf_counter() - t0) / 200 * 1e6, 2)
        rows.append(res)
        print(json.dumps(res), flush=True)
    del w_up, w_down
    cupy.get_default_memory_pool().free_all_blocks()
with open(os.path.join(OUT, "cap_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)
print("\n| case | " + " | ".join(f"{v} db / held / called us" for v in names) + " |")
for res in rows:
    print(f"| {res['case']} | " + " | ".join(f"{res[f'db_{v}_med']} / {res[f'held_{v}_med']} / {res[f'called_{v}']}"
                                         for v in names) + " |")
