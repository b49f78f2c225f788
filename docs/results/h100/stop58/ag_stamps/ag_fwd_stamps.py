"""Why is the forward slower right after a backward? Stamps through our forward (the Function's forward entry,
ForwardCall's call and its allocations / launch, the forward's exit) in the composite fwd+bwd and in forward-only
loops, bursts interleaved, the stream held."""
import sys, json, time
sys.path.insert(0, ".")
import numpy as np
import cupy
import torch
import attention.torch as at
from attention import api
from attention.torch import _FlashAttention
from cukernels import timing

tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
pc = time.perf_counter_ns
S = {}
real_fwd, real_call = _FlashAttention.forward, api.ForwardCall.__call__

def fwd(ctx, q, k, v, options):
    S["f_in"] = pc()
    o = real_fwd(ctx, q, k, v, options)
    S["f_out"] = pc()
    return o

def call(self, *a):
    S["c_in"] = pc()
    r = real_call(self, *a)
    S["c_out"] = pc()
    return r
_FlashAttention.forward = staticmethod(fwd)
api.ForwardCall.__call__ = call

def one(with_bwd):
    def run():
        t0 = pc(); o = at.flash_attention(gq, gk, gv, causal=True); t1 = pc()
        if with_bwd:
            torch.autograd.grad(o, (gq, gk, gv), do)
        return (S["f_in"] - t0, S["c_in"] - S["f_in"], S["c_out"] - S["c_in"], S["f_out"] - S["c_out"],
                t1 - S["f_out"], t1 - t0)
    return run

cases = {"forward after a backward": one(True), "forward after a forward": one(False)}
for f in cases.values():
    for _ in range(5):
        f()
cupy.cuda.Device().synchronize()
res = {k: [] for k in cases}
dev = cupy.cuda.Device().id
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 60):
    for name, f in cases.items():
        release = timing._hold(dev)
        for _ in range(10):
            res[name].append(f())
        release()
        cupy.cuda.Device().synchronize()
out = {}
for name, rows in res.items():
    med = np.median(np.asarray(rows, dtype=np.float64) / 1e3, axis=0)
    out[name] = med.tolist()
    print(f"{name:26s} to Function.forward {med[0]:5.1f}  to ForwardCall {med[1]:5.1f}  ForwardCall {med[2]:5.1f}  "
          f"rest of forward {med[3]:5.1f}  back to caller {med[4]:5.1f}  total {med[5]:5.1f} us")
json.dump(out, open(sys.argv[1], "w"), indent=1)
