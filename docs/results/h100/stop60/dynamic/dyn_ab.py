"""A/B of the tma tiles' dynamic schedule (moe.grouped_gemm.TMA_DYNAMIC) against the static one: the seed004 layer
(T 2048 / 32768 / 65536) and the gemm suite's grouped GEMMs (M 8192 N 11008 K 4096: one group, 8 / 32 equal and
random), each built once per schedule; per round (order alternating, 1 s idle before each) triton do_bench and the
engine's held timer (L2 flushed by a read); outputs compared bitwise. PYTHONPATH=. on a GPU."""
import importlib, json, os, sys, time
import cupy
import numpy as np
import triton
from cukernels import dtypes, timing
from moe import bench as mb, suites

gg = importlib.import_module("moe.grouped_gemm")
layer_mod = importlib.import_module("moe.layer")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
cases = [c for c in mb.cases_for(suites.suite("seed004"), "bf16") if c.params["kind"] == "layer"]
cases += [c for c in mb.cases_for(suites.suite("gemm"), "bf16")]
only = os.environ.get("CASES")
if only:
    cases = [c for c in cases if any(o in c.name for o in only.split(","))]
report = []
for case in cases:
    inp = mb.make_inputs(case, 0)
    calls, outs, plans = {}, {}, {}
    for dyn in (False, True):
        gg.TMA_DYNAMIC = dyn
        layer_mod._LAYER.clear()
        gg._GEMM.clear()
        if case.params["kind"] == "layer":
            layer, x = inp.layer, inp.x
            outs[dyn] = layer(x)
            key = (*(layer_mod._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)),
                   case.params["top_k"], "swiglu")
            call = layer_mod._LAYER.get(key)
            ptrs = tuple(layer_mod._launch.view(t)[1] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down))
            calls[dyn] = (lambda c=call, p=ptrs: c(*p))
            plans[dyn] = f"up {call.up.config} dyn {call.up.work is not None}; down {call.down.config} dyn {call.down.work is not None}"
        else:
            call = gg._validated(inp.a, inp.b, inp.offsets_d, None, None, None, None)
            p = (inp.a.data.ptr, inp.b.data.ptr, inp.offsets_d.data.ptr, 0)
            outs[dyn] = call(*p)
            calls[dyn] = (lambda c=call, p=p: c(*p))
            plans[dyn] = f"{call.config} dyn {call.work is not None}"
        again = calls[dyn]()
        assert bool((again.view(np.uint16) == outs[dyn].view(np.uint16)).all()), (case.name, dyn, "repeat")
        print(f"{case.name} dyn={dyn}: {plans[dyn]}", flush=True)
    gg.TMA_DYNAMIC = True
    layer_mod._LAYER.clear()
    gg._GEMM.clear()
    same = bool((outs[False].view(np.uint16) == outs[True].view(np.uint16)).all())
    res = {f: {"do_bench": [], "held": []} for f in calls}
    rep = max(50, int(40 * case.flops / 1e12))
    for r in range(ROUNDS):
        for f in ((False, True) if r % 2 == 0 else (True, False)):
            time.sleep(1.0)
            res[f]["do_bench"].append(triton.testing.do_bench(calls[f], warmup=3, rep=rep))
            time.sleep(0.5)
            res[f]["held"].append(timing.benchmark(calls[f], budget_ms=max(100, rep)).median_ms)
    m = {f: {k: float(np.median(v)) for k, v in res[f].items()} for f in res}
    print(f"{case.name}: static {m[False]['do_bench']:.4f} / {m[False]['held']:.4f} ms, dynamic "
          f"{m[True]['do_bench']:.4f} / {m[True]['held']:.4f}; static / dynamic {m[False]['do_bench'] / m[True]['do_bench']:.4f}"
          f" / {m[False]['held'] / m[True]['held']:.4f}; bitwise equal {same}", flush=True)
    report.append({"case": case.name, "plans": {str(k): v for k, v in plans.items()}, "rounds": {str(f): res[f] for f in res},
                   "median": {str(f): m[f] for f in m}, "bitwise_equal": same})
    del inp, calls, outs
if len(sys.argv) > 1:
    json.dump(report, open(sys.argv[1], "w"), indent=1)
