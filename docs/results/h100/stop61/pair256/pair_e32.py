"""Tile (TMA[0]) vs pair (TMA_PAIR[0]) vs torch._grouped_mm at 256 rows per group (E32 over 8192 rows) and E8
equal as a control, M x 11008 x 4096 bf16; do_bench cool (1 s idle) and sustained (3 s at the cap, NVML),
rotating order, ROUNDS rounds; outputs compared."""
import os, sys, time, importlib
sys.path.insert(0, "docs/results/h100/stop51/power")
import numpy as np, torch, triton
os.environ.setdefault("SECS", "2.5")
from power_probe import sustained
from moe import gemm_configs
from moe.bench import gemm_offsets
from cukernels import launch as L
gg = importlib.import_module("moe.grouped_gemm")
print(torch.cuda.get_device_name(), flush=True)
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def ours(a, b, off, cfg):
    call = gg._validated(a, b, off, None, None, None, cfg, None)
    pa, pb, po = L.view(a)[1], L.view(b)[1], L.view(off)[1]
    return lambda: call(pa, pb, po, 0)


rng = np.random.default_rng(7)
cases = [("E32 equal", 32, gemm_offsets(8192, 32, "equal")),
         ("E32 random", 32, gemm_offsets(8192, 32, "random")),
         ("E32 routed", 32, np.concatenate([[0], np.cumsum(rng.multinomial(8192, np.full(32, 1 / 32)))]).astype(np.int32)),
         ("E8 equal", 8, gemm_offsets(8192, 8, "equal"))]
for name, E, off_np in cases:
    N, K = 11008, 4096
    g = torch.Generator(device="cuda").manual_seed(E)
    a = torch.randn(8192, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    off = torch.from_numpy(off_np).cuda()
    ends = off[1:].contiguous()
    bt = b.transpose(1, 2)
    f = {"tile": ours(a, b, off, gemm_configs.TMA[0]), "pair": ours(a, b, off, gemm_configs.TMA_PAIR[0]),
         "torch": lambda: torch._grouped_mm(a, bt, offs=ends)}
    x, y, z = f["tile"](), f["pair"](), f["torch"]()
    same = torch.equal(x, y)
    err = ((x.float() - z.float()).abs().max() / z.float().abs().max()).item()
    res = {n: [] for n in f}
    names = list(f)
    for r in range(ROUNDS):
        for n in names[r % 3:] + names[:r % 3]:
            time.sleep(1.0)
            t = triton.testing.do_bench(f[n], warmup=5, rep=30) * 1e3
            per_call, clk, p, mj, temp, reasons = sustained(f[n])
            res[n].append((t, per_call, mj, clk))
    m = {n: np.median(np.array(v), axis=0) for n, v in res.items()}
    c = np.diff(off_np)
    print(f"{name:11s} min/max rows {c.min()}/{c.max()} | cool us tile {m['tile'][0]:7.1f} pair {m['pair'][0]:7.1f} "
          f"torch {m['torch'][0]:7.1f} | sust tile {m['tile'][1]:7.1f} pair {m['pair'][1]:7.1f} torch {m['torch'][1]:7.1f}"
          f" | mJ {m['tile'][2]:.0f}/{m['pair'][2]:.0f}/{m['torch'][2]:.0f} | MHz {m['tile'][3]:.0f}/{m['pair'][3]:.0f}/{m['torch'][3]:.0f}"
          f" | torch/tile cool {m['torch'][0]/m['tile'][0]:.3f} sust {m['torch'][1]/m['tile'][1]:.3f}"
          f" torch/pair cool {m['torch'][0]/m['pair'][0]:.3f} sust {m['torch'][1]/m['pair'][1]:.3f}"
          f" | tile==pair {same} rel err vs torch {err:.2e}", flush=True)
    for n in names:
        print("   ", n, [tuple(round(v, 1) for v in s) for s in res[n]], flush=True)
