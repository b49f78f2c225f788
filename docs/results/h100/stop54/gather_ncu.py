"""ncu probe: the seed004 layer at T2048, gather launch vs fused gather: one layer call each (every kernel)."""
import importlib
import sys
import cupy
import numpy as np
from cukernels import dtypes
from moe import MoELayer, interleave_gate_up
gg = importlib.import_module("moe.grouped_gemm")
layer_mod = importlib.import_module("moe.layer")
H, I, E, K = 4096, 11008, 32, 2
T = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
rng = cupy.random.default_rng(1)
router = rng.standard_normal((H, E), dtype=cupy.float32)
w_up = interleave_gate_up(dtypes.random((E, I, H), dtypes.BF16, seed=2, scale=1 / np.sqrt(H)),
                          dtypes.random((E, I, H), dtypes.BF16, seed=3, scale=1 / np.sqrt(H)))
w_down = dtypes.random((E, H, I), dtypes.BF16, seed=4, scale=1 / np.sqrt(I))
x = dtypes.random((T, H), dtypes.BF16, seed=T)
for fused in (False, True):
    gg.TMA_GATHER = fused
    layer_mod._LAYER.clear()
    layer = MoELayer(router, w_up, w_down, K)
    layer(x)
    cupy.cuda.Device().synchronize()
