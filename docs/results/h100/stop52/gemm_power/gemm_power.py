"""Grouped GEMM at the power cap: ours against torch._grouped_mm (and cuBLAS for one group), M 8192 N 11008 K 4096
bf16, equal groups. Cool: triton do_bench after COOL s idle (short rep). Sustained: power_probe.sustained (us/call,
MHz, W, mJ/call over the last half of SECS s). Outputs compared."""
import os, sys, time
sys.path.insert(0, "docs/results/h100/stop51/power")
import torch, triton
from power_probe import sustained
from moe import grouped_gemm
COOL = float(os.environ.get("COOL", "3"))
M, N, K = 8192, 11008, 4096
g = torch.Generator(device="cuda").manual_seed(0)
print(torch.cuda.get_device_name())
for E in [int(x) for x in os.environ.get("EXPERTS", "1,8,32").split(",")]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    off = torch.arange(0, M + 1, M // E, device="cuda", dtype=torch.int32)
    ends = off[1:].contiguous()
    bt = b.transpose(1, 2)
    impls = {"ours": lambda: grouped_gemm(a, b, off), "torch-grouped": lambda: torch._grouped_mm(a, bt, offs=ends)}
    if E == 1:
        impls["cublas"] = lambda: a @ b[0].T
    ref = impls["torch-grouped"]().float()
    err = (impls["ours"]().float() - ref).abs().max().item()
    fl = 2.0 * M * N * K
    print(f"== E{E} equal (max abs diff ours vs torch-grouped {err:.3g})", flush=True)
    for r in range(2):
        for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            time.sleep(COOL)
            t = triton.testing.do_bench(impls[name], warmup=5, rep=40)
            per_call, clk, p, mj, temp, reasons = sustained(impls[name])
            print(f"  round {r} {name:13s} cool {t*1e3:7.1f} us ({fl/t/1e9:4.0f} TFLOP/s) | sustained {per_call:7.1f} us/call"
                  f" ({fl/per_call/1e6:4.0f})  {clk:5.0f} MHz  {p:4.0f} W  {mj:6.1f} mJ/call  {temp} C  {reasons}", flush=True)
