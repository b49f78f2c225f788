"""Scratch (stop 45): the grouped GEMM with its wgmma descriptors in uniform registers (this tree) against c18f3eb's
sources (scratch/old45moe), the planned tile of each case, cuBLAS / torch._grouped_mm beside; interleaved rounds,
held with the L2 flushed; do_bench medians too."""
import importlib, json, os
from pathlib import Path
import numpy as np
import torch
from moe import launch as mlaunch
from cukernels import timing
gg = importlib.import_module("moe.grouped_gemm")
OUT = os.environ.get("OUT", "/tmp")
OLD = Path("scratch/old45moe/grouped_gemm.cu").resolve()
_orig = mlaunch.kernel
CUR = [None]
mlaunch.kernel = lambda source, name: _orig(CUR[0] if CUR[0] is not None else source, name)
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for E, M, N, K in ((1, 8192, 11008, 4096), (8, 8192, 11008, 4096), (32, 8192, 11008, 4096), (8, 2048, 4096, 4096)):
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64
    off = torch.tensor([M * i // E for i in range(E + 1)], device="cuda", dtype=torch.int32)
    fns, outs = {}, {}
    for name, src in (("new", None), ("old", OLD)):
        CUR[0] = src
        call = gg._validated(a, b, off, None, None, None, None)
        outs[name] = call(a.data_ptr(), b.data_ptr(), off.data_ptr(), 0)
        fns[name] = (lambda call=call: call(a.data_ptr(), b.data_ptr(), off.data_ptr(), 0))
    CUR[0] = None
    cfg = str(call.config) if hasattr(call, "config") else "?"
    assert torch.equal(outs["new"], outs["old"]), "new and old outputs differ"
    if E == 1:
        fns["cublas"] = lambda: a @ b[0].T
    else:
        offs = off[1:].contiguous()
        fns["grouped_mm"] = lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            us[n].append(timing.benchmark(f, budget_ms=200, min_samples=10).median_ms * 1e3)
    from triton.testing import do_bench
    db = {n: do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3 for n, f in fns.items()}
    base = "cublas" if E == 1 else "grouped_mm"
    gain = float(np.median([us["old"][r] / us["new"][r] for r in range(ROUNDS)]))
    ratio = {n: float(np.median([us[base][r] / us[n][r] for r in range(ROUNDS)])) for n in fns}
    med = {n: float(np.median(x)) for n, x in us.items()}
    tf = {n: 2 * M * N * K / (med[n] * 1e-6) / 1e12 for n in med}
    rows.append(dict(E=E, M=M, N=N, K=K, config=cfg, us=med, do_bench_us=db, old_over_new=gain, x_base=ratio, tflops=tf))
    print(f"E{E} M{M} N{N} K{K} ({cfg}): new {med['new']:.1f} ({tf['new']:.0f} TF, {ratio['new']:.3f}x {base}) "
          f"old {med['old']:.1f} ({ratio['old']:.3f}x) {base} {med[base]:.1f}  old/new {gain:.3f}  do_bench "
          + "/".join(f"{db[n]:.1f}" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/s45_gemm.json", "w"), indent=1)
