"""Scratch (stop 44): 80-key K/V tiles (FA3's head-dim-256 choice) against the planned tiles, beside cuDNN;
interleaved rounds, held (L2 flushed), ratio to cuDNN per round then the median; do_bench once at the end."""
import json, os
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from attention import configs
from attention.api import ForwardCall, validate
from cukernels import tiling, device, launch, timing

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
F = torch.nn.functional.scaled_dot_product_attention
T = configs.FwdTmaConfig
cases = [(256, 8, 2048, 4, 4, False), (256, 8, 2048, 4, 4, True), (256, 2, 1024, 4, 4, False), (256, 1, 8192, 8, 8, False),
         (256, 2, 4096, 8, 8, True), (128, 4, 1024, 8, 2, False), (128, 1, 8192, 32, 8, False), (128, 4, 2048, 8, 8, False),
         (128, 4, 1024, 8, 2, True)]
if os.environ.get("N176"):
    cases = [(128, 4, 1024, 8, 2, False), (128, 1, 8192, 32, 8, False), (128, 4, 2048, 8, 8, False),
             (128, 1, 16384, 16, 16, False), (128, 8, 4096, 32, 8, False), (128, 2, 1024, 8, 8, False)]
if os.environ.get("D64"):
    cases = [(64, 4, 1024, 8, 8, False), (64, 2, 1024, 8, 8, False), (64, 8, 1024, 8, 8, False), (64, 4, 2048, 8, 8, False),
             (64, 1, 4096, 16, 16, False), (64, 16, 2048, 16, 16, False), (64, 4, 1024, 8, 8, True)]
if os.environ.get("ONLY"):
    cases = [c for c in cases if c[0] == int(os.environ["ONLY"])]
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    planned = configs.plan_forward(prob, spec).config
    if d == 256:
        variants = [("planned", planned), ("n80", T(head_dim=256, block_n=80, stages=2)),
                    ("n80 nopp", T(head_dim=256, block_n=80, stages=2, pingpong=False))]
    elif d == 64:
        M64 = dict(head_dim=64, consumers=1, pingpong=False)
        variants = [("planned", planned), ("m64 n192", T(block_n=192, stages=2, **M64)),
                    ("m128 n192 pp", T(head_dim=64, block_n=192, stages=2)),
                    ("m128 n192", T(head_dim=64, block_n=192, stages=2, pingpong=False))]
    elif os.environ.get("N176"):
        variants = [("planned", planned), ("n176", T(head_dim=128, block_n=176, stages=2)),
                    ("n176 nopp", T(head_dim=128, block_n=176, stages=2, pingpong=False)),
                    ("n128 one", T(head_dim=128, block_n=128, stages=2))]
    else:
        variants = [("planned", planned)] + [(f"n80 s{s}", T(head_dim=128, block_n=80, stages=s)) for s in (2, 3, 4)] + [
            (f"n80 s{s} pers", T(head_dim=128, block_n=80, stages=s, persistent=True)) for s in (2, 3)]
    ptrs = [launch.view(x)[1] for x in (q, k, v)]
    fns = {}
    for name, c in variants:
        plan = tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=0, reason="ab")
        try:
            call = ForwardCall(q, k, v, prob, plan, None, None)
            o, _ = call(*ptrs, None)
        except Exception as e:
            print(name, "failed:", str(e)[:200]); continue
        err = (o.float() - ref.float()).abs().max().item()
        print(f"  d{d} B{B} S{S} {name} {str(c)[13:-1]} max err {err:.4f}", flush=True)
        assert err < 0.03, (name, err)
        fns[name] = (lambda call=call: call(*ptrs, None))

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F(qt, kt, vt, is_causal=causal, enable_gqa=True)
    fns["cudnn"] = cudnn
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            us[n].append(timing.benchmark(f, budget_ms=100, min_samples=10).median_ms * 1e3)
    ratio = {n: float(np.median([us["cudnn"][r] / us[n][r] for r in range(ROUNDS)])) for n in fns}
    med = {n: float(np.median(x)) for n, x in us.items()}
    fl = 4 * B * S * S * H * d * (0.5 if causal else 1.0)
    rows.append(dict(d=d, B=B, S=S, H=H, KVH=KVH, causal=causal, planned=str(planned), us=med, x_cudnn=ratio))
    print(f"d{d} B{B} S{S} H{H}/{KVH} {'causal' if causal else 'full'} (planned {str(planned)[13:-1]}): " +
          "  ".join(f"{n} {med[n]:.1f} ({ratio[n]:.3f}, {fl / med[n] / 1e6:.0f} TF)" for n in fns), flush=True)
json.dump(rows, open(f"{OUT}/{'d64' if os.environ.get('D64') else 'n176' if os.environ.get('N176') else 'n80'}_ab{'_fp16' if os.environ.get('FP16') else ''}.json", "w"), indent=1)
