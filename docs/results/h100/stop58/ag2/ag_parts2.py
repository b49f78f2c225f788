"""The composite (forward + autograd.grad in one call) against its parts, for variants of our Function:
A the op as it is; B its backward returning three empty_like (no backward_keyed, no launch); C the op with every
engine launch made a no-op (Launcher.launch patched: the kernels never run, the host path is all there is).
Host us per call (timing.host_us), interleaved rounds, medians."""
import sys, json
sys.path.insert(0, "."); sys.path.insert(0, "tools")
import torch
import torch.nn.functional as F
import attention.torch as at
from attention.torch import _FlashAttention, _c_apply
from cukernels import launch as engine_launch
from call_overhead import _interleaved

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
hq, hk, hv = (t.transpose(1, 2).contiguous().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2).contiguous()
OPTS = (True, None, None, False, None)

class NoBwd(_FlashAttention):
    @staticmethod
    def backward(ctx, do):
        q, k, v, o = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

def parts(tag, fwd, ins, g):
    o = fwd()
    return [(f"{tag}: fwd + grad", lambda: torch.autograd.grad(fwd(), ins, g), ""),
            (f"{tag}: fwd recorded", fwd, ""),
            (f"{tag}: grad of a kept graph", lambda: torch.autograd.grad(o, ins, g, retain_graph=True), "")]

calls = []
calls += parts("A ours", lambda: at.flash_attention(gq, gk, gv, causal=True), (gq, gk, gv), do)
no_bwd = _c_apply(NoBwd)
calls += parts("B ours fwd, empty bwd", lambda: no_bwd(gq, gk, gv, OPTS), (gq, gk, gv), do)
calls += parts("S SDPA own", lambda: F.scaled_dot_product_attention(hq, hk, hv, is_causal=True), (hq, hk, hv), hdo)
rows = _interleaved(calls, rounds)
real = engine_launch.Launcher.launch

def only(pred):
    def launch(self, stream, ptrs):
        if pred(self.name):
            real(self, stream, ptrs)
    return launch

fwd = lambda: at.flash_attention(gq, gk, gv, causal=True)
for tag, patch, pdl in (("C ours, launches off", only(lambda n: False), True),
                        ("F ours, backward launches off", only(lambda n: "bwd" not in n), True),
                        ("G ours, forward launch off", only(lambda n: "fwd" not in n), True),
                        ("D ours, PDL off", real, False)):
    engine_launch.Launcher.launch = patch
    engine_launch.PDL[0] = pdl
    try:
        rows += _interleaved(parts(tag, fwd, (gq, gk, gv), do), rounds)
    finally:
        engine_launch.Launcher.launch = real
        engine_launch.PDL[0] = True
by = {r["call"]: r["host us"] for r in rows}
for r in rows:
    print(f"{r['call']:40s} {r['host us']:8.1f}  ({r['host us p20-p80']})  held {r['held']}")
for tag in ("A ours", "B ours fwd, empty bwd", "S SDPA own", "C ours, launches off", "F ours, backward launches off",
            "G ours, forward launch off", "D ours, PDL off"):
    extra = by[f"{tag}: fwd + grad"] - by[f"{tag}: fwd recorded"] - by[f"{tag}: grad of a kept graph"]
    print(f"{tag:28s} composite - parts = {extra:6.1f} us")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
