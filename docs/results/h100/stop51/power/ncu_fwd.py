import torch, attention
from torch.nn.attention import sdpa_kernel, SDPBackend
g = torch.Generator(device="cuda").manual_seed(0)
dt = torch.bfloat16
q = torch.randn(16, 2048, 16, 64, device="cuda", dtype=dt, generator=g)
k = torch.randn_like(q); v = torch.randn_like(q)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
for _ in range(3):
    attention.flash_attention(q, k, v, causal=True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
torch.cuda.synchronize()
