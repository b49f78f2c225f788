"""Stop 57 probe (see stream_probe.cu): TB/s of streaming 8 experts' up weights (E64 top-8 shape: 2816 x 2048 bf16
per expert, items of 32 rows) with the L2 flushed before each kernel, CUDA events, median of 15."""
from pathlib import Path

import cupy
import numpy as np

from cukernels import compile as _compile
from cukernels import timing

SRC = Path(__file__).with_name("stream_probe.cu")
E, N, K, BN = 64, 2816, 2048, 32
w = cupy.arange(E * N * K, dtype=cupy.uint32).astype(cupy.uint16)  # not all zeros
rng = np.random.default_rng(0)
experts = cupy.asarray(np.sort(rng.choice(E, 8, replace=False)).astype(np.int32))
nb = N // BN
items = 8 * nb
nbytes = items * BN * K * 2
out = cupy.zeros(264 * 256, dtype=cupy.uint32)
variants = [("regs U=4 (skinny's)", "regs_stream<4>", 0), ("regs U=8", "regs_stream<8>", 0),
            ("regs U=2", "regs_stream<2>", 0),
            ("bulk 4 x 16 KB", "bulk_stream<4, 16384>", 4 * 16384), ("bulk 6 x 16 KB", "bulk_stream<6, 16384>", 6 * 16384),
            ("bulk 3 x 32 KB", "bulk_stream<3, 32768>", 3 * 32768), ("bulk 8 x 8 KB", "bulk_stream<8, 8192>", 8 * 8192),
            ("plain U=4", "plain_stream<4>", 0), ("plain U=8", "plain_stream<8>", 0)]
kerns = {}
for label, name, smem in variants:
    k = _compile.kernel(SRC, name)
    if smem:
        k.reserve_smem(smem)
    kerns[label] = (k, smem)
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), f"{nbytes / 1e6:.1f} MB per run, {items} items")
res = {}
for grid in (264, 132):
    for label, (k, smem) in kerns.items():
        ts = []
        for _ in range(15):
            timing.flush_l2()
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            k.launch((grid,), (256,), (w, experts, np.int32(items), np.int32(nb), np.int32(N), np.int32(K), out),
                     smem=smem)
            b.record()
            b.synchronize()
            ts.append(cupy.cuda.get_elapsed_time(a, b) * 1e3)
        t = float(np.median(ts))
        res[(grid, label)] = t
        print(f"grid {grid:3d}  {label:22s} {t:8.2f} us  {nbytes / t / 1e6:6.3f} TB/s")
