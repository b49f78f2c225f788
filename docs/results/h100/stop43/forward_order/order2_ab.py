"""Scratch (order2_ab, stop 43): the small non-causal forward grids with the tiles in launch order by query tile
across heads (by_weight for one tile per CTA; the persistent grid's by-weight order without a mask), and a
three-stage ring for the 64-row tile. Every variant and cuDNN in each of ROUNDS interleaved rounds, held (L2
flushed), ratio to cuDNN per round then the median; do_bench once at the end.

Kept as run on 2026-11-26 (stop 43). Sets: default (small non-causal + two causal), CAUSAL_SET=1, BIG_CAUSAL=1,
D128_STAGES=1. Two variant sets needed temporary switches that were taken out after the runs (docs/perf/attention.md
v3.6): RESHAPE_AB=1 (attention.api._RESHAPE, the division build of the by-weight order) and ORDER_GROUPS=shares (the
kernel's grouped by-weight order: by_weight = group size); on main they fail or run the plain by-weight order."""
import dataclasses, json, os
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention import api as _api
from attention.api import ForwardCall, validate
from cukernels import tiling, device, launch, timing

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
T = configs.FwdTmaConfig
ORDER = [None]
_orig_order = _api.tile_order
_api.tile_order = lambda *a: _orig_order(*a) if ORDER[0] is None else ORDER[0]
cases = [(64, 4, 1024, 8, 8, False), (64, 2, 1024, 8, 8, False), (64, 8, 1024, 8, 8, False), (64, 4, 2048, 8, 8, False),
         (128, 4, 1024, 8, 2, False), (128, 8, 1024, 8, 2, False), (128, 4, 2048, 8, 8, False),
         (64, 4, 1024, 8, 8, True), (128, 4, 1024, 8, 2, True)]
if os.environ.get("CAUSAL_SET"):
    cases = [(64, 4, 1024, 8, 8, True), (64, 8, 1024, 8, 8, True), (64, 2, 2048, 8, 8, True), (64, 4, 2048, 8, 8, True),
             (64, 1, 4096, 16, 16, True), (64, 16, 1024, 16, 16, True), (64, 2, 4096, 8, 8, True),
             (128, 2, 2048, 8, 8, True), (128, 1, 4096, 32, 8, True), (128, 8, 1024, 16, 16, True), (128, 4, 1024, 8, 2, True)]
if os.environ.get("BIG_CAUSAL"):
    cases = [(64, 16, 1024, 16, 16, True), (64, 16, 2048, 16, 16, True), (64, 8, 2048, 16, 16, True),
             (64, 4, 4096, 16, 16, True), (64, 32, 1024, 16, 16, True), (64, 16, 2048, 16, 16, False)]
if os.environ.get("D128_STAGES"):
    cases = [(128, 4, 1024, 8, 2, False), (128, 8, 1024, 8, 2, False), (128, 4, 2048, 8, 8, False),
             (128, 1, 4096, 32, 8, False), (128, 4, 4096, 16, 8, False), (128, 4, 1024, 8, 2, True)]
if os.environ.get("ONLY"):
    cases = [c for c in cases if c[0] == int(os.environ["ONLY"])]
M64 = T(head_dim=64, block_n=128, stages=2, consumers=1, pingpong=False)
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    planned = configs.plan_forward(prob, spec).config
    if os.environ.get("ORDER_GROUPS"):
        pair = S * d * 4 // (H // KVH)
        groups = {f"g{share}": max(1, int(float(share) * spec.l2_bytes // pair)) for share in os.environ["ORDER_GROUPS"].split(",")}
        cfg = planned
        variants = [("planned", planned, None), ("hw", cfg, 0), ("all", cfg, B * H)] + [
            (f"{n}={g}", cfg, min(g, B * H)) for n, g in groups.items()]
    elif os.environ.get("RESHAPE_AB"):
        variants = [("planned", planned, None), ("divs", planned, "divs"), ("hw", planned, False)]
    elif d == 64 and causal:
        variants = [("planned", planned, None), ("m64 mm", M64, True), ("m64 hw", M64, False),
                    ("m128 one mm", T(head_dim=64, block_n=128, stages=2), True),
                    ("m128 one hw", T(head_dim=64, block_n=128, stages=2), False),
                    ("m128 nopp hw", T(head_dim=64, block_n=128, stages=2, pingpong=False), False),
                    ("m128 pers hw", T(head_dim=64, block_n=128, stages=2, pingpong=False, persistent=True), False),
                    ("m128 pers mm", T(head_dim=64, block_n=128, stages=2, pingpong=False, persistent=True), True)]
    elif d == 64:
        variants = [("planned", planned, None), ("m64 mm", M64, True), ("m64 s3", dataclasses.replace(M64, stages=3), False),
                    ("m64 s3 mm", dataclasses.replace(M64, stages=3), True), ("m64 hw", M64, False)]
    elif os.environ.get("D128_STAGES"):
        variants = [("planned", planned, None)] + [
            (f"pers n{n} s{st}", T(head_dim=d, block_n=n, stages=st, persistent=True), False)
            for n, st in ((64, 3), (64, 4), (64, 2))] + [
            (f"one n{n} s{st}", T(head_dim=d, block_n=n, stages=st), False) for n, st in ((64, 3), (128, 3))]
    else:
        p2 = T(head_dim=d, block_n=128, stages=2, persistent=True)
        o2 = T(head_dim=d, block_n=128, stages=2)
        variants = [("planned", planned, None), ("pers hw", p2, False), ("pers mm", p2, True), ("one hw", o2, False), ("one mm", o2, True)]
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    fns = {}
    for name, c, order in variants:
        _api._RESHAPE[0] = order != "divs"
        ORDER[0] = True if order == "divs" else order
        plan = tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=0, reason="ab")
        try:
            call = ForwardCall(q, k, v, prob, plan, None, None)
            o, _ = call(*ptrs, None)
        except Exception as e:
            print(name, "failed:", str(e)[:200]); continue
        err = (o.float() - ref.float()).abs().max().item()
        assert err < 0.02, (name, err)
        fns[name] = (lambda call=call: call(*ptrs, None))
    ORDER[0] = None
    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, is_causal=causal, enable_gqa=True)
    fns["cudnn"] = cudnn
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            us[n].append(timing.benchmark(f, budget_ms=100, min_samples=10).median_ms * 1e3)
    from triton.testing import do_bench
    db = {n: do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3 for n, f in fns.items()}
    ratio = {n: float(np.median([us["cudnn"][r] / us[n][r] for r in range(ROUNDS)])) for n in fns}
    med = {n: float(np.median(x)) for n, x in us.items()}
    rows.append(dict(do_bench_us=db, d=d, B=B, S=S, H=H, KVH=KVH, causal=causal, planned=str(planned), us=med, x_cudnn=ratio))
    print(f"d{d} B{B} S{S} H{H}/{KVH} {'causal' if causal else 'full'} (planned {str(planned)[13:-1]}): " +
          "  ".join(f"{n} {med[n]:.1f} ({ratio[n]:.3f}; db {db[n]:.1f})" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/order2_ab{'_fp16' if os.environ.get('FP16') else ''}.json", "w"), indent=1)
