"""Backward body on the autograd device thread: allocation and keying variants, timed by stamps inside the
body (median over iterations) and by the loop's wall time per fwd+bwd, variants interleaved in rounds."""
import json, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, ".")
import attention.torch as at
from attention import backward as bw

tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
def fb():
    o = at.flash_attention(gq, gk, gv, causal=True)
    return torch.autograd.grad(o, (gq, gk, gv), do)
ref = fb()
call = list(bw._BACKWARD_AFTER._entries.values())[0]
fkey = list(bw._BACKWARD_AFTER._entries.keys())[0]
stamps = {}
view, pointer = bw.launch.view, bw.launch.pointer
empty_like = torch.empty_like

def make(alloc, keying):
    body = []
    def backward(ctx, do_):
        t0 = time.perf_counter_ns()
        q, k, v, o_, lse = ctx.saved_tensors
        key, segment_ids, (causal, window, softmax_scale, deterministic) = ctx.options
        if keying == "view":
            vdo = view(do_)
            c = bw._BACKWARD_AFTER.get((key, vdo[0], deterministic))
            pdo = vdo[1]
        else:  # dO contiguous and of o's dtype and device: its signature is o's (what autograd hands a backward)
            c = call if do_.is_contiguous() and do_.dtype == o_.dtype else None
            pdo = do_.data_ptr()
        ptr = c.frame.ptr
        t1 = time.perf_counter_ns()
        if alloc == "partial":
            a, b, cc = c.new_grads
            dq, dk, dv = a(), b(), cc()
        elif alloc == "empty_like":
            dq, dk, dv = empty_like(q), empty_like(k), empty_like(v)
        elif alloc == "unbind":
            dq, dk, dv = torch.empty((3, *c.shapes[0]), dtype=q.dtype, device=q.device).unbind(0)
        elif alloc == "new_empty":
            dq, dk, dv = q.new_empty(c.shapes[0]), k.new_empty(c.shapes[1]), v.new_empty(c.shapes[2])
        t2 = time.perf_counter_ns()
        f = c.frame; stream = f.stream()
        ws, pws = c.workspace.take(f, stream)
        args = (pdo, ptr(q), ptr(k), ptr(v), ptr(o_), pointer(lse), ptr(dq), ptr(dk), ptr(dv), pws + c.ws_lse2,
                pws + c.ws_dsum, pws + c.ws_accum, *([pws] * 6))
        for st in c.steps:
            st.launch(stream, args)
        t3 = time.perf_counter_ns()
        body.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
        return dq, dk, dv, None, None
    return backward, body

orig = at._FlashAttention.backward
variants = {}
for alloc in ("partial", "empty_like", "unbind", "new_empty"):
    for keying in ("view", "contig"):
        variants[(alloc, keying)] = make(alloc, keying)
# correctness of each variant
for name, (fn, body) in variants.items():
    at._FlashAttention.backward = staticmethod(fn)
    g = fb()
    for a, b in zip(g, ref):
        assert torch.equal(a, b), name
at._FlashAttention.backward = orig
walls = {n: [] for n in variants}
walls["orig"] = []
for rnd in range(15):
    for name in list(variants) + ["orig"]:
        if name == "orig":
            at._FlashAttention.backward = orig
        else:
            at._FlashAttention.backward = staticmethod(variants[name][0])
            variants[name][1].clear() if rnd == 0 else None
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(100):
            fb()
        walls[name].append((time.perf_counter() - t) * 1e4)
        torch.cuda.synchronize()
at._FlashAttention.backward = orig
rows = []
for name in list(variants) + ["orig"]:
    r = {"variant": str(name), "wall us/call (median of rounds)": round(float(np.median(walls[name])), 1)}
    if name != "orig":
        b = np.median(np.asarray(variants[name][1]), axis=0) / 1e3
        r.update({"unpack+key": round(float(b[0]), 2), "allocs": round(float(b[1]), 2),
                  "ws+launches": round(float(b[2]), 2), "body": round(float(b[3]), 2)})
    rows.append(r)
from tabulate import tabulate
print(tabulate(rows, headers="keys", tablefmt="github"))
if os.environ.get("OUT"):
    json.dump(rows, open(os.environ["OUT"] + "/bwd_probe2.json", "w"), indent=1)
