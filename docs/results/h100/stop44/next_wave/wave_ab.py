"""Scratch (stop 44): the TMA forward's next-wave L2 prefetch (api.PREFETCH_NEXT_WAVE) off / on, beside cuDNN;
interleaved rounds, held (L2 flushed), ratio to cuDNN per round then the median."""
import json, os
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention import api as _api
from attention.api import ForwardCall, validate
from cukernels import device, launch, timing

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
cases = [(64, 4, 1024, 8, 8), (64, 8, 1024, 8, 8), (64, 4, 2048, 8, 8), (64, 4, 1024, 8, 2), (128, 4, 1024, 8, 2),
         (128, 4, 2048, 8, 8), (256, 2, 1024, 4, 4), (64, 16, 2048, 16, 16), (128, 1, 8192, 32, 8)]
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for d, B, S, H, KVH in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt, kt, vt, enable_gqa=True).transpose(1, 2)
    prob = validate(q, k, v, causal=False, window=None, segment_ids=None, softmax_scale=None)
    plan = configs.plan_forward(prob, spec)
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    fns = {}
    for name, on in (("off", False), ("on", True)):
        _api.PREFETCH_NEXT_WAVE = on
        call = ForwardCall(q, k, v, prob, plan, None, None)
        o, _ = call(*ptrs, None)
        err = (o.float() - ref.float()).abs().max().item()
        assert err < 0.03, (name, err)
        fns[name] = (lambda call=call: call(*ptrs, None))
        fns[name + "_arg"] = int(call.main.args[-1]) if hasattr(call.main, "args") else None
    _api.PREFETCH_NEXT_WAVE = True
    waves = {k: fns.pop(k) for k in [k for k in fns if k.endswith("_arg")]}

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, enable_gqa=True)
    fns["cudnn"] = cudnn
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            us[n].append(timing.benchmark(f, budget_ms=100, min_samples=10).median_ms * 1e3)
    ratio = {n: float(np.median([us["cudnn"][r] / us[n][r] for r in range(ROUNDS)])) for n in fns}
    med = {n: float(np.median(x)) for n, x in us.items()}
    rows.append(dict(d=d, B=B, S=S, H=H, KVH=KVH, planned=str(plan.config), us=med, x_cudnn=ratio))
    print(f"d{d} B{B} S{S} H{H}/{KVH} ({str(plan.config)[13:-1]}): " +
          "  ".join(f"{n} {med[n]:.2f} ({ratio[n]:.3f})" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/wave_ab{'_fp16' if os.environ.get('FP16') else ''}.json", "w"), indent=1)
