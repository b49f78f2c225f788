"""fwd+bwd as the bench times it (ours: flash_attention(return_lse) + flash_attention_backward; cuDNN: SDPA +
autograd.grad), per-kernel device time by torch.profiler, and held time by cukernels.timing / triton do_bench."""
import os, sys, collections
import torch
import attention
from attention import backward
from cukernels import timing
from torch.nn.attention import sdpa_kernel, SDPBackend
import triton.testing

SHAPES = [tuple(int(x) for x in s.split("x")) for s in os.environ.get("SHAPES", "16x2048x8x8,1x4096x32x8").split(",")]
D = 128
causal = bool(int(os.environ.get("CAUSAL", "0")))
dt = torch.float16 if os.environ.get("DT") == "fp16" else torch.bfloat16
N = 20
for (B, S, H, KVH) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, S, H, D, device="cuda", dtype=dt, generator=g)
    k = torch.randn(B, S, KVH, D, device="cuda", dtype=dt, generator=g)
    v = torch.randn_like(k); do = torch.randn_like(q)
    def ours():
        o, lse = attention.flash_attention(q, k, v, causal=causal, return_lse=True)
        return backward.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
    def ours_fwd():
        return attention.flash_attention(q, k, v, causal=causal, return_lse=True)
    def ours_fwd_nolse():
        return attention.flash_attention(q, k, v, causal=causal)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2)
    def cud():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=KVH != H)
            return torch.autograd.grad(out, (qt, kt, vt), dot)
    print(f"== B{B} S{S} H{H}/{KVH} causal={causal} {dt}")
    for name, fn in (("ours", ours), ("cudnn", cud), ("ours_fwd_lse", ours_fwd), ("ours_fwd", ours_fwd_nolse)):
        for _ in range(5): fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(N): fn()
            torch.cuda.synchronize()
        agg = collections.defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                agg[e.name[:70]] += e.device_time / N
        held = timing.benchmark(fn, budget_ms=300).median_ms * 1e3
        nof = timing.benchmark(fn, budget_ms=300, flush_l2=False).median_ms * 1e3
        tdb = triton.testing.do_bench(fn, rep=300) * 1e3
        print(f"  {name}: kernels {sum(agg.values()):.0f} us, held {held:.0f} (no flush {nof:.0f}), do_bench {tdb:.0f}")
        for kname, us in sorted(agg.items(), key=lambda x: -x[1]):
            print(f"      {us:8.1f}  {kname}")
    sys.stdout.flush()
