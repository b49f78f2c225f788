"""do_bench (cool, short rep, 1 s idle before each) of the planner's tile, the B-multicast pair and torch._grouped_mm
(cuBLAS for one group), M 8192 N 11008 K 4096 bf16; equal and random splits; outputs compared."""
import sys, time, torch, triton
from moe import grouped_gemm, gemm_configs
M, N, K = 8192, 11008, 4096
g = torch.Generator(device="cuda").manual_seed(1)
print(sys.argv[1] if len(sys.argv) > 1 else "", torch.cuda.get_device_name())
for E, kind in ((1, "one"), (8, "equal"), (8, "random"), (32, "equal"), (32, "random")):
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    if kind == "random":
        cuts = torch.sort(torch.randint(0, M + 1, (E - 1,), generator=torch.Generator().manual_seed(E)))[0]
        off = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([M])]).to(torch.int32).cuda()
    else:
        off = torch.arange(0, M + 1, M // E, device="cuda", dtype=torch.int32)
    ends = off[1:].contiguous(); bt = b.transpose(1, 2)
    impls = {"ours": lambda: grouped_gemm(a, b, off),
             "pair": lambda: grouped_gemm(a, b, off, config=gemm_configs.TMA_PAIR[0]),
             "torch": (lambda: a @ b[0].T) if E == 1 else (lambda: torch._grouped_mm(a, bt, offs=ends))}
    ref = impls["torch"]().float()
    errs = {n: (impls[n]().float() - ref).abs().max().item() for n in ("ours", "pair")}
    fl = 2.0 * M * N * K
    res = {n: [] for n in impls}
    for r in range(3):
        for n in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            time.sleep(1.0)
            res[n].append(triton.testing.do_bench(impls[n], warmup=5, rep=30) * 1e3)
    med = {n: sorted(v)[1] for n, v in res.items()}
    print(f"E{E} {kind:6s} " + "  ".join(f"{n} {med[n]:7.1f} us ({fl/med[n]/1e6:4.0f})" for n in impls)
          + f" | pair/ours {med['ours']/med['pair']:.3f} ours/torch {med['torch']/med['ours']:.3f} pair/torch {med['torch']/med['pair']:.3f}"
          + f" | err {errs}", flush=True)
