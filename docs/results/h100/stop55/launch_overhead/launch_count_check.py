"""launch.count_launches against the kernel nodes of a CuPy graph capture of the same call: MoE layers (E64 top-8
2048 / 1408: T 1, 16, 2048), the attention forward and a KV-cache decode call (CuPy arrays)."""
import cupy
import numpy as np

from cukernels import dtypes, launch
from moe import MoELayer, interleave_gate_up
import attention


def graph_kernels(fn):
    fn()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        fn()
        g = s.end_capture()
    dot = g.debug_dot_str()  # kernel nodes are drawn as octagons, memsets as inverted trapezia
    return {"kernels": dot.count('shape="octagon"'), "memsets": dot.count("MEMSET")}


H, I, E, K = 2048, 1408, 64, 8
router = cupy.random.default_rng(1).standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2), dtypes.random((E, I, H), dtypes.BF16, seed=3))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4)
layer = MoELayer(router, w_up, w_down, K)
for T in (1, 16, 2048):
    x = dtypes.random((T, H), dtypes.BF16, seed=T)
    fn = lambda: layer(x)  # noqa: E731
    fn()
    print(f"layer T{T}: count_launches {launch.count_launches(fn)}, graph nodes {graph_kernels(fn)}", flush=True)
q = dtypes.random((2, 512, 8, 128), dtypes.BF16, seed=5)
k = dtypes.random((2, 512, 8, 128), dtypes.BF16, seed=6)
v = dtypes.random((2, 512, 8, 128), dtypes.BF16, seed=7)
fn = lambda: attention.flash_attention(q, k, v, causal=True)  # noqa: E731
fn()
print(f"flash_attention fwd: count_launches {launch.count_launches(fn)}, graph nodes {graph_kernels(fn)}", flush=True)
qd = dtypes.random((8, 1, 32, 128), dtypes.BF16, seed=8)
kc = dtypes.random((8, 4096, 8, 128), dtypes.BF16, seed=9)
vc = dtypes.random((8, 4096, 8, 128), dtypes.BF16, seed=10)
lens = cupy.asarray(np.full(8, 3000), dtype=cupy.int32)
fn = lambda: attention.flash_attention_with_kvcache(qd, kc, vc, cache_seqlens=lens, check_values=False)  # noqa: E731
fn()
print(f"decode: count_launches {launch.count_launches(fn)}, graph nodes {graph_kernels(fn)}", flush=True)
