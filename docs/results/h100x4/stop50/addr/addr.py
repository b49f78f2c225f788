"""Scratch (stop 50): is ours bimodal by buffer placement on seed004_a causal (B16 S2048 H16 d64)? N input sets at
different addresses (padding allocations between), ours (public API) and cuDNN interleaved per set, held, L2 flushed."""
import os, json
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import attention
from cukernels import timing
F = torch.nn.functional.scaled_dot_product_attention
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
B, S, H, D = (int(x) for x in os.environ.get("SHAPE", "16,2048,16,64").split(","))
N, ROUNDS = int(os.environ.get("N", "6")), int(os.environ.get("ROUNDS", "3"))
rng = np.random.default_rng(int(os.environ.get("SEED", "1")))
sets, keep = [], []
for i in range(N):
    keep.append(torch.empty(int(rng.integers(1, 64)) * (1 << 20) + int(rng.integers(0, 512)) * 4096, dtype=torch.uint8, device="cuda"))
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=DT) for _ in range(3))
    sets.append((q, k, v))
rows = []
for i, (q, k, v) in enumerate(sets):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    def ours(q=q, k=k, v=v): return attention.flash_attention(q, k, v, causal=True)
    def cudnn(qt=qt, kt=kt, vt=vt):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, is_causal=True)
    o = ours(); ref = cudnn().transpose(1, 2)
    err = (o.float() - ref.float()).abs().max().item()
    t = {"ours": [], "cudnn": []}
    for r in range(ROUNDS):
        for n, f in (("ours", ours), ("cudnn", cudnn)):
            t[n].append(timing.benchmark(f, budget_ms=60, min_samples=10).median_ms * 1e3)
    # ours again into a fresh output buffer at another address (o from a second allocation)
    row = dict(set=i, q=hex(q.data_ptr()), k=hex(k.data_ptr()), v=hex(v.data_ptr()), o=hex(o.data_ptr()),
               ours=t["ours"], cudnn=t["cudnn"], err=err)
    rows.append(row)
    print(f"set {i} q {q.data_ptr() % (1 << 30):#x} k {k.data_ptr() % (1 << 30):#x} o {o.data_ptr() % (1 << 30):#x}: ours "
          + " ".join(f"{x:.1f}" for x in t["ours"]) + "  cudnn " + " ".join(f"{x:.1f}" for x in t["cudnn"])
          + f"  ratio {np.median(t['cudnn']) / np.median(t['ours']):.3f} err {err:.1e}", flush=True)
json.dump(rows, open(os.environ.get("OUT", "/tmp") + f"/addr{os.environ.get('TAG', '')}.json", "w"), indent=1)
