"""Scratch: quick d64 non-causal (B4 S1024 H8 bf16) through ours or cuDNN, a few calls, for ncu."""
import os, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import attention
B, S, H, D = 4, 1024, 8, 64
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(4):
    if os.environ.get("WHO") == "cudnn":
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    else:
        attention.flash_attention(q, k, v)
torch.cuda.synchronize()
