"""seed004_a causal forward: the planned tile against the other TMA tiles and cuDNN, held (cool, short) and
sustained at the power cap (SECS seconds back to back, NVML over the second half)."""
import os, sys, time
import numpy as np
import torch
import attention
from attention import configs
from cukernels import device as dev, tiling, timing
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from power_probe import sustained  # noqa: E402  (its module body runs nothing with ROUNDS=0)

dt = torch.float16 if os.environ.get("DT") == "fp16" else torch.bfloat16
g = torch.Generator(device="cuda").manual_seed(0)
B, S, H, D = [int(x) for x in os.environ.get("SHAPE", "16,2048,16,64").split(",")]
causal = os.environ.get("CAUSAL", "1") == "1"
q = torch.randn(B, S, H, D, device="cuda", dtype=dt, generator=g)
k = torch.randn_like(q); v = torch.randn_like(q)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
spec = dev.current()
tiles = configs.tma_tiles(spec, D)
impls = {"planned": lambda: attention.flash_attention(q, k, v, causal=causal)}
ref = impls["planned"]().float()
for i in [int(x) for x in os.environ.get("TILES", "7,0,12").split(",")]:
    cfg = tiles[i]
    plan = tiling.Plan(config=cfg, smem_bytes=cfg.smem_bytes(), limit=spec.smem_per_block_optin, reason="probe")
    f = (lambda plan=plan: attention.flash_attention(q, k, v, causal=causal, plan=plan))
    err = float((f().float() - ref).abs().max())
    impls[f"t{i} {cfg}"] = f
    print(f"t{i} {cfg}: max diff vs planned {err:.1e}")
def cud():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
impls["cudnn"] = cud
names = list(impls)
print("held, cool (5 turns of 60 ms):")
held = {n: [] for n in names}
for r in range(5):
    for n in names[r % len(names):] + names[:r % len(names)]:
        held[n].append(timing.benchmark(impls[n], budget_ms=60, warmup_ms=10).median_ms * 1e3)
for n in names: print(f"  {n:45s} {np.median(held[n]):7.1f} us")
print("sustained at the cap:")
for r in range(2):
    for n in (names if r == 0 else names[::-1]):
        time.sleep(2)
        per_call, clk, p, mj, temp, reasons = sustained(impls[n])
        print(f"  r{r} {n:45s} {per_call:7.1f} us/call {clk:6.0f} MHz {p:5.0f} W {mj:7.2f} mJ/call {temp} C", flush=True)
