"""The tma kernel's idle consumer warpgroup (rows all past the group) issuing no wgmma (tree, GEMM_SKIP_IDLE=1)
against computing them (-DGEMM_SKIP_IDLE=0): planner's config, M x 11008 x 4096 bf16 over several group splits;
do_bench cool (1 s idle) and sustained (SECS s at the cap, NVML), rotated, ROUNDS rounds; outputs bitwise compared
and checked against torch._grouped_mm."""
import os, sys, time, importlib
sys.path.insert(0, "docs/results/h100/stop51/power")
os.environ.setdefault("SECS", "2")
import numpy as np, torch, triton
from power_probe import sustained
from moe import launch as ml
from moe.bench import gemm_offsets
from cukernels import launch as L
gg = importlib.import_module("moe.grouped_gemm")
print(torch.cuda.get_device_name(), flush=True)
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def build(a, b, off):
    call = gg._validated(a, b, off, None, None, None, None, None)
    pa, pb, po = L.view(a)[1], L.view(b)[1], L.view(off)[1]
    return lambda: call(pa, pb, po, 0)


def routed(rows, E, seed):
    c = np.random.default_rng(seed).multinomial(rows, np.full(E, 1 / E))
    return np.concatenate([[0], np.cumsum(c)]).astype(np.int32)


CASES = os.environ.get("CASES", "")
cases = [("E8 random", 8, gemm_offsets(8192, 8, "random")),
         ("E32 random", 32, gemm_offsets(8192, 32, "random")),
         ("E32 routed", 32, routed(8192, 32, 1)),
         ("E64 random", 64, gemm_offsets(8192, 64, "random")),
         ("E128 routed", 128, routed(8192, 128, 2)),
         ("E32 equal", 32, gemm_offsets(8192, 32, "equal"))]
for name, E, off_np in cases:
    if CASES and name not in CASES.split(","):
        continue
    N, K = 11008, 4096
    g = torch.Generator(device="cuda").manual_seed(E)
    a = torch.randn(8192, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    off = torch.from_numpy(off_np).cuda()
    f = {"skip": build(a, b, off)}
    with ml.kernels_built_with(["-DGEMM_SKIP_RESYNC=0"], "grouped_gemm_tma") as built:
        f["skip-noresync"] = build(a, b, off)
    with ml.kernels_built_with(["-DGEMM_SKIP_IDLE=0"], "grouped_gemm_tma") as built:
        f["compute"] = build(a, b, off)
    x, y = f["skip"](), f["compute"]()
    same2 = torch.equal(x, f["skip-noresync"]())
    z = torch._grouped_mm(a, b.transpose(1, 2), offs=off[1:].contiguous())
    same = torch.equal(x, y)
    err = ((x.float() - z.float()).abs().max() / z.float().abs().max()).item()
    res = {n: [] for n in f}
    for r in range(ROUNDS):
        names = list(f)
        for n in names[r % 3:] + names[:r % 3]:
            time.sleep(1.0)
            t = triton.testing.do_bench(f[n], warmup=5, rep=40) * 1e3
            per_call, clk, p, mj, temp, reasons = sustained(f[n])
            res[n].append((t, per_call, mj, clk))
    m = {n: np.median(np.array(v), axis=0) for n, v in res.items()}
    c = np.diff(off_np)
    idle = int(sum(1 for x_ in c if x_ % 128 and 0 < x_ % 128 <= 64))
    print(f"{name:12s} rows {c.min()}-{c.max()} groups with an idle half-tile {idle} | built {len(built)} | cool skip "
          f"{m['skip'][0]:7.1f} compute {m['compute'][0]:7.1f} ({m['compute'][0]/m['skip'][0]:.3f}) | sustained "
          f"{m['skip'][1]:7.1f} / {m['compute'][1]:7.1f} ({m['compute'][1]/m['skip'][1]:.3f}) | mJ {m['skip'][2]:.0f} / "
          f"{m['compute'][2]:.0f} | MHz {m['skip'][3]:.0f}/{m['compute'][3]:.0f} | bitwise {same} {same2} err vs torch {err:.1e}"
          f" | no-resync cool {m['skip-noresync'][0]:7.1f} ({m['compute'][0]/m['skip-noresync'][0]:.3f}) sustained "
          f"{m['skip-noresync'][1]:7.1f} ({m['compute'][1]/m['skip-noresync'][1]:.3f})",
          flush=True)
    for n in f:
        print("   ", n, [tuple(round(v, 1) for v in s) for s in res[n]], flush=True)
