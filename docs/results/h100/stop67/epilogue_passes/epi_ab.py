"""A/B: the tma GEMM's plain epilogue in 64-column passes alternating the staging blocks (tree, v4.12) against passes of
128 columns each waiting for every store (-DGEMM_EPI_HALF_PASSES=0): each call built in its own block and kept,
outputs compared bitwise, beside torch._grouped_mm; do_bench (ROUNDS alternating rounds) and SUSTAIN_S s back to
back at the cap (timing.sustained, first two rounds)."""
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
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OPTS = {"tree": (), "old": ("-DGEMM_EPI_HALF_PASSES=0",)}


def built(a, b, offs, variant, **kw):
    gg._GEMM.clear()
    with mlaunch.kernels_built_with(OPTS[variant]):
        out = gg.grouped_gemm(a, b, offs, **kw)
    (call,) = list(gg._GEMM._entries.values())
    gg._GEMM.clear()
    va, vb, vo, nz = cl.view(a), cl.view(b), cl.view(offs), gg._NO_OFFSETS
    return (lambda: call(va[1], vb[1], vo[1], 0, nz[1], nz[1])), out, str(call.config)


def measure(fns, rounds):
    res = {k: {"do_bench_ms": [], "sustained": []} for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            time.sleep(0.3)
            res[k]["do_bench_ms"].append(triton.testing.do_bench(fns[k], warmup=25, rep=100))
            if r < 2 and SECONDS > 0:
                res[k]["sustained"].append(timing.sustained(fns[k], SECONDS))
    return res


def report(title, res):
    print(title)
    sus = lambda k, f: float(np.mean([s[f] for s in res[k]["sustained"]]))
    for k in res:
        cool = np.median(res[k]["do_bench_ms"])
        line = f"  {k:14s} do_bench {cool * 1e3:9.1f} us  old/this {np.median(res['old']['do_bench_ms']) / cool:.3f}"
        if res[k]["sustained"]:
            line += (f" | cap {sus(k, 'ms_per_call') * 1e3:9.1f} us {sus(k, 'mj_per_call'):7.1f} mJ {sus(k, 'sm_clock_mean_mhz'):5.0f} MHz"
                     f" old/this {sus('old', 'ms_per_call') / sus(k, 'ms_per_call'):.3f}")
        print(line)


rows = []
for name in os.environ.get("CASES", "1group,E8_equal,E8_random,E32_equal,E32_random").split(","):
    name = f"gemm_8192x11008x4096_{name}"
    (case,) = [c for c in mb.cases_for(suites.suite("gemm"), "bf16") if c.name == name]
    inp = mb.make_inputs(case, bench.case_seed(case))
    fns, outs = {}, {}
    for v in OPTS:
        fns[v], outs[v], cfg = built(inp.a, inp.b, inp.offsets_d, v)
    same = bool((outs["tree"] == outs["old"]).all())
    fns["torch-grouped"] = mb._torch_grouped(case, inp)
    res = measure(fns, ROUNDS)
    report(f"{name} ({cfg}), tree == old bitwise: {same}", res)
    rows.append({"case": name, "config": cfg, "bitwise": same, "res": res})

bf = dtypes.from_name("bf16")
E, ROWS = 32, 65536
offs = cupy.asarray(np.arange(E + 1, dtype=np.int32) * (ROWS // E))
for label, n, k in (("down 65536 x 4096 x 11008, 32 groups", 4096, 11008),):
    a = dtypes.random((ROWS, k), bf, seed=1)
    b = dtypes.random((E, n, k), bf, seed=2, scale=1 / 64)
    fns, outs = {}, {}
    for v in OPTS:
        fns[v], outs[v], cfg = built(a, b, offs, v)
    same = bool((outs["tree"] == outs["old"]).all())
    res = measure(fns, max(2, ROUNDS - 2))
    report(f"{label} ({cfg}), bitwise: {same}", res)
    rows.append({"case": label, "config": cfg, "bitwise": same, "res": res})
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "epi_ab.json"), "w"), indent=1, default=str)
