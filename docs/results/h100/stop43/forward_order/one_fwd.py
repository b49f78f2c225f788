"""quick_d64 / quick_d128 non-causal forward: ours (planned) then cuDNN, a few calls each (for ncu)."""
import sys, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import attention.torch as at
d = int(sys.argv[1]) if len(sys.argv) > 1 else 64
kvh = 8 if d == 64 else 2
q = torch.randn(4, 1024, 8, d, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(4, 1024, kvh, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
for _ in range(4):
    at.flash_attention(q, k, v)
for _ in range(4):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
torch.cuda.synchronize()
