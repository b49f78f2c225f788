"""B8 L1k h16-16 d64 contiguous decode (q1, q4): our planned call, forced splits, forced rings, against torch SDPA
cuDNN / flash on the same data; held timer, 7 rotated rounds."""

import numpy as np, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
from attention import flash_attention_with_kvcache, kvcache, decode_configs as dc
from cukernels import timing
orig = dc.search_space
for SQ in (1, 4):
    B, L, H, KVH, D = 8, 1024, 16, 16, 64
    tq = torch.randn(B, SQ, H, D, device="cuda", dtype=torch.bfloat16)
    tk = torch.randn(B, L, KVH, D, device="cuda", dtype=torch.bfloat16)
    tv = torch.randn(B, L, KVH, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    qh, kh, vh = tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2)
    fns = {}
    def ours(splits=None, ring=None):
        if ring is not None:
            dc.search_space = lambda *a, **kw: [dc.DecodeConfig(head_dim=D, warps=ring[0], stages=ring[1])] + orig(*a, **kw)
        kvcache._CACHE.clear()
        try:
            flash_attention_with_kvcache(tq, tk, tv, cache_seqlens=lens, num_splits=splits, check_values=False)
            call = next(iter(kvcache._CACHE._entries.values()))
        finally:
            dc.search_space = orig
        ptrs = [tq.data_ptr(), tk.data_ptr(), tv.data_ptr(), 0, 0, 0, 0, lens.data_ptr(), 0, 0, 0, 0]
        return (lambda: call(ptrs, False, lens, None)), f"{call.config} x{call.splits} cl{call.cluster}"
    for name, kw in (("planned", {}), ("w4s6", dict(ring=(4, 6))), ("w4s8", dict(ring=(4, 8))),
                     ("w2s8", dict(ring=(2, 8))), ("w8s6", dict(ring=(8, 6))), ("w2s4", dict(ring=(2, 4)))):
        fns[name] = ours(**kw)
    from cukernels import launch as _launch
    def nopdl(f):
        def g():
            _launch.PDL[0] = False
            try:
                return f()
            finally:
                _launch.PDL[0] = True
        return g

    def sdpa(backend):
        def f():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qh, kh, vh)
        return f
    ref = sdpa(SDPBackend.FLASH_ATTENTION)().transpose(1, 2).float()
    for n, (f, desc) in fns.items():
        o = f()[0]
        err = (torch.as_tensor(o, device="cuda").float() - ref).abs().max().item() if isinstance(o, torch.Tensor) else float("nan")
        print(f"q{SQ} {n:10s} {desc:40s} max err vs flash {err:.2e}", flush=True)
    fns["cudnn"] = (sdpa(SDPBackend.CUDNN_ATTENTION), "")
    fns["flash"] = (sdpa(SDPBackend.FLASH_ATTENTION), "")
    names = list(fns); res = {n: [] for n in names}
    for r in range(9):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append(timing.benchmark(fns[n][0], budget_ms=150).median_ms * 1e3)
    best = min(np.median(res["cudnn"]), np.median(res["flash"]))
    print(f"== B8 L1k h16-16 d64 q{SQ}: held us, median of 9 rotated rounds; faster torch / impl")
    for n in names:
        m = np.median(res[n]); print(f"   {n:10s} {m:7.2f}  {best / m:.3f}  {[round(x, 2) for x in res[n]]}", flush=True)
