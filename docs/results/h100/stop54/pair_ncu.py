import os, torch
from moe import grouped_gemm, gemm_configs
E = int(os.environ.get("E", "8"))
M, N, K = 8192, 11008, 4096
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.05
off = torch.arange(0, M + 1, M // E, device="cuda", dtype=torch.int32)
ends = off[1:].contiguous(); bt = b.transpose(1, 2)
for _ in range(2):
    grouped_gemm(a, b, off); grouped_gemm(a, b, off, config=gemm_configs.TMA_PAIR[0]); torch._grouped_mm(a, bt, offs=ends)
torch.cuda.synchronize()
