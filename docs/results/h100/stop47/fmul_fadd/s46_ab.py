"""Scratch (stop 46): forward variants (VARIANTS="name=path,..." sources of flash_fwd_tma.cu; "new" = the tree)
against HEAD's sources (scratch/old46) with the same planned config, cuDNN beside; interleaved rounds, held with the
L2 flushed; ratios to cuDNN per round, median over rounds; do_bench medians too."""
import json, os
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention.api import ForwardCall, validate
from attention import api as _api
from cukernels import device, launch, timing

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
VARIANTS = {"new": None, "old": "scratch/old46/flash_fwd_tma.cu"}
for item in filter(None, os.environ.get("VARIANTS", "").split(",")):
    n, p = item.split("=")
    VARIANTS[n] = p
_orig = _api._compile.kernel
CUR = [None]
def _patched(src, name, *, options=()):
    if "flash_fwd_tma" in name and CUR[0] is not None:
        src = CUR[0]
    return _orig(src, name, options=options)
_api._compile.kernel = _patched
cases = [(64, 4, 1024, 8, 8, False), (64, 8, 1024, 8, 8, False), (64, 2, 1024, 8, 8, False), (64, 16, 2048, 16, 16, False),
         (64, 4, 1024, 8, 8, True), (128, 4, 1024, 8, 2, False), (128, 4, 2048, 8, 8, False), (128, 1, 8192, 16, 16, False),
         (128, 4, 1024, 8, 2, True), (256, 2, 1024, 4, 4, False), (256, 2, 4096, 8, 8, True)]
if os.environ.get("ONLY"):
    cases = [c for c in cases if c[0] == int(os.environ["ONLY"])]
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt.float(), kt.float(), vt.float(), is_causal=causal, enable_gqa=True).transpose(1, 2)
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    plan = configs.plan_forward(prob, spec)
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    fns = {}
    for name, src in VARIANTS.items():
        CUR[0] = src
        call = ForwardCall(q, k, v, prob, plan, None, None)
        o, _ = call(*ptrs, None)
        err = (o.float() - ref).abs().max().item()
        assert err < 0.02, (name, err)
        fns[name] = (lambda call=call: call(*ptrs, None))
    CUR[0] = None
    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, is_causal=causal, enable_gqa=True)
    fns["cudnn"] = cudnn
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            us[n].append(timing.benchmark(f, budget_ms=120, min_samples=10).median_ms * 1e3)
    from triton.testing import do_bench
    db = {n: do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3 for n, f in fns.items()}
    ratio = {n: float(np.median([us["cudnn"][r] / us[n][r] for r in range(ROUNDS)])) for n in fns}
    gain = {n: float(np.median([us["old"][r] / us[n][r] for r in range(ROUNDS)])) for n in VARIANTS}
    med = {n: float(np.median(x)) for n, x in us.items()}
    rows.append(dict(do_bench_us=db, d=d, B=B, S=S, H=H, KVH=KVH, causal=causal, planned=str(plan.config), us=med,
                     x_cudnn=ratio, over_old=gain, dtype=str(DT)))
    print(f"d{d} B{B} S{S} H{H}/{KVH} {'causal' if causal else 'full'} ({str(plan.config)[13:-1]}): "
          + " ".join(f"{n} {med[n]:.1f} ({ratio[n]:.3f}, {gain[n]:.3f})" for n in VARIANTS)
          + f" cudnn {med['cudnn']:.1f} | do_bench " + "/".join(f"{db[n]:.1f}" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/s46_ab{os.environ.get('TAG', '')}.json", "w"), indent=1)
