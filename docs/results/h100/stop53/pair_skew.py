"""TMA[0] vs the B-multicast pair (calls built once) on the bench's group splits (moe.bench.gemm_offsets: equal,
random gamma(2)) and on routed splits (multinomial counts of T x top_k rows over E experts, the MoE layer's),
M x 11008 x 4096 bf16 (the layer rows: M x 22016 x 4096 SwiGLU); do_bench cool (1 s idle) and sustained
(power_probe.sustained, 3 s), alternating, two rounds; outputs compared."""
import sys, time, importlib
sys.path.insert(0, "docs/results/h100/stop51/power")
import numpy as np, torch, triton
from power_probe import sustained
from moe import gemm_configs
from moe.bench import gemm_offsets
from cukernels import launch as L
gg = importlib.import_module("moe.grouped_gemm")
print(torch.cuda.get_device_name())


def held(a, b, off, epi, cfg):
    call = gg._validated(a, b, off, epi, None, None, cfg, None)
    pa, pb, po = L.view(a)[1], L.view(b)[1], L.view(off)[1]
    return lambda: call(pa, pb, po, 0)


rng = np.random.default_rng(5)
cases = [("E8 equal", 8192, 8, gemm_offsets(8192, 8, "equal"), 11008, None),
         ("E8 random", 8192, 8, gemm_offsets(8192, 8, "random"), 11008, None),
         ("E32 random", 8192, 32, gemm_offsets(8192, 32, "random"), 11008, None)]
for rows, E in ((16384, 8), (65536, 32)):
    counts = rng.multinomial(rows, np.full(E, 1.0 / E))
    cases.append((f"routed {rows}/E{E}", rows, E, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), 11008, None))
cases.append(("routed 65536/E32 swiglu", 65536, 32, cases[-1][3], 22016, "swiglu"))
for name, rows, E, off_np, N, epi in cases:
    K = 4096
    g = torch.Generator(device="cuda").manual_seed(rows + E)
    a = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    off = torch.from_numpy(off_np).cuda()
    c = np.diff(off_np)
    waste = (sum(-(-x // 256) * 256 - x for x in c), sum(-(-x // 128) * 128 - x for x in c))
    f = {"tma": held(a, b, off, epi, gemm_configs.TMA[0]), "pair": held(a, b, off, epi, gemm_configs.TMA_PAIR[0])}
    same = torch.equal(f["tma"](), f["pair"]())
    res = {n: [] for n in f}
    for r in range(2):
        for n in (list(f) if r % 2 == 0 else list(f)[::-1]):
            time.sleep(1.0)
            t = triton.testing.do_bench(f[n], warmup=5, rep=30) * 1e3
            per_call, clk, p, mj, temp, reasons = sustained(f[n])
            res[n].append((t, per_call, mj))
    m = {n: np.median(np.array(v), axis=0) for n, v in res.items()}
    print(f"{name:24s} waste rows pair/tma {waste[0]}/{waste[1]} | cool tma {m['tma'][0]:8.1f} pair {m['pair'][0]:8.1f} "
          f"({m['tma'][0]/m['pair'][0]:.3f}) | sustained tma {m['tma'][1]:8.1f} pair {m['pair'][1]:8.1f} "
          f"({m['tma'][1]/m['pair'][1]:.3f}) | mJ {m['tma'][2]:.0f} / {m['pair'][2]:.0f} | same {same}", flush=True)
