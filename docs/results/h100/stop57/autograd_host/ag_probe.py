"""Stop 57 probe: host us per call of the attention op under torch autograd, old Function against new, beside
SDPA, in interleaved rounds (the median over rounds and the per-round paired difference).

PYTHONPATH=. python scratch/ag_probe.py --rounds 31 --json OUT
"""
from __future__ import annotations

import argparse
import functools
import json

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy
    import torch
    import torch.nn.functional as F

    import attention.torch as at
    from attention import api
    from attention.backward import backward_keyed
    from cukernels import launch, timing

    class Old(torch.autograd.Function):  # the stop 56 Function and forward_keyed (o by torch.empty of shape)
        @staticmethod
        def forward(ctx, q, k, v, segment_ids, options):
            causal, window, softmax_scale, _ = options
            vq, vk, vv = launch.view(q), launch.view(k), launch.view(v)
            key = (vq[0], vk[0], vv[0], api.options_key(causal, window, segment_ids, softmax_scale))
            call = api._FORWARD.get(key)
            o, lse = call(vq[1], vk[1], vv[1], segment_ids)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.options = (call, segment_ids, options)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            key, segment_ids, (causal, window, softmax_scale, deterministic) = ctx.options
            like_o = do.dtype is o.dtype if do.is_contiguous() else False
            dq, dk, dv = backward_keyed(key, do, q, k, v, o, lse, causal=causal, window=window,
                                        segment_ids=segment_ids, softmax_scale=softmax_scale,
                                        deterministic=deterministic, do_like_o=like_o)
            return dq, dk, dv, None, None

    old_apply = at._c_apply(Old)
    uw = at._unwrap_if_dead

    def old_fa(q, k, v, causal):
        if at._compiling():
            raise AssertionError
        if at._functorch_active():
            raise AssertionError
        return old_apply(uw(q), uw(k), uw(v), uw(None), (causal, None, None, False))

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, options):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

    floor_apply = at._c_apply(Floor)

    tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
    do = torch.randn_like(tq)
    hq, hk, hv = (t.transpose(1, 2).clone().requires_grad_() for t in (tq, tk, tv))
    hdo = do.transpose(1, 2)

    # the two Functions give the same gradients (bitwise)
    g_new = torch.autograd.grad(at.flash_attention(gq, gk, gv, causal=True), (gq, gk, gv), do)
    g_old = torch.autograd.grad(old_fa(gq, gk, gv, True), (gq, gk, gv), do)
    same = all(torch.equal(a, b) for a, b in zip(g_new, g_old))
    print("new == old gradients bitwise:", same)
    assert same

    calls = {}
    calls["fwd new (recorded)"] = lambda: at.flash_attention(gq, gk, gv, causal=True)
    calls["fwd old (recorded)"] = lambda: old_fa(gq, gk, gv, True)
    calls["fwd SDPA (recorded)"] = lambda: F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
    calls["fwd floor C apply (recorded)"] = lambda: floor_apply(gq, gk, gv, None)
    calls["forward_keyed, o like q"] = lambda: api.forward_keyed(tq, tk, tv, True, None, None, None)
    key = api._FORWARD.get((launch.view(tq)[0], launch.view(tk)[0], launch.view(tv)[0],
                            api.options_key(True, None, None, None)))
    pq, pk, pv = tq.data_ptr(), tk.data_ptr(), tv.data_ptr()
    calls["ForwardCall, o by torch.empty"] = lambda: key(pq, pk, pv, None)
    calls["ForwardCall, o by empty_like"] = lambda: key(pq, pk, pv, None, tq)
    calls["torch.empty(o shape) x10"] = lambda: [key.new_o() for _ in range(10)]
    calls["torch.empty_like(q) x10"] = lambda: [torch.empty_like(tq) for _ in range(10)]
    calls["launch.view(q) x10"] = lambda: [launch.view(gq) for _ in range(10)]
    calls["_compiling() x10"] = lambda: [at._compiling() for _ in range(10)]
    calls["_functorch_active() x10"] = lambda: [at._functorch_active() for _ in range(10)]

    calls["3x empty_like"] = lambda: (torch.empty_like(tq), torch.empty_like(tk), torch.empty_like(tv))
    packed3 = functools.partial(torch.empty, (3, 1, 128, 8, 64), dtype=torch.bfloat16, device="cuda")
    calls["empty(3,..).unbind()"] = lambda: packed3().unbind()

    from attention import backward as bw
    bcs = list(bw._BACKWARD_AFTER._entries.values())
    assert len(bcs) == 1, len(bcs)
    bc = bcs[0]
    packed = bc.new_packed
    assert packed is not None and packed[1]

    def fb(f):
        def run():
            return torch.autograd.grad(f(), (gq, gk, gv), do)
        return run
    def packed_on(on, f):
        def run():
            bc.new_packed = packed if on else None
            return f()
        return run
    calls["fwd+bwd new"] = packed_on(True, fb(lambda: at.flash_attention(gq, gk, gv, causal=True)))
    calls["fwd+bwd new, 3 allocs"] = packed_on(False, fb(lambda: at.flash_attention(gq, gk, gv, causal=True)))
    calls["fwd+bwd old"] = packed_on(False, fb(lambda: old_fa(gq, gk, gv, True)))
    calls["fwd+bwd SDPA"] = lambda: torch.autograd.grad(
        F.scaled_dot_product_attention(hq, hk, hv, is_causal=True), (hq, hk, hv), hdo)
    calls["fwd+bwd floor"] = fb(lambda: floor_apply(gq, gk, gv, None))

    def chain(f):
        def run():
            o = gq
            for _ in range(8):
                o = f(o)
            return torch.autograd.grad(o, (gq, gk, gv), do)
        return run
    calls["chain8 new"] = packed_on(True, chain(lambda o: at.flash_attention(o, gk, gv, causal=True)))
    calls["chain8 new, 3 allocs"] = packed_on(False, chain(lambda o: at.flash_attention(o, gk, gv, causal=True)))
    calls["chain8 old"] = packed_on(False, chain(lambda o: old_fa(o, gk, gv, True)))

    def sdpa_chain():
        o = hq
        for _ in range(8):
            o = F.scaled_dot_product_attention(o, hk, hv, is_causal=True)
        return torch.autograd.grad(o, (hq, hk, hv), hdo)
    calls["chain8 SDPA"] = sdpa_chain

    for f in calls.values():  # warm
        for _ in range(3):
            f()
    cupy.cuda.Device().synchronize()
    torch.cuda.synchronize()
    host = {n: [] for n in calls}
    for r in range(args.rounds):
        names = list(calls) if r % 2 == 0 else list(reversed(calls))
        for n in names:
            f = calls[n]
            f()
            torch.cuda.synchronize()
            us, held = timing.host_us(f, per_call_ms=1.0, repeats=3)
            host[n].append(us)
    rows = []
    for n, v in host.items():
        a = np.asarray(v)
        rows.append({"call": n, "host us median": round(float(np.median(a)), 2),
                     "p20-p80": f"{np.percentile(a, 20):.1f}-{np.percentile(a, 80):.1f}"})
    pairs = [("fwd new (recorded)", "fwd old (recorded)"), ("fwd new (recorded)", "fwd SDPA (recorded)"),
             ("fwd+bwd new", "fwd+bwd new, 3 allocs"), ("fwd+bwd new, 3 allocs", "fwd+bwd SDPA"),
             ("chain8 new", "chain8 new, 3 allocs"), ("empty(3,..).unbind()", "3x empty_like"),
             ("fwd+bwd new", "fwd+bwd old"), ("fwd+bwd new", "fwd+bwd SDPA"), ("fwd+bwd old", "fwd+bwd SDPA"),
             ("chain8 new", "chain8 old"), ("chain8 new", "chain8 SDPA"), ("chain8 old", "chain8 SDPA"),
             ("ForwardCall, o by empty_like", "ForwardCall, o by torch.empty")]
    paired = []
    for a, b in pairs:
        d = np.asarray(host[a]) - np.asarray(host[b])
        paired.append({"a - b": f"{a} - {b}", "median": round(float(np.median(d)), 2),
                       "p20-p80": f"{np.percentile(d, 20):.1f}-{np.percentile(d, 80):.1f}",
                       "rounds a < b": f"{int((d < 0).sum())}/{len(d)}"})
    from tabulate import tabulate

    print(tabulate(rows, headers="keys", tablefmt="github"))
    print()
    print(tabulate(paired, headers="keys", tablefmt="github"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "paired": paired, "raw": host}, fh, indent=1)


if __name__ == "__main__":
    main()
