import sys, torch, triton
from moe import grouped_gemm
print(sys.argv[1], end=" ")
for n, k in ((2048, 2048), (5632, 2048), (4096, 4096), (4096, 11008)):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    a = torch.randn(128, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(1, n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    ref = (a.float() @ b[0].float().T)
    o = grouped_gemm(a, b, None)
    err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
    t = triton.testing.do_bench(lambda: grouped_gemm(a, b, None), warmup=20, rep=150)
    print(f"{n}x{k} {t*1e3:.1f}us (rel err {err:.1e})", end=" | ", flush=True)
print()
