"""A/B of moe_decode_skinny's register bound and router loads (moe.grouped_gemm.DECODE_CTAS_PER_SM,
DECODE_ROUTER_CHUNKS) on the one-launch decode layers (E64 top-8 hidden 2048 / inter 1408, seed 004 E32 top-2
4096 / 11008; T 1 and 4; bf16), beside the tree before this change (OLD_SRC, its 14-argument instance): every
variant's layer built once, triton do_bench (L2 flushed) and the engine's held timer alternating in rotated order
per round; outputs compared bitwise with the old kernel's; as-called (200 back-to-back layer calls) after.
Needs docs/perf/attempts/decode_router_chunks_and_grid.patch applied (the flags). Run 1 had VARIANTS r4_c0 (4, 0),
r8_c0 (8, 0), r4_c3 (4, 3) and TOKENS 1,4 (two flags then); run 2 is this file. From the repository root with
PYTHONPATH=. on a GPU: python docs/results/h100/stop55/decode_ab/decode_ab.py [OLD_SRC]"""
import importlib
import json
import os
import sys
import time
from pathlib import Path

import cupy
import numpy as np
import triton

from cukernels import dtypes, timing
from moe import MoELayer, interleave_gate_up

gg = importlib.import_module("moe.grouped_gemm")
L = importlib.import_module("moe.layer")
NEW_SRC, NEW_NAME = gg.SOURCE, gg.decode_name_expression
OLD_SRC = Path(sys.argv[1]) if len(sys.argv) > 1 else None
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OUT = os.environ.get("OUT", "/tmp")


def old_name(router, up, down, dtype, experts):
    return NEW_NAME(router, up, down, dtype, experts).rsplit(",", 2)[0] + ">"


# (router chunks, min CTAs per SM in __launch_bounds__, decode grid CTAs per SM, skinny GEMM grid CTAs per SM)
VARIANTS = {"base": (4, 0, 0, 0), "r8_c2": (8, 2, 0, 0), "grid1": (4, 0, 1, 1)}
TOKENS = [int(t) for t in os.environ.get("TOKENS", "1,4,16,64").split(",")]
if OLD_SRC is not None:
    VARIANTS = {"old": None, **VARIANTS}


def configure(v):
    if VARIANTS[v] is None:
        gg.SOURCE, gg.decode_name_expression = OLD_SRC, old_name
    else:
        gg.SOURCE, gg.decode_name_expression = NEW_SRC, NEW_NAME
        (gg.DECODE_ROUTER_CHUNKS, gg.DECODE_CTAS_PER_SM, gg.DECODE_GRID_PER_SM,
         gg.SKINNY_GRID_PER_SM) = VARIANTS[v]
    L._LAYER.clear()


print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
rows = []
for name, E, K, H, I in (("E64top8", 64, 8, 2048, 1408), ("seed004", 32, 2, 4096, 11008)):
    router = cupy.random.default_rng(E).standard_normal((H, E), dtype=cupy.float32)
    w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                              dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
    w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
    for T in TOKENS:
        x = dtypes.random((T, H), dtypes.BF16, seed=10 + T)
        calls, outs, info = {}, {}, {}
        for v in VARIANTS:
            configure(v)
            layer = MoELayer(router, w_up, w_down, K)
            outs[v] = [layer(x) for _ in range(2)]
            key = (*(L._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)), K, "swiglu")
            call = L._LAYER.get(key)
            dec = getattr(call, "decode", None)
            info[v] = {}
            if dec is not None:
                kern = gg.launch.kernel(gg.SOURCE, dec.launcher.name)
                info[v] = dict(grid=gg.DECODE_GRID_PER_SM, instance=dec.launcher.name, registers=kern.registers,
                               ctas_per_sm=kern.blocks_per_sm(256, gg.SkinnyDecode.smem_bytes(
                                   call.router.config, call.up.config, call.down.config)))
            ptrs = [L._launch.view(t)[1] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)]
            calls[v] = (lambda c=call, p=ptrs: c(*p), layer)
        ref = next(iter(VARIANTS))
        res = {"case": f"{name} T{T}", "info": info,
               "bitwise_vs_" + ref: {v: bool((outs[v][0] == outs[ref][0]).all() and (outs[v][1] == outs[ref][0]).all())
                                     for v in VARIANTS}}
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
with open(os.path.join(OUT, "decode_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)
print("\n| case | " + " | ".join(f"{v} db / held / called us" for v in names) + " |")
for res in rows:
    print(f"| {res['case']} | " + " | ".join(f"{res[f'db_{v}_med']} / {res[f'held_{v}_med']} / {res[f'called_{v}']}"
                                         for v in names) + " |")
