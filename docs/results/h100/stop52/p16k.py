"""Forward TFLOP/s at head dim 128, 8k and 16k keys, non-causal (issue 13's 600 TFLOP/s line): ours (as called,
torch tensors) against torch SDPA cuDNN and flash, triton do_bench, same process; outputs compared."""
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import flash_attention
print(torch.cuda.get_device_name())
for dt in (torch.bfloat16, torch.float16):
    for S in (8192, 16384):
        g = torch.Generator(device="cuda").manual_seed(S)
        q = torch.randn(1, S, 32, 128, device="cuda", dtype=dt, generator=g)
        k = torch.randn(1, S, 8, 128, device="cuda", dtype=dt, generator=g)
        v = torch.randn(1, S, 8, 128, device="cuda", dtype=dt, generator=g)
        fl = 4.0 * S * S * 32 * 128
        o = flash_attention(q, k, v, causal=False)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        row = [f"{str(dt)[6:]} S{S}"]
        ref = None
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                r = fn().transpose(1, 2)
                ref = r if ref is None else ref
                t = triton.testing.do_bench(fn, warmup=25, rep=200)
            row.append(f"{name} {fl / t / 1e9:.0f}")
        t = triton.testing.do_bench(lambda: flash_attention(q, k, v, causal=False), warmup=25, rep=200)
        err = (o.float() - ref.float()).abs().max().item()
        row.append(f"ours {fl / t / 1e9:.0f} TFLOP/s (max abs diff vs cudnn {err:.4f})")
        print(" | ".join(row), flush=True)
