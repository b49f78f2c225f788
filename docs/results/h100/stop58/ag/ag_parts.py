"""Where the host time of forward + backward through autograd goes: ours, SDPA's own choice, a no-op Function.
Host us per call (timing.host_us, the stream held), interleaved rounds, medians."""
import sys, json
sys.path.insert(0, "."); sys.path.insert(0, "tools")
import torch
import torch.nn.functional as F
import attention.torch as at
from attention.torch import _FlashAttention
from attention.backward import backward_keyed
from call_overhead import _interleaved

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
hq, hk, hv = (t.transpose(1, 2).contiguous().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2).contiguous()

class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)
    @staticmethod
    def backward(ctx, g):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

o = at.flash_attention(gq, gk, gv, causal=True)
o_s = F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
o_f = Floor.apply(gq, gk, gv)
node = o.grad_fn
key, lse, opts = node.state
q_, k_, v_, o_ = node.saved_tensors
calls = []
m = lambda name, fn, what="": calls.append((name, fn, what))
m("ours fwd+bwd", lambda: torch.autograd.grad(at.flash_attention(gq, gk, gv, causal=True), (gq, gk, gv), do))
m("SDPA own fwd+bwd", lambda: torch.autograd.grad(F.scaled_dot_product_attention(hq, hk, hv, is_causal=True), (hq, hk, hv), hdo))
m("floor fwd+bwd", lambda: torch.autograd.grad(Floor.apply(gq, gk, gv), (gq, gk, gv), do))
m("ours fwd+bwd, graph retained", lambda: torch.autograd.grad(at.flash_attention(gq, gk, gv, causal=True), (gq, gk, gv), do, retain_graph=True))
m("SDPA own fwd+bwd, graph retained", lambda: torch.autograd.grad(F.scaled_dot_product_attention(hq, hk, hv, is_causal=True), (hq, hk, hv), hdo, retain_graph=True))
m("floor fwd+bwd, graph retained", lambda: torch.autograd.grad(Floor.apply(gq, gk, gv), (gq, gk, gv), do, retain_graph=True))
def ours_then_grad():
    out = at.flash_attention(gq, gk, gv, causal=True)
    g = torch.autograd.grad(out, (gq, gk, gv), do)
    del out
    return g
m("ours fwd+bwd, o dropped after", ours_then_grad)
m("ours fwd recorded", lambda: at.flash_attention(gq, gk, gv, causal=True))
m("SDPA own fwd recorded", lambda: F.scaled_dot_product_attention(hq, hk, hv, is_causal=True))
m("floor fwd recorded", lambda: Floor.apply(gq, gk, gv))
m("ours grad (retained graph)", lambda: torch.autograd.grad(o, (gq, gk, gv), do, retain_graph=True))
m("SDPA own grad (retained graph)", lambda: torch.autograd.grad(o_s, (hq, hk, hv), hdo, retain_graph=True))
m("floor grad (retained graph)", lambda: torch.autograd.grad(o_f, (gq, gk, gv), do, retain_graph=True))
m("ours backward() body, called directly", lambda: _FlashAttention.backward(node, do))
m("ours backward_keyed", lambda: backward_keyed(key, do, q_, k_, v_, o_, lse, causal=True, window=None,
                                              segment_ids=None, softmax_scale=None, deterministic=False, do_like_o=True))
m("ctx.saved_tensors (4)", lambda: node.saved_tensors)
m("3 x torch.empty_like", lambda: (torch.empty_like(tq), torch.empty_like(tk), torch.empty_like(tv)))
rows = _interleaved(calls, rounds)
for r in rows:
    print(f"{r['call']:42s} {r['host us']:8.1f}  ({r['host us p20-p80']})  held {r['held']}")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
