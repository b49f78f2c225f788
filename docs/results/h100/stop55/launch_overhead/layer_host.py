"""Where the MoE layer's host time goes at large T (seed004 config, CuPy inputs): host us per call in bursts of 1 and
of N calls enqueued behind the holding kernel, and a cProfile of held bursts."""
import cProfile
import io
import os
import pstats
import time

import cupy
import numpy as np

from cukernels import dtypes, timing
from moe import MoELayer, interleave_gate_up

H, I, E, K = 4096, 11008, 32, 2
router = cupy.random.default_rng(1).standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                          dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
layer = MoELayer(router, w_up, w_down, K)
dev = cupy.cuda.Device().id


def burst(fn, n):
    release = timing._hold(dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    el = time.perf_counter() - t0
    release()
    cupy.cuda.Device().synchronize()
    return el * 1e6 / n


for T in [int(t) for t in os.environ.get("TOKENS", "1,16,256,2048,32768").split(",")]:
    x = dtypes.random((T, H), dtypes.BF16, seed=T)
    fn = lambda: layer(x)  # noqa: E731
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    n = 8 if T <= 2048 else 1
    ones = [burst(fn, 1) for _ in range(7)]
    many = [burst(fn, n) for _ in range(7)] if n > 1 else []
    held_us = timing.host_us(fn, per_call_ms=1e-3 if T <= 2048 else 30.0)
    print(f"T{T}: 1-call bursts {np.median(ones):.1f} us ({', '.join(f'{v:.0f}' for v in ones)}); "
          f"{n}-call bursts {np.median(many) if many else float('nan'):.1f} us; timing.host_us {held_us}", flush=True)
    pr = cProfile.Profile()
    for _ in range(5):
        release = timing._hold(dev)
        pr.enable()
        fn()
        pr.disable()
        release()
        cupy.cuda.Device().synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    print("\n".join(s.getvalue().splitlines()[:40]), flush=True)
