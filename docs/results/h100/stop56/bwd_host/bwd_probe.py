"""Ceiling of host-side cuts in the autograd backward: variants of the cached BackwardCall (fewer launches,
packed gradient allocation) timed interleaved with SDPA and a no-op Function. Also a stamp breakdown."""
import json, sys, time
import numpy as np
import torch
import torch.nn.functional as F
import cupy
sys.path.insert(0, ".")
import attention.torch as at
from attention import backward as bw
from cukernels import timing

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 21
tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
o = at.flash_attention(gq, gk, gv, causal=True)
ref = torch.autograd.grad(o, (gq, gk, gv), do)
calls = list(bw._BACKWARD_AFTER._entries.values())
assert len(calls) == 1, len(calls)
call = calls[0]
base_steps, base_grads = list(call.steps), call.new_grads
print("steps:", [s.name for s in base_steps])
shape = call.shapes[0]
assert all(s == shape for s in call.shapes)
empty3 = lambda: torch.empty((3, *shape), dtype=torch.bfloat16, device="cuda").unbind(0)
packed = (lambda: None,) * 3

class Packed:
    def __init__(self): self.cur = None

def set_variant(steps, pack):
    call.steps = steps
    if pack:
        state = {}
        def g0():
            state["t"] = empty3(); return state["t"][0]
        call.new_grads = (g0, lambda: state["t"][1], lambda: state["t"][2])
    else:
        call.new_grads = base_grads

def fb():
    o = at.flash_attention(gq, gk, gv, causal=True)
    return torch.autograd.grad(o, (gq, gk, gv), do)

# correctness of the packed variant
set_variant(base_steps, True)
g = fb()
for a, b in zip(g, ref):
    assert torch.equal(a, b), (a - b).abs().max()
set_variant(base_steps, False)

class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)
    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

hq, hk, hv = (t.transpose(1, 2).clone().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2)
def sdpa_fb():
    o = F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
    return torch.autograd.grad(o, (hq, hk, hv), hdo)
def floor_fb():
    return torch.autograd.grad(Floor.apply(gq, gk, gv), (gq, gk, gv), do)

variants = {
    "ours (3 launches, 3 allocs)": (base_steps, False),
    "ours packed grads (3 launches, 1 alloc)": (base_steps, True),
    "ours no convert (2 launches)": (base_steps[:2], False),
    "ours dkdv only (1 launch)": (base_steps[1:2], False),
    "ours dkdv only, packed (1 launch, 1 alloc)": (base_steps[1:2], True),
    "ours no launches (0 launch)": ([], False),
}
rows = []
for name, (steps, pack) in variants.items():
    def fn(steps=steps, pack=pack):
        return fb()
    rows.append((name, fn, (steps, pack)))
rows.append(("sdpa default", sdpa_fb, None))
rows.append(("floor no-op Function", floor_fb, None))
fwd_only = lambda: at.flash_attention(gq, gk, gv, causal=True)
rows.append(("ours fwd only (grad graph built)", fwd_only, None))
rows.append(("sdpa fwd only", lambda: F.scaled_dot_product_attention(hq, hk, hv, is_causal=True), None))

res = {n: [] for n, _, _ in rows}
for r in range(ROUNDS):
    for name, fn, var in rows:
        if var is not None:
            set_variant(*var)
        fn(); cupy.cuda.Device().synchronize()
        us, held = timing.host_us(fn, per_call_ms=0.3, repeats=1)
        res[name].append(us)
set_variant(base_steps, False)
out = []
for name, _, _ in rows:
    h = np.asarray(res[name])
    out.append({"row": name, "median": round(float(np.median(h)), 1), "p20": round(float(np.percentile(h, 20)), 1),
                "p80": round(float(np.percentile(h, 80)), 1), "min": round(float(h.min()), 1)})
# paired difference vs sdpa per round
s = np.asarray(res["sdpa default"])
for row in out:
    row["median of (row - sdpa) per round"] = round(float(np.median(np.asarray(res[row["row"]]) - s)), 1)

# stamp breakdown inside the backward body (no timing hold: plain loop of 300, sync each 50)
orig_bwd = at._FlashAttention.backward
stamps = []
def stamped(ctx, do_):
    t0 = time.perf_counter_ns()
    q, k, v, o_, lse = ctx.saved_tensors
    key, segment_ids, (causal, window, softmax_scale, deterministic) = ctx.options
    t1 = time.perf_counter_ns()
    vdo = bw.launch.view(do_)
    c = bw._BACKWARD_AFTER.get((key, vdo[0], deterministic))
    ptr = c.frame.ptr
    ptrs = (vdo[1], ptr(q), ptr(k), ptr(v), ptr(o_))
    t2 = time.perf_counter_ns()
    f = c.frame; stream = f.stream()
    a, b, cc = c.new_grads
    dq, dk, dv = a(), b(), cc()
    t3 = time.perf_counter_ns()
    pdq, pdk, pdv, plse = ptr(dq), ptr(dk), ptr(dv), bw.launch.pointer(lse)
    ws, pws = c.workspace.take(f, stream)
    args = (*ptrs, plse, pdq, pdk, pdv, pws + c.ws_lse2, pws + c.ws_dsum, pws + c.ws_accum, *([pws] * 6))
    t4 = time.perf_counter_ns()
    ts = [t4]
    for st in c.steps:
        st.launch(stream, args); ts.append(time.perf_counter_ns())
    stamps.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, *[ts[i + 1] - ts[i] for i in range(len(ts) - 1)]))
    return dq, dk, dv, None, None
at._FlashAttention.backward = staticmethod(stamped)
g = fb()
for a, b in zip(g, ref):
    assert torch.equal(a, b)
stamps.clear()
for i in range(300):
    fb()
    if i % 50 == 49: torch.cuda.synchronize()
at._FlashAttention.backward = orig_bwd
st = np.median(np.asarray(stamps), axis=0) / 1e3
labels = ["unpack saved+options", "key+ptrs", "3 allocs", "ptrs+workspace"] + [s.name[:40] for s in base_steps]
breakdown = dict(zip(labels, [round(float(x), 2) for x in st]))
from tabulate import tabulate
print(tabulate(out, headers="keys", tablefmt="github"))
print(json.dumps(breakdown, indent=1))
import os
if os.environ.get("OUT"):
    json.dump({"rows": out, "raw": res, "breakdown_us": breakdown}, open(os.environ["OUT"] + "/bwd_probe.json", "w"), indent=1)
