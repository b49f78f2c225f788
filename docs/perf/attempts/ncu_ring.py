"""The decode layer (E64 top-8 T1 by default) a few calls, ring on or off (RING env), for ncu. Needs
docs/perf/attempts/decode_ffn_ring.patch applied."""
import os
import cupy
import importlib
gg = importlib.import_module("moe.grouped_gemm")
from moe.layer import MoELayer
gg.RING_STAGES = int(os.environ.get("RING", "3"))
T, E, K, H, I = (int(v) for v in os.environ.get("SHAPE", "1,64,8,2048,1408").split(","))


def bf16(shape, scale, seed):
    g = cupy.random.default_rng(seed)
    a = g.standard_normal(shape, dtype=cupy.float32) * scale
    return (a.view(cupy.uint32) >> 16).astype(cupy.uint16)


wr = cupy.random.default_rng(T).standard_normal((H, E), dtype=cupy.float32) / 16
layer = MoELayer(wr, bf16((E, 2 * I, H), 1 / 32, 1), bf16((E, H, I), 1 / 32, 2), K)
x = bf16((T, H), 1.0, 3)
for _ in range(4):
    layer(x)
cupy.cuda.Device().synchronize()
