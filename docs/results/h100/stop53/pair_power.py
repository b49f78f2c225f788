"""B-multicast pair (TMA_PAIR) vs the planner's tma tile vs torch._grouped_mm, cool (do_bench) and sustained at the
cap (power_probe.sustained), M 8192 N 11008 K 4096 bf16 equal groups; outputs compared."""
import os, sys, time
sys.path.insert(0, "docs/results/h100/stop51/power")
import torch, triton
from power_probe import sustained
from moe import grouped_gemm, gemm_configs
COOL = float(os.environ.get("COOL", "2"))
M, N, K = 8192, 11008, 4096
g = torch.Generator(device="cuda").manual_seed(0)
print(torch.cuda.get_device_name())
for E in [int(x) for x in os.environ.get("EXPERTS", "8,32").split(",")]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    off = torch.arange(0, M + 1, M // E, device="cuda", dtype=torch.int32)
    ends = off[1:].contiguous()
    bt = b.transpose(1, 2)
    impls = {"ours": lambda: grouped_gemm(a, b, off),
             "ours-pair": lambda: grouped_gemm(a, b, off, config=gemm_configs.TMA_PAIR[0]),
             "torch-grouped": lambda: torch._grouped_mm(a, bt, offs=ends)}
    ref = impls["torch-grouped"]().float()
    for n in ("ours", "ours-pair"):
        print(f"E{E} max abs diff {n} vs torch-grouped {(impls[n]().float() - ref).abs().max().item():.3g}")
    fl = 2.0 * M * N * K
    for r in range(2):
        for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            time.sleep(COOL)
            t = triton.testing.do_bench(impls[name], warmup=5, rep=40)
            per_call, clk, p, mj, temp, reasons = sustained(impls[name])
            print(f"  E{E} round {r} {name:13s} cool {t*1e3:7.1f} us ({fl/t/1e9:4.0f} TFLOP/s) | sustained {per_call:7.1f} us/call"
                  f" ({fl/per_call/1e6:4.0f})  {clk:5.0f} MHz  {p:4.0f} W  {mj:6.1f} mJ/call  {temp} C  {reasons}", flush=True)
