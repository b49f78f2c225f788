"""Forward + backward through autograd with our launches programmatic (PDL, the default on sm_90) or plain, beside
SDPA's own choice, in one interleaved run; and the forward alone and the kept-graph grad each way."""
import sys, json
sys.path.insert(0, "."); sys.path.insert(0, "tools")
import torch
import torch.nn.functional as F
import attention.torch as at
from cukernels import launch as engine_launch
from call_overhead import _interleaved

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 31
tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
hq, hk, hv = (t.transpose(1, 2).contiguous().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2).contiguous()
PDL = engine_launch.PDL

def plain(fn):
    def call():
        PDL[0] = False
        try:
            return fn()
        finally:
            PDL[0] = True
    return call

fb = lambda: torch.autograd.grad(at.flash_attention(gq, gk, gv, causal=True), (gq, gk, gv), do)
fw = lambda: at.flash_attention(gq, gk, gv, causal=True)
o = fw()
kg = lambda: torch.autograd.grad(o, (gq, gk, gv), do, retain_graph=True)
calls = [("ours fwd+bwd, PDL", fb, ""), ("ours fwd+bwd, plain", plain(fb), ""),
         ("SDPA own fwd+bwd", lambda: torch.autograd.grad(F.scaled_dot_product_attention(hq, hk, hv, is_causal=True),
                                                          (hq, hk, hv), hdo), ""),
         ("ours fwd recorded, PDL", fw, ""), ("ours fwd recorded, plain", plain(fw), ""),
         ("ours grad of a kept graph, PDL", kg, ""), ("ours grad of a kept graph, plain", plain(kg), ""),
         ("nothing (PDL flag toggled)", plain(lambda: None), "")]
rows = _interleaved(calls, rounds)
for r in rows:
    print(f"{r['call']:36s} {r['host us']:8.1f}  ({r['host us p20-p80']})  as called {r['as called us']:8.1f}  held {r['held']}")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
