"""A/B: rows past a group zeroed in the tma GEMM's A stages (GEMM_ZERO_PAST_ROWS, the tree) against the kernel
without it (-DGEMM_ZERO_PAST_ROWS=0), on the gemm suite's cases (the suite's inputs, bench.case_seed) beside
torch._grouped_mm; outputs compared bitwise. Per row: do_bench (cool: after 1 s idle) and timing.sustained (3 s back
to back, at the power limit: ms, mJ per call, W, MHz), two rounds in rotated orders."""
import json, os, sys, time
import numpy as np
import cupy
sys.path.insert(0, '.')
import torch
import triton.testing
from cukernels import bench, timing, dtypes
from moe import bench as mb, suites, launch as mlaunch
from moe.grouped_gemm import grouped_gemm

SECONDS = float(os.environ.get("SUSTAIN_S", "3"))
names = sys.argv[1:] or ["gemm_8192x11008x4096_E8_random", "gemm_8192x11008x4096_E32_random",
                         "gemm_8192x11008x4096_E32_equal"]
rows = []
for name in names:
    (case,) = [c for c in mb.cases_for(suites.suite("gemm"), "bf16") if c.name == name]
    inp = mb.make_inputs(case, bench.case_seed(case))
    fns, outs = {}, {}
    for var, opts in (("zero", ()), ("nozero", ("-DGEMM_ZERO_PAST_ROWS=0",))):
        a = inp.a.copy()  # its own pointer: its own cached call, built with its options
        with mlaunch.kernels_built_with(opts):
            outs[var] = grouped_gemm(a, inp.b, inp.offsets_d)
        fns[var] = (lambda a=a: grouped_gemm(a, inp.b, inp.offsets_d))
        assert (fns[var]() == outs[var]).all()
    fns["torch-grouped"] = mb._torch_grouped(case, inp)
    fns["torch-grouped"]()
    counts = np.diff(inp.offsets)
    row = {"case": name, "bitwise": bool((outs["zero"] == outs["nozero"]).all()),
           "tiles": int(np.sum(-(-counts // 128))), "rows": int(counts.sum()),
           "do_bench_ms": {k: [] for k in fns}, "sustained": {k: [] for k in fns}}
    keys = list(fns)
    for r in range(2):
        order = keys[r:] + keys[:r] if r % 2 == 0 else (keys[r:] + keys[:r])[::-1]
        for k in order:
            time.sleep(1.0)
            row["do_bench_ms"][k].append(triton.testing.do_bench(fns[k], warmup=25, rep=100))
            row["sustained"][k].append(timing.sustained(fns[k], SECONDS))
    med = lambda k: float(np.median(row["do_bench_ms"][k]))
    sus = lambda k, f: float(np.mean([s[f] for s in row["sustained"][k]]))
    print(f"{name}: bitwise {row['bitwise']}, {row['tiles']} m-tiles for {row['rows']} rows "
          f"({row['tiles'] * 128 / row['rows']:.3f}x the rows)")
    for k in keys:
        print(f"  {k:14s} cool {med(k) * 1e3:8.1f} us  at the cap {sus(k, 'ms_per_call') * 1e3:8.1f} us "
              f"{sus(k, 'mj_per_call'):7.1f} mJ {sus(k, 'power_w'):5.0f} W {sus(k, 'sm_clock_mean_mhz'):5.0f} MHz"
              f"  vs torch cool {med('torch-grouped') / med(k):.3f} cap {sus('torch-grouped', 'ms_per_call') / sus(k, 'ms_per_call'):.3f}")
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "zero_ab.json"), "w"), indent=1, default=str)
