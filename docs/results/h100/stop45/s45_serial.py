"""Scratch (s45_ab, from m64_ab): one-consumer 64-row tiles vs planned; head-dim-64 non-causal forward configs, interleaved rounds (the clock drifts over a run: every round
times every variant and cuDNN back to back; ratios to cuDNN per round, then the median over rounds). Held cold."""
import json, os, sys
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention.api import ForwardCall, validate
from cukernels import tiling, device, launch, timing

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
T = configs.FwdTmaConfig
cases = [(64, 4, 1024, 8, 8, False), (64, 8, 1024, 8, 8, False), (64, 16, 2048, 16, 16, False),
         (128, 4, 1024, 8, 2, False), (128, 4, 2048, 8, 8, False), (128, 1, 8192, 16, 16, False), (128, 4, 1024, 8, 2, True)]
if os.environ.get("ONLY"):
    cases = [c for c in cases if c[0] == int(os.environ["ONLY"])]
SER = ("-DFWD_SERIAL",)
V64 = {"m64 ser": (T(head_dim=64, block_n=128, stages=2, consumers=1, pingpong=False), SER),
       "m192 ser": (T(head_dim=64, block_n=128, stages=3, consumers=3), SER),
       "pers s2 pp": (T(head_dim=64, block_n=128, stages=2, pingpong=True, persistent=True), ()),
       "pers s2 pp ser": (T(head_dim=64, block_n=128, stages=2, pingpong=True, persistent=True), SER),
       "pers s3 pp ser": (T(head_dim=64, block_n=128, stages=3, pingpong=True, persistent=True), SER)}
V128 = {"pers ser": (T(head_dim=128, block_n=128, stages=2, pingpong=True, persistent=True), SER),
        "one s2 pp ser": (T(head_dim=128, block_n=128, stages=2, pingpong=True), SER)}
from attention import api as _api
_orig = _api._compile.kernel
CUR = [()]
def _patched(src, name, *, options=()):
    if "flash_fwd_tma" in name:
        options = tuple(options) + CUR[0]
    return _orig(src, name, options=options)
_api._compile.kernel = _patched
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
    variants = V64 if d == 64 else V128
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    planned = configs.plan_forward(prob, spec).config
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    fns = {}
    for name, (c, opts) in [("planned", (planned, ()))] + list(variants.items()):
        if (causal and c.consumers == 3 and not c.persistent) or (name != "planned" and c == planned and not opts):
            continue
        CUR[0] = opts
        plan = tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=0, reason="ab")
        call = ForwardCall(q, k, v, prob, plan, None, None)
        o, _ = call(*ptrs, None)
        err = (o.float() - ref.float()).abs().max().item()
        assert err < 0.02, (name, err)
        fns[name] = (lambda call=call: call(*ptrs, None))
    CUR[0] = ()
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
    med = {n: float(np.median(x)) for n, x in us.items()}
    row = dict(do_bench_us=db, d=d, B=B, S=S, H=H, KVH=KVH, causal=causal, planned=str(planned), us=med, x_cudnn=ratio)
    rows.append(row)
    print(f"d{d} B{B} S{S} H{H}/{KVH} {'causal' if causal else 'full'} (planned {str(planned)[13:-1]}): " +
          "  ".join(f"{n} {med[n]:.1f} ({ratio[n]:.3f}; do_bench {db[n]:.1f})" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/s45_serial{os.environ.get('TAG', '')}.json", "w"), indent=1)
