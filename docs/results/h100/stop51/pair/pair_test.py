"""flash_fwd_tma_pair: correctness (bitwise against the same one-consumer tile without pairs, and against fp32),
then seed004_a causal held cool and at the power cap: planned / pair / cuDNN."""
import os, sys, time
import numpy as np
import torch
import attention
from attention import configs
from cukernels import device as dev, tiling, timing
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from power_probe import sustained  # noqa: E402

spec = dev.current()
base = configs.FwdTmaConfig(head_dim=64, block_n=64, stages=2, pingpong=False, consumers=1, ctas_per_sm=3)
pair = configs.FwdTmaConfig(head_dim=64, block_n=64, stages=2, pingpong=False, consumers=1, ctas_per_sm=3, cluster=2)
plan = lambda c: tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=spec.smem_per_block_optin, reason="test")
F = torch.nn.functional.scaled_dot_product_attention
shapes = [] if os.environ.get("NOCHECK") else [(2, 1024, 1024, 4, 4, True), (2, 1024, 1024, 4, 4, False), (1, 2048, 2048, 8, 2, True),
          (2, 512, 1024, 4, 4, True), (3, 256, 256, 2, 1, True), (1, 128, 384, 2, 2, False)]
ok = True
for dt in (torch.bfloat16, torch.float16):
    for B, Sq, Skv, H, KVH, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, Sq, H, 64, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, Skv, KVH, 64, device="cuda", dtype=dt, generator=g)
        v = torch.randn_like(k)
        ob, lb = attention.flash_attention(q, k, v, causal=causal, plan=plan(base), return_lse=True)
        op, lp = attention.flash_attention(q, k, v, causal=causal, plan=plan(pair), return_lse=True)
        for _ in range(3):  # rerun: the same bits every time
            op2 = attention.flash_attention(q, k, v, causal=causal, plan=plan(pair))
            ok &= bool(torch.equal(op2, op))
        qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
        if KVH != H:
            kt, vt = (x.repeat_interleave(H // KVH, dim=1) for x in (kt, vt))
        # bottom-right causal as the kernels take it
        mask = None
        if causal:
            i = torch.arange(Sq, device="cuda")[:, None] + (Skv - Sq); j = torch.arange(Skv, device="cuda")[None]
            mask = j <= i
        ref = F(qt, kt, vt, attn_mask=mask).transpose(1, 2)
        err = float((op.float() - ref).abs().max())
        same = bool(torch.equal(op, ob)) and bool(torch.equal(lp, lb))
        ok &= same and err < 0.02
        print(f"{str(dt)[6:]} B{B} Sq{Sq} Skv{Skv} H{H}/{KVH} {'causal' if causal else 'full'}: bitwise = base {same}, "
              f"max err vs fp32 {err:.1e}", flush=True)
print("CORRECT" if ok else "WRONG", flush=True)
if os.environ.get("SMALL") or not ok:
    sys.exit(0 if ok else 1)
B, S, H = 16, 2048, 16
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(B, S, H, 64, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn_like(q); v = torch.randn_like(q)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
def cud():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F(qt, kt, vt, is_causal=True)
fns = {"planned": lambda: attention.flash_attention(q, k, v, causal=True)}
for st in [int(x) for x in os.environ.get("STAGES", "2").split(",")]:
    for cl in (1, 2):
        c = configs.FwdTmaConfig(head_dim=64, block_n=64, stages=st, pingpong=False, consumers=1, ctas_per_sm=3,
                                 cluster=cl)
        fns[f"s{st}{' pair' if cl > 1 else ''}"] = (lambda c=c: attention.flash_attention(q, k, v, causal=True,
                                                                                        plan=plan(c)))
_orig = attention.api._compile.kernel
CUR = [None]
def _patched(src, name, *, options=()):
    if "flash_fwd_tma" in name and CUR[0] is not None:
        src = CUR[0]
    return _orig(src, name, options=options)
attention.api._compile.kernel = _patched
from attention.api import ForwardCall, validate
from cukernels import launch as _launch
prob = validate(q, k, v, causal=True, window=None, segment_ids=None, softmax_scale=None)
ptrs = [_launch.view(x)[1] for x in (q, k, v)]
for item in filter(None, os.environ.get("PVARIANTS", "").split(",")):
    vn, src = item.split("=")
    CUR[0] = src
    call = ForwardCall(q, k, v, prob, plan(pair), None, None)
    CUR[0] = None
    fns[vn] = (lambda call=call: call(*ptrs, None))
fns["cudnn"] = cud
names = list(fns)
held = {n: [] for n in names}
for r in range(5):
    for n in names[r % len(names):] + names[:r % len(names)]:
        held[n].append(timing.benchmark(fns[n], budget_ms=60, warmup_ms=10).median_ms * 1e3)
print("held cool: " + "  ".join(f"{n} {np.median(held[n]):.1f} {[round(x) for x in held[n]]}" for n in names), flush=True)
for r in range(int(os.environ.get('SUSTAIN', '2'))):
    for n in (names if r == 0 else names[::-1]):
        time.sleep(2)
        per_call, clk, p, mj, temp, reasons = sustained(fns[n])
        print(f"  r{r} {n:8s} {per_call:7.1f} us/call {clk:6.0f} MHz {p:5.0f} W {mj:7.2f} mJ/call", flush=True)
