"""Issue 14's fragile lines measured three ways in rotated interleaved rounds: the seed 004 layer at b16 x 2048
(ours, the torch per-expert loop, the _grouped_mm layer) and the E32 equal grouped GEMM (ours, _grouped_mm):
triton do_bench after 1 s idle (cool), the engine's held timer (cukernels.timing.benchmark) and sustained back-to-back
calls for SECS seconds at the 700 W cap (NVML: clock, energy per call)."""
import os, sys, time
sys.path.insert(0, "docs/results/h100/stop51/power")
os.environ.setdefault("SECS", "3")
import numpy as np, torch, triton
from power_probe import sustained
from moe import bench as mb, suites
from cukernels import timing
print(torch.cuda.get_device_name(), flush=True)
ROUNDS = int(os.environ.get("ROUNDS", "5"))
which = sys.argv[1] if len(sys.argv) > 1 else "layer,gemm"


def measure(label, fns, check=None):
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            time.sleep(1.0)
            t = triton.testing.do_bench(fns[n], warmup=3, rep=100) * 1e3
            h = timing.benchmark(fns[n]).median_ms * 1e3
            per_call, clk, p, mj, temp, reasons = sustained(fns[n])
            res[n].append((t, h, per_call, mj, clk))
            print(f"  {label} r{r} {n:14s} dobench {t:9.1f} held {h:9.1f} sust {per_call:9.1f} us {mj:7.0f} mJ {clk:5.0f} MHz", flush=True)
    m = {n: np.median(np.array(v), axis=0) for n, v in res.items()}
    base = names[0]
    print(f"== {label}: medians over {ROUNDS} rounds (us; ratio = impl / ours, > 1: ours faster)")
    for n in names:
        print(f"   {n:14s} dobench {m[n][0]:9.1f} ({m[n][0]/m[base][0]:.3f})  held {m[n][1]:9.1f} ({m[n][1]/m[base][1]:.3f})"
              f"  sustained {m[n][2]:9.1f} ({m[n][2]/m[base][2]:.3f})  {m[n][3]:.0f} mJ  {m[n][4]:.0f} MHz", flush=True)
        per_round = [res[n][i][0] / res[base][i][0] for i in range(ROUNDS)]
        print(f"      per-round dobench ratios {[round(x, 3) for x in per_round]}", flush=True)


if "layer" in which:
    case = next(c for c in mb.cases_for([suites.shape("seed004_b16x2048")], "bf16") if c.params["kind"] == "layer")
    inputs = mb.make_inputs(case, 0)
    fns = {"ours": mb._ours(case, inputs), "torch-loop": mb._torch_layer(False)(case, inputs),
           "torch-grouped": mb._torch_layer(True)(case, inputs)}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    measure("seed004 b16x2048 layer", fns)
    del fns, inputs
    mb._LAYERS.clear()
if "gemm" in which:
    case = next(c for c in mb.cases_for([suites.shape("gemm_8192x11008x4096_E32_equal")], "bf16"))
    inputs = mb.make_inputs(case, 0)
    fns = {"ours": mb._ours(case, inputs), "torch-grouped": mb._torch_grouped(case, inputs)}
    measure("E32 equal gemm", fns)
