"""Per added op in a chain of 8 attention ops with one grad: ours, SDPA's own choice, and a no-op Python
autograd.Function (empty_like outputs), interleaved rounds, host us (timing.host_us)."""
import json, os, sys
import numpy as np
import torch
import torch.nn.functional as F
import cupy
sys.path.insert(0, ".")
import attention.torch as at
from cukernels import timing

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 21
CHAIN = 8
tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
hq, hk, hv = (t.transpose(1, 2).clone().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2)

class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)
    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

def chain(op, q, k, v, g, n):
    def fn():
        o = q
        for _ in range(n):
            o = op(o, k, v)
        return torch.autograd.grad(o, (q, k, v), g)
    return fn
ours = lambda q, k, v: at.flash_attention(q, k, v, causal=True)
sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
rows = {}
for name, op, args in (("ours", ours, (gq, gk, gv, do)), ("sdpa", sdpa, (hq, hk, hv, hdo)), ("floor", Floor.apply, (gq, gk, gv, do))):
    rows[name + " x1"] = chain(op, *args, 1)
    rows[name + " x8"] = chain(op, *args, CHAIN)
    rows[name + " fwd x8 only"] = (lambda op=op, args=args: [op(*args[:3]) for _ in range(CHAIN)])
res = {n: [] for n in rows}
for r in range(ROUNDS):
    for name, fn in rows.items():
        fn(); cupy.cuda.Device().synchronize()
        us, held = timing.host_us(fn, per_call_ms=1.0, repeats=1)
        res[name].append(us)
out = []
for name in rows:
    h = np.asarray(res[name])
    out.append({"row": name, "host us median": round(float(np.median(h)), 1),
                "p20-p80": f"{np.percentile(h, 20):.1f}-{np.percentile(h, 80):.1f}"})
per = {}
for impl in ("ours", "sdpa", "floor"):
    x1, x8, f8 = (np.asarray(res[f"{impl} {s}"]) for s in ("x1", "x8", "fwd x8 only"))
    per[impl] = {"per added op (fwd+bwd)": round(float(np.median((x8 - x1) / (CHAIN - 1))), 1),
                 "forward per op": round(float(np.median(f8 / CHAIN)), 1),
                 "backward per added op": round(float(np.median((x8 - x1) / (CHAIN - 1) - f8 / CHAIN)), 1)}
from tabulate import tabulate
print(tabulate(out, headers="keys", tablefmt="github"))
print(json.dumps(per, indent=1))
if os.environ.get("OUT"):
    json.dump({"rows": out, "per_op": per, "raw": res}, open(os.environ["OUT"] + "/chain_probe.json", "w"), indent=1)
