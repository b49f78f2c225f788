"""Split counts on the decode rows at the 1.0x edge (contiguous and page 16), torch cuDNN / flash beside, held
time with the L2 flushed, rotated rounds, one process."""
import json, sys
import numpy as np
import cupy
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from attention import flash_attention_with_kvcache
from attention.decode_bench import _paged
from cukernels import dtypes, timing, bench

import os
CASES = [(8, 1024, 16, 16, 64, 1, (None, 2, 3, 4)), (8, 1024, 16, 16, 64, 4, (None, 2, 3)),
         (64, 1024, 32, 8, 128, 1, (None, 2)), (1, 1024, 32, 8, 128, 1, (None, 4, 16)),
         (1, 1024, 16, 16, 64, 1, (None, 4, 16))]
if os.environ.get("PROBE") == "l1k":
    CASES = [(1, 1024, 32, 8, 128, 1, (None, 4, 2)), (1, 1024, 32, 8, 128, 4, (None, 4, 2)),
             (1, 1024, 32, 32, 128, 1, (None, 2, 8)), (1, 1024, 32, 32, 128, 4, (None, 2, 8)),
             (1, 1024, 16, 16, 64, 1, (None, 4, 2)), (1, 1024, 16, 16, 64, 4, (None, 4, 2)),
             (8, 1024, 32, 8, 128, 1, (None, 1, 4)), (8, 1024, 32, 8, 128, 4, (None, 1, 4))]
if os.environ.get("PROBE") == "b1long":
    CASES = [(1, 8192, 16, 16, 64, 1, (None, 16, 32)), (1, 32768, 16, 16, 64, 1, (None, 16, 32)),
             (1, 32768, 32, 32, 128, 1, (None, 8, 16)), (1, 8192, 32, 32, 128, 4, (None, 8, 16))]
rows = []
for (B, L, H, KVH, D, SQ, splits) in CASES:
    dt = dtypes.from_name("bf16")
    q = dtypes.random((B, SQ, H, D), dt, seed=1)
    k = cupy.empty((B, L, KVH, D), dtype=dt); v = cupy.empty_like(k)
    for b in range(B):
        k[b] = dtypes.random((L, KVH, D), dt, seed=10 + b); v[b] = dtypes.random((L, KVH, D), dt, seed=5000 + b)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    kp, vp, table = _paged({"k": k, "v": v}, 16, seed=16)
    kp2, vp2, table2 = _paged({"k": k, "v": v}, 256, seed=256)
    fns = {}
    ref = dtypes.to_float32(flash_attention_with_kvcache(q, k, v, cache_seqlens=lens))
    for s in splits:
        for name, kk, vv, tt in (("contig", k, v, None), ("p16", kp, vp, table), ("p256", kp2, vp2, table2)):
            f = (lambda kk=kk, vv=vv, tt=tt, s=s: flash_attention_with_kvcache(q, kk, vv, cache_seqlens=lens,
                 block_table=tt, num_splits=s, check_values=False))
            err = float(cupy.abs(dtypes.to_float32(f()) - ref).max())
            assert err < 1e-2, (B, L, s, name, err)
            fns[f"{name}/s{s or 'plan'}"] = f
    tq, tk, tv = (dtypes.like_input(x, True).transpose(1, 2) for x in (q, k, v))
    for be in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        def run(be=be):
            with bench.torch_on_cupy_stream(), sdpa_kernel(getattr(SDPBackend, be)):
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=H != KVH)
        run()
        fns[be.split("_")[0].lower()] = run
    names = list(fns); med = {n: [] for n in names}
    for r in range(5):
        for n in names[r % len(names):] + names[:r % len(names)]:
            med[n].append(timing.benchmark(fns[n], budget_ms=100).median_ms * 1e3)
    res = {n: float(np.median(m)) for n, m in med.items()}
    best = min(res["cudnn"], res["flash"])
    case = f"B{B} L{L} H{H}/{KVH} D{D} q{SQ}"
    rows.append({"case": case, "us": res, "rounds": med})
    print(case, f"best torch {best:.2f}", "  ".join(f"{n} {res[n]:.2f} ({best / res[n]:.3f}x)" for n in names if n not in ("cudnn", "flash")), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
