"""A/B done right (stop 66's first zero_ab.py reused one cached call for both builds: grouped_gemm's call cache is
keyed by shapes, not pointers): each variant's call is built inside its kernels_built_with block with the cache
cleared, and kept. (1) the gemm suite's partial-tile rows: A's rows past a group zeroed in shared memory (zero) or
not (nozero), beside torch._grouped_mm; (2) the physics: the layer-sized up-projection (65,536 rows, 32 equal
groups, SwiGLU) with A random (nozero), A random but every row zeroed in shared memory (probe), A zero in memory
(nozero). Each row 3 s back to back (timing.sustained) in two passes in opposite orders, plus do_bench."""
import json, os, sys, time
import numpy as np
import cupy
sys.path.insert(0, '.')
import triton.testing
from cukernels import bench, dtypes, timing
from cukernels import launch as cl
from moe import bench as mb, suites, launch as mlaunch
import importlib
gg = importlib.import_module("moe.grouped_gemm")

SECONDS = float(os.environ.get("SUSTAIN_S", "3"))
OPTS = {"zero": ("-DGEMM_ZERO_PAST_ROWS=1",), "nozero": ("-DGEMM_ZERO_PAST_ROWS=0",),
        "probe": ("-DGEMM_ZERO_PAST_ROWS=1", "-DGEMM_ZERO_ALL_ROWS_PROBE")}


def built(a, b, offs, variant, **kw):
    """(fn, first output): grouped_gemm's call for these arrays built with the variant's options, kept."""
    gg._GEMM.clear()
    with mlaunch.kernels_built_with(OPTS[variant]):
        out = gg.grouped_gemm(a, b, offs, **kw)
    (call,) = list(gg._GEMM._entries.values())
    gg._GEMM.clear()
    va, vb, vo, nz = cl.view(a), cl.view(b), cl.view(offs), gg._NO_OFFSETS
    return (lambda: call(va[1], vb[1], vo[1], 0, nz[1], nz[1])), out


def measure(fns, rounds=2):
    res = {k: {"do_bench_ms": [], "sustained": []} for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            time.sleep(0.5)
            res[k]["do_bench_ms"].append(triton.testing.do_bench(fns[k], warmup=25, rep=100))
            res[k]["sustained"].append(timing.sustained(fns[k], SECONDS))
    return res


def report(title, res, base):
    print(title)
    sus = lambda k, f: float(np.mean([s[f] for s in res[k]["sustained"]]))
    for k in res:
        print(f"  {k:16s} cool {np.median(res[k]['do_bench_ms']) * 1e3:9.1f} us  at the cap {sus(k, 'ms_per_call') * 1e3:9.1f} us"
              f" {sus(k, 'mj_per_call'):8.1f} mJ {sus(k, 'power_w'):4.0f} W {sus(k, 'sm_clock_mean_mhz'):5.0f} MHz"
              f"  {base} / this at the cap {sus(base, 'ms_per_call') / sus(k, 'ms_per_call'):.3f}, energy {sus(base, 'mj_per_call') / sus(k, 'mj_per_call'):.3f}")


out_rows = []
for name in ["gemm_8192x11008x4096_E8_random", "gemm_8192x11008x4096_E32_random", "gemm_8192x11008x4096_E32_equal"]:
    (case,) = [c for c in mb.cases_for(suites.suite("gemm"), "bf16") if c.name == name]
    inp = mb.make_inputs(case, bench.case_seed(case))
    fz, oz = built(inp.a, inp.b, inp.offsets_d, "zero")
    fn, on = built(inp.a, inp.b, inp.offsets_d, "nozero")
    assert (fz() == oz).all() and (fn() == on).all()
    fns = {"zero": fz, "nozero": fn, "torch-grouped": mb._torch_grouped(case, inp)}
    fns["torch-grouped"]()
    counts = np.diff(inp.offsets)
    res = measure(fns)
    report(f"{name}: bitwise {bool((oz == on).all())}, {int(np.sum(-(-counts // 128)))} m-tiles for {int(counts.sum())} rows",
           res, "torch-grouped")
    out_rows.append({"case": name, "res": res})

E, ROWS = 32, 65536
bf = dtypes.from_name("bf16")
a = dtypes.random((ROWS, 4096), bf, seed=1)
b = dtypes.random((E, 22016, 4096), bf, seed=2, scale=1 / 64)
zero = cupy.zeros_like(a)
offs = cupy.asarray(np.arange(E + 1, dtype=np.int32) * (ROWS // E))
f_rand, o_rand = built(a, b, offs, "nozero", epilogue="swiglu")
f_probe, o_probe = built(a, b, offs, "probe", epilogue="swiglu")
f_zero, o_zero = built(zero, b, offs, "nozero", epilogue="swiglu")
print("outputs: random nonzero", bool((o_rand != 0).any()), "| probe all zero",
      bool(((o_probe.view(cupy.uint16) & 0x7fff) == 0).all()), "| zero A all zero",
      bool(((o_zero.view(cupy.uint16) & 0x7fff) == 0).all()))
res = measure({"A random": f_rand, "zeroed in smem": f_probe, "A zero in memory": f_zero})
report("up-projection 65,536 x 22,016 x 4,096 SwiGLU, 32 equal groups", res, "A random")
out_rows.append({"case": "physics", "res": res})
json.dump(out_rows, open(os.path.join(os.environ.get("OUT", "."), "zero_ab2.json"), "w"), indent=1, default=str)
