"""Where the held timer's round-to-round spread comes from: one call timed by cukernels.timing.benchmark with
hold on/off x L2 flush on/off, in interleaved rounds, beside CUPTI kernel time of back-to-back calls."""
import os, sys, collections
import numpy as np
import torch
import cupy as cp
import attention
from attention import backward
from cukernels import timing

ROUNDS = int(os.environ.get("ROUNDS", "6"))
B, S, H, D = 16, 2048, 8, 128
causal = False
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn_like(q); v = torch.randn_like(q); do = torch.randn_like(q)
o, lse = attention.flash_attention(q, k, v, causal=causal, return_lse=True)
bwd = lambda: backward.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
q2 = torch.randn(16, 2048, 16, 64, device="cuda", dtype=torch.bfloat16, generator=g)
k2 = torch.randn_like(q2); v2 = torch.randn_like(q2)
fwd = lambda: attention.flash_attention(q2, k2, v2, causal=True)
print("streams: cupy", cp.cuda.get_current_stream().ptr, "torch", torch.cuda.current_stream().cuda_stream)

def cupti(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / n / 1e3

for name, fn in (("bwd hb125m", bwd), ("fwd seed004_a causal", fwd)):
    modes = {"hold+flush": (True, True), "hold": (True, False), "flush": (False, True), "plain": (False, False)}
    res = collections.defaultdict(list)
    for r in range(ROUNDS):
        order = list(modes) + ["cupti"]
        order = order[r % len(order):] + order[:r % len(order)]
        for m in order:
            if m == "cupti":
                res[m].append((cupti(fn), 0.0, ""))
                continue
            hold, flush = modes[m]
            t = timing.benchmark(fn, budget_ms=200, warmup_ms=20, hold=hold, flush_l2=flush)
            c = t.clocks
            res[m].append((t.median_ms, t.rel_noise, f"{c.get('sm_clock_min_mhz')}-{c.get('sm_clock_max_mhz')} MHz {c.get('power_max_w')} W thr={c.get('throttled')}"))
    print(f"== {name}")
    for m, xs in res.items():
        meds = [x[0] * 1e3 for x in xs]
        print(f"  {m:11s} median of rounds {np.median(meds):8.1f} us  rounds {[round(x) for x in meds]}  noise {[round(x[1]*100,1) for x in xs]}")
        print("              clocks", [x[2] for x in xs])
    sys.stdout.flush()
