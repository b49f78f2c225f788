"""Device time of the backward (CuPy arrays, held timer, L2 flushed) in one, two and three launches, and as
called (back to back), on small problems; also under a CuPy graph replay (device-bound)."""
import json, os, sys

import cupy
sys.path.insert(0, ".")
from attention import backward as bw, flash_attention, flash_attention_backward
from cukernels import dtypes, timing

SHAPES = [(1, 128, 8, 8, 64, True), (2, 60, 8, 2, 64, True), (4, 64, 16, 16, 128, True), (2, 128, 16, 16, 64, True)]
MODES = {1: (bw.DQ_CONVERT_IN_GRID_BYTES, True), 2: (bw.DQ_CONVERT_IN_GRID_BYTES, False), 3: (0, False)}
rows = []
for B, S, H, KVH, D, causal in SHAPES:
    q = dtypes.random((B, S, H, D), dtypes.BF16, seed=1)
    k = dtypes.random((B, S, KVH, D), dtypes.BF16, seed=2)
    v = dtypes.random((B, S, KVH, D), dtypes.BF16, seed=3)
    do = dtypes.random((B, S, H, D), dtypes.BF16, seed=4)
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    res = {}
    for n, (thr, one) in MODES.items():
        bw.DQ_CONVERT_IN_GRID_BYTES, bw.ONE_LAUNCH = thr, one
        bw._BACKWARD.clear()
        fn = lambda: flash_attention_backward(do, q, k, v, o, lse, causal=causal)
        g = fn()
        steps = len(bw._BACKWARD._entries[next(iter(bw._BACKWARD._entries))].steps)
        held = timing.benchmark(fn, budget_ms=200).median_ms * 1e3
        called = timing.as_called(fn) * 1e3
        # a CuPy graph of the call, replayed back to back (no host cost): device-bound
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            fn(); s.synchronize()
            s.begin_capture(); fn(); gr = s.end_capture()
            gr.launch(); s.synchronize()
            ev0, ev1 = cupy.cuda.Event(), cupy.cuda.Event()
            ev0.record(s)
            for _ in range(200):
                gr.launch(s)
            ev1.record(s); ev1.synchronize()
            graph_us = cupy.cuda.get_elapsed_time(ev0, ev1) * 1e3 / 200
        res[n] = {"launches": steps, "held_us": round(held, 2), "as_called_us": round(called, 2),
                  "graph_replay_us": round(graph_us, 2)}
    bw.DQ_CONVERT_IN_GRID_BYTES, bw.ONE_LAUNCH = MODES[1]
    rows.append({"shape": f"B{B} S{S} H{H}/{KVH} d{D} causal", **{f"{n} launch": r for n, r in res.items()}})
    print(rows[-1], flush=True)
if os.environ.get("OUT"):
    json.dump(rows, open(os.environ["OUT"] + "/bwd_device.json", "w"), indent=1)
