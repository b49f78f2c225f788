"""A/B of stop 60's dynamic schedule and stop 61/64's idle-warpgroup skip, alone and together (never measured
together), on the gemm suite's rows beside torch._grouped_mm: each variant's call built in its own block with the
call cache cleared and kept (zero_ab2.py's way). 2 s back to back per row (timing.sustained) in two passes in
opposite orders, plus do_bench; outputs compared bitwise with the static schedule's."""
import importlib, json, os, sys, time
import numpy as np
sys.path.insert(0, '.')
import triton.testing
from cukernels import bench, timing
from cukernels import launch as cl
from moe import bench as mb, suites, launch as mlaunch
gg = importlib.import_module("moe.grouped_gemm")

SECONDS = float(os.environ.get("SUSTAIN_S", "2"))
VARIANTS = {"static": (False, ("-DGEMM_SKIP_IDLE=0",)), "dyn": (True, ("-DGEMM_SKIP_IDLE=0",)),
            "skip": (False, ("-DGEMM_SKIP_IDLE=1",)), "dynskip": (True, ("-DGEMM_SKIP_IDLE=1",))}


def built(a, b, offs, variant):
    dyn, opts = VARIANTS[variant]
    gg._GEMM.clear()
    gg.TMA_DYNAMIC = dyn
    try:
        with mlaunch.kernels_built_with(opts):
            out = gg.grouped_gemm(a, b, offs)
        (call,) = list(gg._GEMM._entries.values())
    finally:
        gg._GEMM.clear()
        gg.TMA_DYNAMIC = True
    va, vb, vo, nz = cl.view(a), cl.view(b), cl.view(offs), gg._NO_OFFSETS
    return (lambda: call(va[1], vb[1], vo[1], 0, nz[1], nz[1])), out


rows = []
for name in sys.argv[1:] or ["gemm_8192x11008x4096_E8_equal", "gemm_8192x11008x4096_E8_random",
                             "gemm_8192x11008x4096_E32_equal", "gemm_8192x11008x4096_E32_random"]:
    (case,) = [c for c in mb.cases_for(suites.suite("gemm"), "bf16") if c.name == name]
    inp = mb.make_inputs(case, bench.case_seed(case))
    fns, outs = {}, {}
    for v in VARIANTS:
        fns[v], outs[v] = built(inp.a, inp.b, inp.offsets_d, v)
        assert (fns[v]() == outs[v]).all()
    fns["torch-grouped"] = mb._torch_grouped(case, inp)
    fns["torch-grouped"]()
    res = {k: {"do_bench_ms": [], "sustained": []} for k in fns}
    keys = list(fns)
    for r in range(2):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            time.sleep(0.5)
            res[k]["do_bench_ms"].append(triton.testing.do_bench(fns[k], warmup=25, rep=100))
            res[k]["sustained"].append(timing.sustained(fns[k], SECONDS))
    sus = lambda k, f: float(np.mean([s[f] for s in res[k]["sustained"]]))
    print(f"{name}: bitwise vs static " + ", ".join(f"{v} {bool((outs[v] == outs['static']).all())}" for v in VARIANTS))
    for k in keys:
        print(f"  {k:14s} cool {np.median(res[k]['do_bench_ms']) * 1e3:8.1f} us  cap {sus(k, 'ms_per_call') * 1e3:8.1f} us"
              f" {sus(k, 'mj_per_call'):7.1f} mJ  vs static cap {sus('static', 'ms_per_call') / sus(k, 'ms_per_call'):.3f}"
              f"  torch / this cap {sus('torch-grouped', 'ms_per_call') / sus(k, 'ms_per_call'):.3f}"
              f" cool {np.median(res['torch-grouped']['do_bench_ms']) / np.median(res[k]['do_bench_ms']):.3f}", flush=True)
    rows.append({"case": name, "res": res})
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "dynskip_ab.json"), "w"), indent=1, default=str)
