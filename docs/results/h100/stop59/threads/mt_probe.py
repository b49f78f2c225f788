"""Issue 11: fwd+bwd through autograd, ours against SDPA's own choice, with the autograd engine's device thread
(default) and with the backward on the calling thread (torch.autograd.set_multithreading_enabled(False)):
is the gap the hand-off between threads? Interleaved rounds (tools/call_overhead._interleaved)."""
import json, sys
import torch
import torch.nn.functional as F
import attention.torch as at
from tools.call_overhead import _interleaved, noop_function
from tabulate import tabulate

tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
hq, hk, hv = (t.transpose(1, 2).clone().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2)
floor = noop_function()

def ours():
    o = at.flash_attention(gq, gk, gv, causal=True)
    return torch.autograd.grad(o, (gq, gk, gv), do)
def sdpa():
    o = F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
    return torch.autograd.grad(o, (hq, hk, hv), hdo)
def noop():
    return torch.autograd.grad(floor.apply(gq, gk, gv), (gq, gk, gv), do)
def ours_fwd():
    return at.flash_attention(gq, gk, gv, causal=True)
def sdpa_fwd():
    return F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)

def single(fn):
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return fn()
    return run

calls = []
for name, fn in (("ours fwd+bwd", ours), ("SDPA own fwd+bwd", sdpa), ("no-op Function fwd+bwd", noop),
                 ("ours fwd (requires grad)", ours_fwd), ("SDPA fwd (requires grad)", sdpa_fwd)):
    calls.append((name, fn, "device thread (default)"))
    if "bwd" in name:
        calls.append((name, single(fn), "calling thread"))
rows = _interleaved(calls, int(sys.argv[2]) if len(sys.argv) > 2 else 25)
print(tabulate(rows, headers="keys", tablefmt="github"))
json.dump(rows, open(sys.argv[1], "w"), indent=1)
