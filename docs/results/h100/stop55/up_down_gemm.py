"""Why the seed004 layer's up-projection runs at fewer TFLOP/s than its down-projection (T 32,768, top-2, E32 equal
-ish routing): the grouped GEMMs alone through the public API on pre-gathered rows, do_bench (L2 flushed), variants
alternating over 3 rounds: up SwiGLU (K 4,096, N 22,016), up plain (same, no epilogue), down with row scale
(K 11,008, N 4,096), down plain, and a plain K 4,096 GEMM of the down's output width."""
import cupy
import numpy as np
import triton

from cukernels import dtypes
from moe import grouped_gemm as gg_fn
import importlib

gc = importlib.import_module("moe.gemm_configs")
launch = importlib.import_module("moe.launch")
H, I, E, T, K = 4096, 11008, 32, 32768, 2
rows = T * K
rng = np.random.default_rng(0)
counts = rng.multinomial(rows, np.ones(E) / E)
off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
xs = dtypes.random((rows, H), dtypes.BF16, seed=1)
w_up = dtypes.random((E, 2 * I, H), dtypes.BF16, seed=2, scale=1 / 64)
w_dn = dtypes.random((E, H, I), dtypes.BF16, seed=3, scale=1 / 100)
h = dtypes.random((rows, I), dtypes.BF16, seed=4)
w_k4 = dtypes.random((E, H, H), dtypes.BF16, seed=5, scale=1 / 64)
scale = cupy.asarray(rng.random(rows, dtype=np.float32))
cases = {
    "up swiglu K4096 N22016": (lambda: gg_fn(xs, w_up, off, epilogue="swiglu"), rows * 2 * I * H * 2),
    "up plain K4096 N22016": (lambda: gg_fn(xs, w_up, off), rows * 2 * I * H * 2),
    "down scale K11008 N4096": (lambda: gg_fn(h, w_dn, off, row_scale=scale), rows * H * I * 2),
    "down plain K11008 N4096": (lambda: gg_fn(h, w_dn, off), rows * H * I * 2),
    "plain K4096 N4096": (lambda: gg_fn(xs, w_k4, off), rows * H * H * 2),
}
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
spec = launch.spec()
problems = {"up swiglu K4096 N22016": (2 * I, H, "swiglu"), "up plain K4096 N22016": (2 * I, H, None),
            "down scale K11008 N4096": (H, I, None), "down plain K11008 N4096": (H, I, None),
            "plain K4096 N4096": (H, H, None)}
for name, (fn, _) in cases.items():
    fn()
    n, k, epi = problems[name]
    cfg = gc.plan(gc.GemmProblem(rows=rows, n=n, k=k, experts=E, dtype="bf16", epilogue=epi), spec).config
    print(f"{name}: {cfg}", flush=True)
res = {n: [] for n in cases}
names = list(cases)
for r in range(3):
    for n in names[r % len(names):] + names[:r % len(names)]:
        res[n].append(triton.testing.do_bench(cases[n][0], warmup=3, rep=300))
for n in names:
    ms = float(np.median(res[n]))
    print(f"{n:26s} {ms:8.3f} ms  {cases[n][1] / ms / 1e9:6.1f} TFLOP/s  rounds {[round(v, 3) for v in res[n]]}")
