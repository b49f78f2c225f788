"""Probe: what the tma kernel's epilogue costs (an upper bound on what overlapping it with the next tile's products,
CUTLASS's pingpong schedule, could buy): each GEMM built as the tree and with -DGEMM_PROBE_NO_EPILOGUE (the sums
computed, nothing stored), beside torch._grouped_mm; do_bench cool (alternating, 3 rounds) and 2 s back to back at
the cap (timing.sustained, two passes in opposite orders)."""
import importlib, json, os, sys, time
import numpy as np
import cupy
sys.path.insert(0, '.')
import triton.testing
from cukernels import bench, dtypes, timing
from cukernels import launch as cl
from moe import bench as mb, suites, launch as mlaunch
gg = importlib.import_module("moe.grouped_gemm")
SECONDS = float(os.environ.get("SUSTAIN_S", "2"))
OPTS = {"tree": (), "noepi": ("-DGEMM_PROBE_EPI=1",), "nostore": ("-DGEMM_PROBE_EPI=2",),
        "nostage": ("-DGEMM_PROBE_EPI=3",)}
VARIANTS = os.environ.get("VARIANTS", "tree,noepi").split(",")


def built(a, b, offs, variant, **kw):
    gg._GEMM.clear()
    with mlaunch.kernels_built_with(OPTS[variant]):
        out = gg.grouped_gemm(a, b, offs, **kw)
    (call,) = list(gg._GEMM._entries.values())
    gg._GEMM.clear()
    va, vb, vo, nz = cl.view(a), cl.view(b), cl.view(offs), gg._NO_OFFSETS
    return (lambda: call(va[1], vb[1], vo[1], 0, nz[1], nz[1])), out, str(call.config)


ROUNDS = int(os.environ.get("ROUNDS", "3"))


def measure(fns, rounds=ROUNDS):
    res = {k: {"do_bench_ms": [], "sustained": []} for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            time.sleep(0.3)
            res[k]["do_bench_ms"].append(triton.testing.do_bench(fns[k], warmup=25, rep=100))
            if r < 2 and SECONDS > 0:
                res[k]["sustained"].append(timing.sustained(fns[k], SECONDS))
    return res


def report(title, res, flops):
    print(title)
    sus = lambda k, f: float(np.mean([s[f] for s in res[k]["sustained"]]))
    for k in res:
        cool = np.median(res[k]["do_bench_ms"])
        line = f"  {k:14s} cool {cool * 1e3:9.1f} us ({flops / cool / 1e9:5.0f} TFLOP/s)  tree/this {np.median(res['tree']['do_bench_ms']) / cool:.3f}"
        if not res[k]["sustained"]:
            print(line)
            continue
        print(line + f" | cap {sus(k, 'ms_per_call') * 1e3:9.1f} us {sus(k, 'mj_per_call'):7.1f} mJ {sus(k, 'sm_clock_mean_mhz'):5.0f} MHz"
              f" tree/this {sus('tree', 'ms_per_call') / sus(k, 'ms_per_call'):.3f}")


rows = []
for name in os.environ.get("CASES", "gemm_8192x11008x4096_1group,gemm_8192x11008x4096_E8_equal,gemm_8192x11008x4096_E32_equal").split(","):
    (case,) = [c for c in mb.cases_for(suites.suite("gemm"), "bf16") if c.name == name]
    inp = mb.make_inputs(case, bench.case_seed(case))
    fns = {}
    for v in VARIANTS:
        fns[v], o, cfg = built(inp.a, inp.b, inp.offsets_d, v)
    cfg2 = cfg
    fns["torch-grouped"] = mb._torch_grouped(case, inp)
    fns["torch-grouped"]()
    res = measure(fns)
    report(f"{name} ({cfg} / {cfg2})", res, 2 * 8192 * 11008 * 4096)
    rows.append({"case": name, "config": cfg, "res": res})

bf = dtypes.from_name("bf16")
E, ROWS = 32, 65536
offs = cupy.asarray(np.arange(E + 1, dtype=np.int32) * (ROWS // E))
for label, n, k, kw in (("up 65536 x 22016 x 4096 SwiGLU, 32 groups", 22016, 4096, {"epilogue": "swiglu"}),
                        ("down 65536 x 4096 x 11008, 32 groups", 4096, 11008, {})):
    a = dtypes.random((ROWS, k), bf, seed=1)
    b = dtypes.random((E, n, k), bf, seed=2, scale=1 / 64)
    fns = {}
    for v in VARIANTS:
        fns[v], o, cfg = built(a, b, offs, v, **kw)
    res = measure(fns, rounds=max(2, ROUNDS - 1))
    report(f"{label} ({cfg})", res, 2 * ROWS * n * k)
    rows.append({"case": label, "config": cfg, "res": res})
    del a, b
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "epi_probe.json"), "w"), indent=1, default=str)
