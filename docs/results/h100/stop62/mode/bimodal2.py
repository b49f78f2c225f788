"""B8 L1k h16-16 d64 q1 contiguous decode: the two modes (~16.45 / ~17.4 us) per sample. Variants: ours with its
output dropped each call (one address) or kept until the next (two alternating), a host busy-wait of 20 / 60 / 150
us before the launch (a longer hold: the device idles behind the holding kernel), no L2 flush, no hold; SDPA cuDNN.
12 rotated rounds, 100 ms each; per timer call the median and the fraction of samples over 16.9 us (even / odd
sample index)."""
import time
import numpy as np, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
from attention import flash_attention_with_kvcache
from cukernels import timing
B, L, H, D = 8, 1024, 16, 64
tq = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
tk = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
tv = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
qh, kh, vh = tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2)
def cudnn():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(qh, kh, vh)
last = {}
def ours():
    return flash_attention_with_kvcache(tq, tk, tv, cache_seqlens=lens, check_values=False)
def ours_keep():
    last["o"] = ours()
def delayed(us):
    def f():
        t = time.perf_counter() + us * 1e-6
        while time.perf_counter() < t:
            pass
        return ours()
    return f
V = {"ours": (ours, {}), "ours_keep": (ours_keep, {}), "ours_wait20": (delayed(20), {}),
     "ours_wait60": (delayed(60), {}), "ours_wait150": (delayed(150), {}),
     "ours_noflush": (ours, dict(flush_l2=False)), "ours_nohold": (ours, dict(hold=False)),
     "cudnn": (cudnn, {})}
def cud_w60():
    t = time.perf_counter() + 60e-6
    while time.perf_counter() < t:
        pass
    return cudnn()
V["cudnn_wait60"] = (cud_w60, {})
names = list(V)
res = {n: [] for n in names}
for r in range(12):
    for n in names[r % len(names):] + names[:r % len(names)]:
        f, kw = V[n]
        t = timing.benchmark(f, budget_ms=100, rel_noise_target=0.0, min_samples=60, max_samples=200, **kw)
        a = np.array(t.times_ms) * 1e3
        res[n].append((t.median_ms * 1e3, np.mean(a[0::2] > 16.9), np.mean(a[1::2] > 16.9), t.clocks.get("held")))
print("variant        median us (over rounds)  frac>16.9 even/odd (median over rounds)  per-round medians")
for n in names:
    v = np.array([x[:3] for x in res[n]], dtype=float)
    print(f"{n:14s} {np.median(v[:, 0]):7.2f}  {np.median(v[:, 1]):.2f}/{np.median(v[:, 2]):.2f}  held {res[n][0][3]}  "
          f"{[round(x, 2) for x in v[:, 0]]}", flush=True)
