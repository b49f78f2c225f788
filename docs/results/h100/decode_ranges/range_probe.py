"""Probe builds of moe_decode_ranges (RANGE_PROBE / RANGE_U defines on a copy of the source) beside the item-wise
layer: do_bench (L2 flushed) of the layer's cached call, variants alternating per round."""
import json, os, shutil, importlib
from pathlib import Path
import cupy, numpy as np
from triton.testing import do_bench
import moe.layer as L
from moe.layer import MoELayer
gg = importlib.import_module("moe.grouped_gemm")

OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
NEW = gg.SOURCE
VARIANTS = {"items": None, "ranges": {}, "noup": {"RANGE_PROBE": 1}, "nodown": {"RANGE_PROBE": 2},
            "neither": {"RANGE_PROBE": 3}, "u4": {"RANGE_U": 4}, "u12": {"RANGE_U": 12}}
if os.environ.get("VARS"):
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in os.environ["VARS"].split(",")}
src = {}
for name, v in VARIANTS.items():
    if not v:
        src[name] = NEW
        continue
    d = Path("scratch/range_probe") / name
    d.mkdir(parents=True, exist_ok=True)
    for f in NEW.parent.glob("*.cuh"):
        shutil.copy(f, d / f.name)
    (d / "grouped_gemm.cu").write_text("".join(f"#define {k} {x}\n" for k, x in v.items()) + NEW.read_text())
    src[name] = (d / "grouped_gemm.cu").resolve()


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
    fns = {}
    for name, v in VARIANTS.items():
        L.RANGE_UP = v is not None
        gg.SOURCE = src[name]
        L._LAYER.clear()
        layer = MoELayer(wr, wgu, wd, K)
        layer(x)
        views = [L._launch.view(t) for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)]
        call = L._LAYER.get((*(v_[0] for v_ in views), K, "swiglu"))
        ptrs = [v_[1] for v_ in views]
        fns[name] = (lambda call=call, ptrs=ptrs: call(*ptrs))
    gg.SOURCE, L.RANGE_UP = NEW, True
    times = {n: [] for n in fns}
    for rnd in range(ROUNDS):
        for n in (list(fns) if rnd % 2 == 0 else list(fns)[::-1]):
            times[n].append(do_bench(fns[n], warmup=25, rep=120, return_mode="median") * 1e3)
    res = {"case": f"{cname} T{T}", "us": {n: round(float(np.median(t)), 2) for n, t in times.items()}}
    rows.append(res)
    print(res["case"], " ".join(f"{n} {u}" for n, u in res["us"].items()), flush=True)
    del wgu, wd, layer, fns
    L._LAYER.clear()
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(rows, open(f"{OUT}/range_probe.json", "w"), indent=1)
