"""TMA[0] vs the B-multicast pair (config forced), dense one-group GEMMs of the models (M x N x K), bf16, do_bench
with 1 s idle before each, 3 rounds alternating; outputs compared bitwise to each other and to an fp32 product."""
import time, torch, triton
from moe import grouped_gemm, gemm_configs
import importlib
gg = importlib.import_module("moe.grouped_gemm")
from cukernels import launch as L


def held(a, b, epi, cfg):
    """The forced config's call built once (no per-call validation), called like the planner's cached path."""
    call = gg._validated(a, b, None, epi, None, None, cfg, None)
    pa, pb = L.view(a)[1], L.view(b)[1]
    return lambda: call(pa, pb, 0, 0)
SH = [(1024, 4096, 4096, None), (2048, 4096, 4096, None), (2048, 12288, 4096, None), (2048, 22016, 4096, "swiglu"),
      (2048, 4096, 11008, None), (8192, 2048, 2048, None), (8192, 11264, 2048, "swiglu"), (8192, 2048, 5632, None),
      (8192, 12288, 4096, None), (8192, 4096, 11008, None)]
print(torch.cuda.get_device_name())
for M, N, K, epi in SH:
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(1, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    f = {"tma": held(a, b, epi, gemm_configs.TMA[0]), "pair": held(a, b, epi, gemm_configs.TMA_PAIR[0]),
         "plan": lambda: grouped_gemm(a, b, None, epilogue=epi)}
    same = torch.equal(f["tma"](), f["pair"]()) and torch.equal(f["tma"](), f["plan"]())
    res = {n: [] for n in f}
    for r in range(3):
        for n in (list(f) if r % 2 == 0 else list(f)[::-1]):
            time.sleep(0.5)
            res[n].append(triton.testing.do_bench(f[n], warmup=5, rep=25) * 1e3)
    med = {n: sorted(v)[1] for n, v in res.items()}
    print(f"{M}x{N}x{K} {epi or 'plain':6s} tma {med['tma']:8.1f} us  pair {med['pair']:8.1f}  plan {med['plan']:8.1f}"
          f"  tma/pair {med['tma']/med['pair']:.3f}  same {same}", flush=True)
