"""Per-kernel device time of forward + backward through autograd: ours vs torch SDPA (cuDNN, flash).
env: SHAPE=B,S,H,D  CAUSAL=0/1  DTYPES=bf16,fp16  ITERS"""
import os, sys, collections
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity
import attention.torch as at

B, S, H, D = (int(x) for x in os.environ.get("SHAPE", "16,2048,8,128").split(","))
causal = os.environ.get("CAUSAL", "0") == "1"
iters = int(os.environ.get("ITERS", "10"))
dts = {"bf16": torch.bfloat16, "fp16": torch.float16}

def run_ours(q, k, v, do):
    o = at.flash_attention(q, k, v, causal=causal)
    torch.autograd.grad(o, (q, k, v), do)

def make_sdpa(backend):
    def f(q, k, v, do):
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        torch.autograd.grad(o, (q, k, v), do.transpose(1, 2))
    return f

for dn in os.environ.get("DTYPES", "bf16,fp16").split(","):
    dt = dts[dn]
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn(B, S, H, D, device="cuda", dtype=dt)
    for name, fn in (("ours", run_ours), ("cudnn", make_sdpa(SDPBackend.CUDNN_ATTENTION)),
                     ("flash", make_sdpa(SDPBackend.FLASH_ATTENTION))):
        if name not in os.environ.get("ONLY", "ours,cudnn,flash").split(","):
            continue
        for _ in range(int(os.environ.get("WARM", "3"))):
            fn(q, k, v, do)
        torch.cuda.synchronize()
        if os.environ.get("NOPROF"):
            fn(q, k, v, do); torch.cuda.synchronize(); continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn(q, k, v, do)
            torch.cuda.synchronize()
        tot = collections.defaultdict(float); cnt = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot[e.name] += e.device_time; cnt[e.name] += 1
        total = sum(tot.values()) / iters
        print(f"== {dn} {name} B{B} S{S} H{H} D{D} causal={causal}: device sum {total:.1f} us/iter")
        for n, t in sorted(tot.items(), key=lambda x: -x[1]):
            print(f"   {t/iters:9.1f} us  x{cnt[n]/iters:.0f}  {n[:150]}")
    sys.stdout.flush()
