"""The fused decode layer (moe_decode_skinny, items) with other skinny tiles for its up and down items than the
standalone GEMMs' planner gives: do_bench (L2 flushed) of the layer's cached call, variants alternating per round.
Tiles named (rows per warp, split_k) at block_m 8."""
import json, os, importlib
import cupy, numpy as np
from triton.testing import do_bench
import moe.layer as L
from moe.layer import MoELayer
from moe import gemm_configs as gc
from cukernels import tiling
ml = importlib.import_module("moe.launch")

OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
L.RANGE_UP = False
orig_plan = gc.plan
FORCE = {}


def tile(bm, per_warp, ks):
    return next(c for c in gc.SKINNY if (c.block_m, c.block_n // c.warps_n, c.split_k) == (bm, per_warp, ks))


def plan(problem, spec):
    p = orig_plan(problem, spec)
    if p.config.kind != "skinny" or problem.experts == 1:
        return p
    kind = "up" if problem.epilogue == "swiglu" else "down"
    if kind in FORCE:
        c = tile(p.config.block_m, *FORCE[kind])
        return tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=p.limit, reason="forced")
    return p


gc.plan = plan
VARS = [None, ("up", (32, 4)), ("up", (16, 2)), ("up", (32, 2)), ("up", (16, 8)), ("up", (32, 8)),
        ("down", (32, 8)), ("down", (16, 4)), ("down", (32, 4)), ("down", (16, 2))]


def bf16(shape, scale, seed):
    g = cupy.random.default_rng(seed)
    out = cupy.empty(shape, dtype=cupy.uint16)
    for e in range(shape[0]):
        a = g.standard_normal(shape[1:], dtype=cupy.float32) * scale
        out[e] = (a.view(cupy.uint32) >> 16).astype(cupy.uint16)
    return out


rows = []
cases = [("E64top8", T, 64, 8, 2048, 1408) for T in (1, 4)] + [("seed004", T, 32, 2, 4096, 11008) for T in (1, 4)]
if os.environ.get("ONLY"):
    cases = [c for c in cases if f"{c[0]} T{c[1]}" in os.environ["ONLY"].split(",")]
for cname, T, E, K, H, I in cases:
    wr = cupy.random.default_rng(T).standard_normal((H, E), dtype=cupy.float32) / 16
    wgu = bf16((E, 2 * I, H), 1 / 32, 1)
    wd = bf16((E, H, I), 1 / 32, 2)
    x = bf16((1, T, H), 1.0, 3 + T)[0]
    fns, outs, names = {}, {}, {}
    for v in VARS:
        FORCE.clear()
        if v:
            FORCE[v[0]] = v[1]
        ml._plan.cache_clear()
        L._LAYER.clear()
        layer = MoELayer(wr, wgu, wd, K)
        o = layer(x)
        views = [L._launch.view(t) for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)]
        call = L._LAYER.get((*(v_[0] for v_ in views), K, "swiglu"))
        if call.decode is None:
            print(cname, T, v, "not fused"); continue
        name = "planned" if v is None else f"{v[0]}{v[1]}"
        names[name] = f"up {call.up.config.block_n}/{call.up.config.split_k} down {call.down.config.block_n}/{call.down.config.split_k}"
        ptrs = [v_[1] for v_ in views]
        fns[name] = (lambda call=call, ptrs=ptrs: call(*ptrs))
        outs[name] = o
    FORCE.clear(); ml._plan.cache_clear()
    times = {n: [] for n in fns}
    for rnd in range(ROUNDS):
        for n in (list(fns) if rnd % 2 == 0 else list(fns)[::-1]):
            times[n].append(do_bench(fns[n], warmup=25, rep=120, return_mode="median") * 1e3)
    ref = outs["planned"].view(cupy.uint16).astype(cupy.uint32) << 16
    res = {"case": f"{cname} T{T}", "tiles": names, "us": {n: round(float(np.median(t)), 2) for n, t in times.items()}}
    rows.append(res)
    print(res["case"], " ".join(f"{n}[{names[n]}] {u}" for n, u in res["us"].items()), flush=True)
    del wgu, wd, layer, fns, outs
    L._LAYER.clear()
    cupy.get_default_memory_pool().free_all_blocks()
gc.plan = orig_plan
json.dump(rows, open(f"{OUT}/tile_ab.json", "w"), indent=1)
