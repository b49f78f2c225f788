"""Forward kernel variants (VARIANTS="name=path of flash_fwd_tma.cu,...", "new" = the tree) held (cool, turns) and
sustained at the power cap, cuDNN beside: time per call, clock, power, energy per call."""
import os, sys, time
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention.api import ForwardCall, validate
from attention import api as _api
from cukernels import device, launch, timing
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from power_probe import sustained  # noqa: E402

spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
VARIANTS = {"new": None}
for item in filter(None, os.environ.get("VARIANTS", "").split(",")):
    n, p = item.split("=")
    VARIANTS[n] = p
_orig = _api._compile.kernel
CUR = [None]
def _patched(src, name, *, options=()):
    if "flash_fwd_tma" in name and CUR[0] is not None:
        src = CUR[0]
    return _orig(src, name, options=options)
_api._compile.kernel = _patched
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
cases = [(64, 16, 2048, 16, 16, True), (128, 16, 2048, 8, 8, False)]
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt.float(), kt.float(), vt.float(), is_causal=causal).transpose(1, 2)
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    plan = configs.plan_forward(prob, spec)
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    fns = {}
    for name, src in VARIANTS.items():
        CUR[0] = src
        call = ForwardCall(q, k, v, prob, plan, None, None)
        o, _ = call(*ptrs, None)
        err = (o.float() - ref).abs().max().item()
        assert err < 0.02, (name, err)
        fns[name] = (lambda call=call: call(*ptrs, None))
    CUR[0] = None
    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, is_causal=causal)
    fns["cudnn"] = cudnn
    names = list(fns)
    held = {n: [] for n in names}
    for r in range(5):
        for n in names[r % len(names):] + names[:r % len(names)]:
            held[n].append(timing.benchmark(fns[n], budget_ms=60, warmup_ms=10).median_ms * 1e3)
    print(f"== d{d} B{B} S{S} H{H} {'causal' if causal else 'full'} {str(plan.config)}; held cool: "
          + "  ".join(f"{n} {np.median(held[n]):.1f}" for n in names), flush=True)
    for r in range(2):
        for n in (names if r == 0 else names[::-1]):
            time.sleep(2)
            per_call, clk, p, mj, temp, reasons = sustained(fns[n])
            print(f"  r{r} {n:8s} {per_call:7.1f} us/call {clk:6.0f} MHz {p:5.0f} W {mj:7.2f} mJ/call", flush=True)
