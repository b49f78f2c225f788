"""A/B of the decode layer's FFN through the shared-memory ring (RING_STAGES 3) against the register path (0):
do_bench (L2 flushed) of the layer's cached call, variants alternating per round; outputs compared.

Needs docs/perf/attempts/decode_ffn_ring.patch applied (RING_STAGES, RING_MIN_ITEM_BYTES). RINGS=0,3,13: variant 10 + n
runs scratch/gg_probe/grouped_gemm.cu with ring n, the patched kernel whose consumers only wait for each stage and
release it (the probe of docs/perf/grouped_gemm.md "Tried ... stop 42"; copy moe/kernels/*.cuh beside it)."""
import json, os
import cupy, numpy as np
from triton.testing import do_bench
import importlib
import moe.layer as L
gg = importlib.import_module("moe.grouped_gemm")
from moe.layer import MoELayer

OUT = os.environ.get("OUT", "/tmp")
VARIANTS = [int(v) for v in os.environ.get("RINGS", "0,3").split(",")]  # 10 + n: the probe source, ring n
from pathlib import Path
NEW = gg.SOURCE
PROBE = Path("scratch/gg_probe/grouped_gemm.cu").resolve()
ROUNDS = int(os.environ.get("ROUNDS", "4"))


def held(layer, x):
    views = [L._launch.view(t) for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)]
    call = L._LAYER.get((*(v[0] for v in views), layer.top_k, "swiglu"))
    ptrs = [v[1] for v in views]
    return call, (lambda: call(*ptrs))


def bf16(shape, scale, seed):
    g = cupy.random.default_rng(seed)
    out = cupy.empty(shape, dtype=cupy.uint16)
    for e in range(shape[0]):
        a = g.standard_normal(shape[1:], dtype=cupy.float32) * scale
        out[e] = (a.view(cupy.uint32) >> 16).astype(cupy.uint16)
    return out


def f32(a):
    return (a.astype(cupy.uint32) << 16).view(cupy.float32)


rows = []
cases = [("E64top8", T, 64, 8, 2048, 1408) for T in (1, 4)] + [("seed004", T, 32, 2, 4096, 11008) for T in (1, 4)]
if os.environ.get("ONLY"):
    cases = [c for c in cases if f"{c[0]} T{c[1]}" in os.environ["ONLY"].split(",")]
for name, T, E, K, H, I in cases:
    wr = cupy.random.default_rng(T).standard_normal((H, E), dtype=cupy.float32) / 16
    wgu = bf16((E, 2 * I, H), 1 / 32, 1)
    wd = bf16((E, H, I), 1 / 32, 2)
    x = bf16((1, T, H), 1.0, 3 + T)[0]
    fns, outs, info = {}, {}, {}
    for v in VARIANTS:
        gg.RING_STAGES = v % 10
        gg.RING_MIN_ITEM_BYTES = 0
        gg.SOURCE = PROBE if v >= 10 else NEW
        L._LAYER.clear()
        layer = MoELayer(wr, wgu, wd, K)
        outs[v] = [layer(x) for _ in range(2)]
        call, fns[v] = held(layer, x)
        info[v] = dict(ring=call.decode.ring if call.decode else None, grid=getattr(call.decode.launcher, "grid", None) if call.decode else None)
    res = {"case": f"{name} T{T}", "info": {str(k): str(v) for k, v in info.items()}}
    a0 = f32(outs[VARIANTS[0]][0])
    for v in VARIANTS[1:]:
        d = cupy.abs(f32(outs[v][0]) - a0)
        res[f"maxdiff_{v}"] = float(d.max()); res[f"rel_{v}"] = float(cupy.linalg.norm(d) / cupy.linalg.norm(a0))
        res[f"det_{v}"] = bool((outs[v][0] == outs[v][1]).all())
    for rnd in range(ROUNDS):
        for v in (VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]):
            res.setdefault(str(v), []).append(round(do_bench(fns[v], warmup=25, rep=150, return_mode="median") * 1e3, 2))
    for v in VARIANTS:
        res[f"{v}_med"] = round(float(np.median(res[str(v)])), 2)
        after = fns[v]()
        res[f"after_equal_{v}"] = bool((after == outs[v][0]).all())
    gg.SOURCE = NEW
    rows.append(res); print(json.dumps(res), flush=True)
    del wgu, wd, layer, fns, outs
    L._LAYER.clear()
    cupy.get_default_memory_pool().free_all_blocks()
gg.RING_STAGES = 3
json.dump(rows, open(f"{OUT}/ring_ab.json", "w"), indent=1)
print(f"{'case':12s} " + " ".join(f"{'ring' + str(v):>9s}" for v in VARIANTS))
for r in rows:
    print(f"{r['case']:12s} " + " ".join(f"{r[f'{v}_med']:9.2f}" for v in VARIANTS) +
          "  " + " ".join(f"x{r[f'{v}_med'] / r[f'{VARIANTS[0]}_med']:.3f}" for v in VARIANTS[1:]))
