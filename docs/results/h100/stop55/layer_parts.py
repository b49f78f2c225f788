"""The seed004 MoE layer's stages timed one by one (triton do_bench, L2 flushed) on one fixed workspace, beside the
layer's cached call, at T = 2,048 / 32,768 / 65,536: where the non-GEMM time goes and how far each stage is from its
floor (bytes / the copy bandwidth, or FLOPs at the GEMM rate measured here)."""
import importlib
import os

import cupy
import numpy as np
import triton

from cukernels import dtypes
from moe import MoELayer, interleave_gate_up

L = importlib.import_module("moe.layer")
H, I, E, K = 4096, 11008, 32, 2
router = cupy.random.default_rng(1).standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                          dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
layer = MoELayer(router, w_up, w_down, K)
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
for T in [int(t) for t in os.environ.get("TOKENS", "2048,32768,65536").split(",")]:
    x = dtypes.random((T, H), dtypes.BF16, seed=T)
    layer(x)
    tensors = (x, layer.router_b, layer.w_gate_up, layer.w_down)
    c = L._LAYER.get((*(L._launch.view(t)[0] for t in tensors), K, "swiglu"))
    px, rb, wgu, wd = (L._launch.view(t)[1] for t in tensors)
    ws = cupy.empty(c.nbytes, dtype=cupy.uint8)
    base = ws.data.ptr
    at = {k: base + off for k, off in c.at.items()}
    out = cupy.empty((T, H), dtype=cupy.uint16)
    s = cupy.cuda.get_current_stream().ptr
    sorted_slots, inverse, offsets, _ = (at["dispatch"] + off for off in c.permute.out_offsets)
    counts = at["routing"] + c._counts
    stages = {
        "router GEMM": lambda: c.router.enqueue(s, px, rb, at["logits"], c._one_group_ptr, 0),
        "route (+finish)": lambda: c.route.enqueue(s, at["logits"], at["routing"]),
        "permute": lambda: c.permute.enqueue(s, at["routing"], at["dispatch"], at["row_weight"]),
        "up (gather fused)": lambda: c.up.enqueue(s, px, wgu, at["h"], offsets, 0, sorted_slots, pcounts=counts),
        "down": lambda: c.down.enqueue(s, at["h"], wd, at["y"], offsets, at["row_weight"], pcounts=counts),
        "combine": lambda: c.combine.launch(s, (at["y"], inverse, 0, out.data.ptr)),
    }
    for fn in stages.values():  # in order once: every stage's inputs written
        fn()
    cupy.cuda.Device().synchronize()
    whole = lambda: layer(x)  # noqa: E731
    times = {n: triton.testing.do_bench(fn, warmup=5, rep=max(60, T // 300)) * 1e3 for n, fn in stages.items()}
    total = triton.testing.do_bench(whole, warmup=3, rep=max(60, T // 300)) * 1e3
    print(f"T{T}: layer {total:.1f} us; stages sum {sum(times.values()):.1f} us "
          f"(plans: up {c.up.config}, down {c.down.config}, router {c.router.config})")
    for n, t in times.items():
        print(f"   {n:20s} {t:9.1f} us  {100 * t / total:5.1f} %")
