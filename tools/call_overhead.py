"""Host cost per call of the public API beside torch's own ops, on problems too small to keep the GPU busy.

``python tools/call_overhead.py [--json PATH]``: for each call, the host microseconds per call with the stream
held (``cukernels.timing.host_us``: the enqueue alone, the GPU never stalls the host) and the wall time per call
of back-to-back calls synchronised once at the end (``timing.as_called``), in interleaved rounds (the median over rounds; p20-p80 says how much host time moved).
Needs a GPU and torch. Printed as a table; ``--json`` writes the rows.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys

import numpy as np

CHAIN = 8  # attention ops in the chained fwd+bwd rows


@functools.cache
def noop_function():
    """A Python ``torch.autograd.Function`` of (q, k, v) that launches nothing (its forward and backward only
    allocate their outputs): the host-time floor of any op written this way, for this tool and the host probes
    (docs/results/h100/stop58/ag*/). Made on first use: importing this module does not import torch."""
    import torch

    class NoOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    return NoOp


def _rows(rounds: int):
    import cupy
    import torch
    import torch.nn.functional as F

    import attention
    import attention.torch as at
    import moe
    from cukernels import dtypes

    calls = []

    def measure(name, fn, what):
        calls.append((name, fn, what))

    # attention forward, B1 S128 H8 D64 causal
    q, k, v = (dtypes.random((1, 128, 8, 64), dtypes.BF16, seed=s) for s in (1, 2, 3))
    measure("flash_attention fwd", lambda: attention.flash_attention(q, k, v, causal=True), "CuPy arrays")
    tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    measure("flash_attention fwd", lambda: attention.flash_attention(tq, tk, tv, causal=True), "torch tensors")
    sq, sk, sv = (t.transpose(1, 2) for t in (tq, tk, tv))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(sq, sk, sv, is_causal=True)
        measure(f"torch SDPA {label} fwd", sdpa, "torch tensors")

    # forward + backward through autograd
    gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
    do = torch.randn_like(tq)

    def ours_fb():
        o = at.flash_attention(gq, gk, gv, causal=True)
        return torch.autograd.grad(o, (gq, gk, gv), do)
    measure("attention.torch fwd+bwd", ours_fb, "autograd")

    floor = noop_function()

    def floor_fb():
        return torch.autograd.grad(floor.apply(gq, gk, gv), (gq, gk, gv), do)
    measure("autograd.Function, no kernels", floor_fb, "autograd floor of a Python op")
    hq, hk, hv = (t.transpose(1, 2).clone().requires_grad_() for t in (tq, tk, tv))
    hdo = do.transpose(1, 2)
    for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def sdpa_fb(backend=backend):
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
            return torch.autograd.grad(o, (hq, hk, hv), hdo)
        measure(f"torch SDPA {label} fwd+bwd", sdpa_fb, "autograd")

    def sdpa_plain_fb():  # as users call it: torch picks the backend, no context manager (which costs host time)
        o = F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
        return torch.autograd.grad(o, (hq, hk, hv), hdo)
    measure("torch SDPA (its own backend choice) fwd+bwd", sdpa_plain_fb, "autograd")

    # eight attention ops chained (o feeds the next q), one grad: what each op adds to a model's step, where
    # the autograd engine's start and its device thread's hand-offs are paid once per backward, not per op
    def ours_chain():
        o = gq
        for _ in range(CHAIN):
            o = at.flash_attention(o, gk, gv, causal=True)
        return torch.autograd.grad(o, (gq, gk, gv), do)
    measure(f"attention.torch fwd+bwd, chain of {CHAIN}", ours_chain, "autograd, one grad")

    def sdpa_chain():  # in SDPA's own [batch, heads, seq, dim] layout: no transposes
        o = hq
        for _ in range(CHAIN):
            o = F.scaled_dot_product_attention(o, hk, hv, is_causal=True)
        return torch.autograd.grad(o, (hq, hk, hv), hdo)
    measure(f"torch SDPA (its own backend choice) fwd+bwd, chain of {CHAIN}", sdpa_chain, "autograd, one grad")

    # MoE parts and layer, 16 tokens
    logits = cupy.random.default_rng(0).standard_normal((16, 64), dtype=cupy.float32)
    measure("moe.route", lambda: moe.route(logits, 2), "CuPy, 16 tokens x 64 experts")
    measure("moe.route + permute", lambda: moe.permute(moe.route(logits, 2)), "CuPy")
    tlogits = torch.randn(16, 64, device="cuda")
    measure("moe.route + permute", lambda: moe.permute(moe.route(tlogits, 2)), "torch")
    measure("torch softmax + topk", lambda: torch.topk(torch.softmax(tlogits, -1), 2), "torch")
    hidden, inter, experts = 1024, 512, 64
    x = dtypes.random((16, hidden), dtypes.BF16, seed=5)
    router = cupy.random.default_rng(1).standard_normal((hidden, experts), dtype=cupy.float32)
    w_up = dtypes.random((experts, 2 * inter, hidden), dtypes.BF16, seed=6, scale=0.03)
    w_down = dtypes.random((experts, hidden, inter), dtypes.BF16, seed=7, scale=0.04)
    layer = moe.MoELayer(router, w_up, w_down, 2)
    measure("MoELayer.forward", lambda: layer(x), f"CuPy, 16 tokens, E{experts} top2 H{hidden}")
    tl = moe.MoELayer(*(torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16
                        else torch.from_dlpack(a) for a in (router, w_up, w_down)), 2)
    tx = torch.randn(16, hidden, device="cuda").to(torch.bfloat16)
    measure("MoELayer.forward", lambda: tl(tx), "torch")
    cap = layer.capture(16)
    measure("MoELayer captured replay", cap.replay, "CuPy graph")
    measure("MoELayer captured x -> out", lambda: cap(x), "CuPy graph + input copy")
    tcap = tl.capture(16)
    measure("MoELayer captured replay", tcap.replay, "torch.cuda.graph")
    measure("MoELayer captured x -> out", lambda: tcap(tx), "torch.cuda.graph + input copy")
    rows = _interleaved(calls, rounds)
    host = {r["call"]: r["host us"] for r in rows}
    for r in rows:  # what one more op in the chain costs: (chain - one op) / (CHAIN - 1)
        if r["call"].endswith(f", chain of {CHAIN}"):
            single = host[r["call"][:-len(f", chain of {CHAIN}")]]
            r["what"] += f"; per added op {(r['host us'] - single) / (CHAIN - 1):.1f} us"
    return rows


def _interleaved(calls, rounds: int) -> list[dict]:
    """Host time moves on a scale of seconds on a shared machine: every call is timed once per round, round
    after round, so calls compared with each other were timed at the same moments; the median over rounds."""
    import cupy

    from cukernels import timing

    host = {name + what: [] for name, _, what in calls}
    called = {name + what: [] for name, _, what in calls}
    held = {name + what: True for name, _, what in calls}
    for _ in range(rounds):
        for name, fn, what in calls:
            fn()
            cupy.cuda.Device().synchronize()
            as_called = timing.as_called(fn, repeats=1)
            us, was_held = timing.host_us(fn, per_call_ms=as_called, repeats=1)
            host[name + what].append(us)
            called[name + what].append(1e3 * as_called)
            held[name + what] &= was_held
    rows = []
    for name, _, what in calls:
        h = np.asarray(host[name + what])
        rows.append({"call": name, "what": what, "host us": round(float(np.median(h)), 1),
                     "host us p20-p80": f"{np.percentile(h, 20):.1f}-{np.percentile(h, 80):.1f}",
                     "held": held[name + what], "as called us": round(float(np.median(called[name + what])), 1)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/call_overhead.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--rounds", type=int, default=15, help="rounds over all calls (default %(default)s)")
    args = p.parse_args(argv)
    from cukernels import cli, device

    if not device.gpu_available():
        return cli.no_gpu("python tools/call_overhead.py", "It times calls on a GPU (with torch installed); there is nothing to do here.")
    from tabulate import tabulate

    rows = _rows(args.rounds)
    print(tabulate(rows, headers="keys", tablefmt="github"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
