"""A/B of the decode layer: moe_decode_splitk (SPLIT_DECODE) against moe_decode_skinny + combine: triton do_bench
(L2 flushed) and the engine's held timer of the layer's cached call, variants alternating per round; outputs
compared; as-called times (200 back-to-back public calls) at the end."""
import json, os, time
import cupy, numpy as np
from triton.testing import do_bench
import moe.layer as L
from moe.layer import MoELayer
from cukernels import timing

OUT = os.environ.get("OUT", "/tmp")
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
    fns, outs, layers, info = {}, {}, {}, {}
    for v in (0, 1):
        L.RANGE_UP = bool(v)
        L._LAYER.clear()
        layer = MoELayer(wr, wgu, wd, K)
        outs[v] = [layer(x) for _ in range(2)]
        call, fns[v] = held(layer, x)
        layers[v] = (layer, call)
        info[v] = dict(ranges=call.decode.ranges, grid=call.decode.launcher.grid if hasattr(call.decode.launcher, "grid") else None)
    res = {"case": f"{name} T{T}", "info": {str(k): v for k, v in info.items()}}
    a0, a1 = f32(outs[0][0]), f32(outs[1][0])
    d = cupy.abs(a1 - a0)
    res["maxdiff"] = float(d.max()); res["rel"] = float(cupy.linalg.norm(d) / cupy.linalg.norm(a0))
    res["det"] = bool((outs[1][0] == outs[1][1]).all())
    for rnd in range(ROUNDS):
        for v in ((0, 1) if rnd % 2 == 0 else (1, 0)):
            res.setdefault(f"db{v}", []).append(round(do_bench(fns[v], warmup=25, rep=150, return_mode="median") * 1e3, 2))
            res.setdefault(f"held{v}", []).append(round(timing.benchmark(fns[v], budget_ms=60).median_ms * 1e3, 2))
    for v in (0, 1):
        res[f"db{v}_med"] = round(float(np.median(res[f"db{v}"])), 2)
        res[f"held{v}_med"] = round(float(np.median(res[f"held{v}"])), 2)
        layer, call = layers[v]
        L.RANGE_UP = bool(v)
        L._LAYER.clear()
        L._LAYER.put(next(iter([k for k in [(*(L._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)), K, "swiglu")]])), call)
        for _ in range(20):
            layer(x)
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            layer(x)
        cupy.cuda.Device().synchronize()
        res[f"called{v}"] = round((time.perf_counter() - t0) / 200 * 1e6, 2)
        after = fns[v]()
        res[f"after_equal_{v}"] = bool((after == outs[v][0]).all())
    L.RANGE_UP = True
    rows.append(res); print(json.dumps(res), flush=True)
    del wgu, wd, layer, layers, fns, outs
    L._LAYER.clear()
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(rows, open(f"{OUT}/range_ab.json", "w"), indent=1)
