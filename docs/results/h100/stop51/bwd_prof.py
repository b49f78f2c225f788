"""Per-kernel device time of the backward (ours: preprocess, dK/dV(+dQ), dQ convert; cuDNN's kernels) on shapes
of equal FLOPs, d128 non-causal, via torch.profiler (CUPTI), back-to-back calls."""
import os, sys, collections
import torch
import attention
from attention import backward
from torch.nn.attention import sdpa_kernel, SDPBackend

SHAPES = [(16, 2048, 8, 8), (4, 4096, 8, 8), (1, 8192, 8, 8), (64, 1024, 8, 8), (1, 4096, 32, 8), (16, 2048, 8, 2)]
if os.environ.get("SHAPES"):
    SHAPES = [tuple(int(x) for x in s.split("x")) for s in os.environ["SHAPES"].split(",")]
D = 128
causal = bool(int(os.environ.get("CAUSAL", "0")))
dt = torch.float16 if os.environ.get("DT") == "fp16" else torch.bfloat16
N = 20
for (B, S, H, KVH) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, S, H, D, device="cuda", dtype=dt, generator=g)
    k = torch.randn(B, S, KVH, D, device="cuda", dtype=dt, generator=g)
    v = torch.randn_like(k); do = torch.randn_like(q)
    o, lse = attention.flash_attention(q, k, v, causal=causal, return_lse=True)
    ours = lambda: backward.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    if KVH != H:
        kt2 = lambda x: x.repeat_interleave(H // KVH, dim=1)
    else:
        kt2 = lambda x: x
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ot = torch.nn.functional.scaled_dot_product_attention(qt, kt2(kt), kt2(vt), is_causal=causal, enable_gqa=False)
    dot = do.transpose(1, 2)
    cud = lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)
    res = {}
    for name, fn in (("ours", ours), ("cudnn", cud)):
        for _ in range(5): fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(N): fn()
            torch.cuda.synchronize()
        agg = collections.defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                agg[e.name[:60]] += e.device_time / N if hasattr(e, "device_time") else e.cuda_time / N
        res[name] = agg
    flops = 4 * B * H * S * S * D * 2.5 / (2 if causal else 1)
    print(f"B{B} S{S} H{H}/{KVH}: " + " | ".join(f"{n} total {sum(a.values()):.0f} us" for n, a in res.items()))
    for n, a in res.items():
        for kname, us in sorted(a.items(), key=lambda x: -x[1]):
            print(f"    {n:6s} {us:8.1f}  {kname}")
    sys.stdout.flush()
