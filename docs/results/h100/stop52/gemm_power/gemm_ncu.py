import torch
from moe import grouped_gemm
M, N, K, E = 8192, 11008, 4096, 32
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.05
off = torch.arange(0, M + 1, M // E, device="cuda", dtype=torch.int32)
for _ in range(3):
    grouped_gemm(a, b, off); torch._grouped_mm(a, b.transpose(1, 2), offs=off[1:].contiguous())
torch.cuda.synchronize()
