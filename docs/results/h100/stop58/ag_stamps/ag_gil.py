"""Does our launch's GIL release cost the forward that follows a backward? The composite fwd+bwd with the
programmatic launches through ctypes.CDLL (the GIL released around cuLaunchKernelEx, as the engine does) against
ctypes.PyDLL (the GIL kept), toggled per burst in one process; stamps as ag_stamps.py, plus SDPA's composite."""
import sys, json, time, gc, ctypes
sys.path.insert(0, ".")
import numpy as np
import cupy
import torch
import torch.nn.functional as F
import attention.torch as at
from attention.torch import _FlashAttention
from cukernels import timing, launch as L

tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
hq, hk, hv = (t.transpose(1, 2).contiguous().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2).contiguous()
pc = time.perf_counter_ns
stamp = {}
real_bwd = _FlashAttention.backward

def traced(ctx, g):
    stamp["in"] = pc()
    out = real_bwd(ctx, g)
    stamp["out"] = pc()
    return out
_FlashAttention.backward = staticmethod(traced)

def ours():
    t0 = pc(); o = at.flash_attention(gq, gk, gv, causal=True); t1 = pc()
    torch.autograd.grad(o, (gq, gk, gv), do)
    t4 = pc()
    return (t1 - t0, stamp["in"] - t1, stamp["out"] - stamp["in"], t4 - stamp["out"], t4 - t0)

def sdpa():
    t0 = pc()
    torch.autograd.grad(F.scaled_dot_product_attention(hq, hk, hv, is_causal=True), (hq, hk, hv), hdo)
    t4 = pc()
    return (0, 0, 0, 0, t4 - t0)

for _ in range(5):
    ours(); sdpa()
cupy.cuda.Device().synchronize()
pdls = [o._launch_pdl for o in gc.get_objects() if isinstance(o, L.Launcher) and o._launch_pdl is not None]
print("programmatic launchers:", len(pdls), "PDL", L.PDL[0])
cdll = L._launch_kernel_ex()
pydll = ctypes.PyDLL("libcuda.so.1").cuLaunchKernelEx
pydll.argtypes, pydll.restype = cdll.argtypes, cdll.restype
modes = {"CDLL (GIL released)": cdll, "PyDLL (GIL kept)": pydll}
res = {m: [] for m in modes}
res["SDPA own"] = []
dev = cupy.cuda.Device().id
for burst in range(int(sys.argv[2]) if len(sys.argv) > 2 else 40):
    for m, fn in modes.items():
        for p in pdls:
            p._fn = fn
        release = timing._hold(dev)
        for _ in range(10):
            res[m].append(ours())
        release()
        cupy.cuda.Device().synchronize()
    for p in pdls:
        p._fn = cdll
    release = timing._hold(dev)
    for _ in range(10):
        res["SDPA own"].append(sdpa())
    release()
    cupy.cuda.Device().synchronize()
out = {}
for name, rows in res.items():
    a = np.asarray(rows, dtype=np.float64) / 1e3
    med = np.median(a, axis=0)
    out[name] = med.tolist()
    print(f"{name:22s} fwd {med[0]:6.1f}  to backward {med[1]:6.1f}  backward {med[2]:6.1f}  after {med[3]:6.1f}  "
          f"total {med[4]:6.1f} us (p20-p80 {np.percentile(a[:, 4], 20):.1f}-{np.percentile(a[:, 4], 80):.1f})")
json.dump(out, open(sys.argv[1], "w"), indent=1)
