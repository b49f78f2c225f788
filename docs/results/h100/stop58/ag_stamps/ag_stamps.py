"""Where a forward + backward through autograd spends its host time: perf_counter stamps before the forward, after
it, at our backward's entry and exit (the Function's backward wrapped), and after autograd.grad returns; calls
in held bursts (timing._hold keeps the GPU from stalling the host). Ours composite, ours with a kept graph, and the
no-op Function, interleaved per burst."""
import sys, json, time
sys.path.insert(0, ".")
import numpy as np
import cupy
import torch
import attention.torch as at
from attention.torch import _FlashAttention
from cukernels import timing

tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
pc = time.perf_counter_ns
stamp = {}
real_bwd = _FlashAttention.backward

def traced(ctx, g):
    stamp["in"] = pc()
    out = real_bwd(ctx, g)
    stamp["out"] = pc()
    return out
_FlashAttention.backward = staticmethod(traced)

class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)
    @staticmethod
    def backward(ctx, g):
        stamp["in"] = pc()
        q, k, v = ctx.saved_tensors
        r = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        stamp["out"] = pc()
        return r

def composite(fwd):
    def run():
        t0 = pc(); o = fwd(); t1 = pc()
        torch.autograd.grad(o, (gq, gk, gv), do)
        t4 = pc()
        return (t1 - t0, stamp["in"] - t1, stamp["out"] - stamp["in"], t4 - stamp["out"])
    return run

o_kept = at.flash_attention(gq, gk, gv, causal=True)
def kept():
    t1 = pc()
    torch.autograd.grad(o_kept, (gq, gk, gv), do, retain_graph=True)
    t4 = pc()
    return (0, stamp["in"] - t1, stamp["out"] - stamp["in"], t4 - stamp["out"])

cases = {"ours composite": composite(lambda: at.flash_attention(gq, gk, gv, causal=True)),
         "ours kept graph": kept, "no-op Function composite": composite(lambda: Floor.apply(gq, gk, gv))}
res = {k: [] for k in cases}
dev = cupy.cuda.Device().id
for fn in cases.values():
    for _ in range(5):
        fn()
cupy.cuda.Device().synchronize()
for burst in range(int(sys.argv[2]) if len(sys.argv) > 2 else 40):
    for name, fn in cases.items():
        release = timing._hold(dev)
        for _ in range(10):
            res[name].append(fn())
        release()
        cupy.cuda.Device().synchronize()
out = {}
for name, rows in res.items():
    a = np.asarray(rows, dtype=np.float64) / 1e3
    med = np.median(a, axis=0)
    out[name] = med.tolist()
    print(f"{name:26s} fwd {med[0]:6.1f}  grad call -> backward entry {med[1]:6.1f}  backward body {med[2]:6.1f}  "
          f"backward exit -> grad returns {med[3]:6.1f}  total {np.median(a.sum(axis=1)):6.1f} us")
json.dump(out, open(sys.argv[1], "w"), indent=1)
