"""One call of each variant (skip + resync, skip, compute) of the planner's tma GEMM on E32 routed / E64 random (for ncu)."""
import sys, importlib
import numpy as np, torch
from moe import launch as ml
from moe.bench import gemm_offsets
from cukernels import launch as L
gg = importlib.import_module("moe.grouped_gemm")
E = int(sys.argv[1]) if len(sys.argv) > 1 else 32
if E == 32:
    c = np.random.default_rng(1).multinomial(8192, np.full(32, 1 / 32)); off_np = np.concatenate([[0], np.cumsum(c)]).astype(np.int32)
else:
    off_np = gemm_offsets(8192, E, "random")
g = torch.Generator(device="cuda").manual_seed(E)
a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
b = torch.randn(E, 11008, 4096, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
off = torch.from_numpy(off_np).cuda()
def build():
    call = gg._validated(a, b, off, None, None, None, None, None)
    pa, pb, po = L.view(a)[1], L.view(b)[1], L.view(off)[1]
    return lambda: call(pa, pb, po, 0)
fs = [build()]
with ml.kernels_built_with(["-DGEMM_SKIP_RESYNC=0"], "grouped_gemm_tma"):
    fs.append(build())
with ml.kernels_built_with(["-DGEMM_SKIP_IDLE=0"], "grouped_gemm_tma"):
    fs.append(build())
torch.cuda.synchronize()
for f in fs:
    f()
torch.cuda.synchronize()
print("done")
