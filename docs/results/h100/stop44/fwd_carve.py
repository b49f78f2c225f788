"""Scratch (stop 44): the small non-causal forward grids with the TMA kernels' preferred shared-memory carveout
unset (-1) or set (CARVES), beside cuDNN; interleaved rounds, held (L2 flushed), ratio per round then median."""
import json, os
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention.api import ForwardCall, validate
from cukernels import device, launch, timing
from cukernels import compile as _compile

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
cases = [(64, 4, 1024, 8, 8, False), (128, 4, 1024, 8, 2, False), (64, 4, 2048, 8, 8, False), (128, 4, 2048, 8, 8, False),
         (64, 4, 1024, 8, 8, True)]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
CARVES = [int(x) for x in os.environ.get("CARVES", "-1,100,0").split(",")]
_carved = [None]


def carve(cv):
    if _carved[0] == cv:
        return
    for k in list(_compile._cache.values()):
        if "flash_fwd" in k.name_expression:
            k._raw.preferred_shared_memory_carveout = cv
    _carved[0] = cv


rows = []
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    planned = configs.plan_forward(prob, spec)
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    call = ForwardCall(q, k, v, prob, planned, None, None)
    o, _ = call(*ptrs, None)
    err = (o.float() - ref.float()).abs().max().item()
    assert err < 0.02, err
    fns = {}
    for cv in CARVES:
        def run(cv=cv):
            carve(cv)
            return call(*ptrs, None)
        fns[f"carve{cv}"] = run

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, is_causal=causal, enable_gqa=True)
    fns["cudnn"] = cudnn
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            f()
            us[n].append(timing.benchmark(f, budget_ms=100, min_samples=10).median_ms * 1e3)
    carve(-1)
    ratio = {n: float(np.median([us["cudnn"][r] / us[n][r] for r in range(ROUNDS)])) for n in fns}
    med = {n: float(np.median(x)) for n, x in us.items()}
    rows.append(dict(d=d, B=B, S=S, H=H, KVH=KVH, causal=causal, planned=str(planned.config), us=med, x_cudnn=ratio))
    print(f"d{d} B{B} S{S} H{H}/{KVH} {'causal' if causal else 'full'} ({str(planned.config)[13:-1]}): " +
          "  ".join(f"{n} {med[n]:.2f} ({ratio[n]:.3f})" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/fwd_carve.json", "w"), indent=1)
