"""Back-to-back calls of the seed004 b32 x 2048 layer: per-call host enqueue time (does any call block?), events per
call and the gap between them, on CuPy's null stream and on a non-blocking stream; the same with the combine
launch (TMA_SCATTER False)."""
import importlib, time, sys
import numpy as np
import cupy
from moe import bench as mb, suites

gg = importlib.import_module("moe.grouped_gemm")
layer_mod = importlib.import_module("moe.layer")
(case,) = [c for c in mb.cases_for(suites.suite("seed004"), "bf16") if c.name == "seed004_b32x2048 layer"]
inp = mb.make_inputs(case, 0)
layer, x = inp.layer, inp.x
f = lambda: layer(x)


def run(label, n=12):
    f(); cupy.cuda.Device().synchronize()
    ev = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(n)]
    enq = []
    t0 = time.perf_counter()
    for a, b in ev:
        s = time.perf_counter(); a.record(); out = f(); b.record(); enq.append((time.perf_counter() - s) * 1e3)
    cupy.cuda.Device().synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / n
    inside = [cupy.cuda.get_elapsed_time(a, b) for a, b in ev]
    gaps = [cupy.cuda.get_elapsed_time(ev[i][1], ev[i + 1][0]) for i in range(n - 1)]
    print(f"{label}: wall/call {wall:.2f} ms; events/call median {np.median(inside):.2f} (min {min(inside):.2f} max "
          f"{max(inside):.2f}); gaps between calls median {np.median(gaps):.3f} max {max(gaps):.3f} ms; host enqueue "
          f"median {np.median(enq):.3f} max {max(enq):.3f} ms", flush=True)


for scatter in (True, False):
    gg.TMA_SCATTER = scatter
    layer_mod._LAYER.clear()
    run(f"scatter={scatter} null stream")
    with cupy.cuda.Stream(non_blocking=True):
        run(f"scatter={scatter} own stream")
    time.sleep(1)
    run(f"scatter={scatter} null stream after 1 s idle")
print("pool used / total GB", cupy.get_default_memory_pool().used_bytes() / 1e9,
      cupy.get_default_memory_pool().total_bytes() / 1e9)
