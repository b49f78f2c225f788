"""Scratch (stop 45): the backward with uniform-register descriptors (new tree) against HEAD's sources
(scratch/old45), same planned config; interleaved rounds, held with the L2 flushed; do_bench medians too."""
import json, os
from pathlib import Path
import numpy as np
import torch
from attention import configs
from attention.api import ForwardCall, validate
from attention import backward as bw
from cukernels import compile as _compile, device, launch, timing

OUT = os.environ.get("OUT", "/tmp")
spec = device.current()
OLD = Path("scratch/old45").resolve()
_orig = _compile.kernel
CUR = [None]
def _patched(src, name, *, options=()):
    if CUR[0] is not None and ("flash_bwd_tma" in name or "flash_fwd_tma" in name):
        src = CUR[0] / Path(src).name
    return _orig(src, name, options=options)
_compile.kernel = _patched
cases = [(64, 4, 1024, 8, 8, False), (64, 8, 2048, 16, 16, True), (128, 4, 2048, 8, 8, False), (128, 2, 4096, 16, 16, True),
         (128, 1, 8192, 16, 16, False), (256, 2, 1024, 4, 4, False), (256, 1, 8192, 8, 8, False), (256, 2, 4096, 8, 8, True)]
DT = torch.float16 if os.environ.get("FP16") else torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
rows = []
for d, B, S, H, KVH, causal in cases:
    torch.manual_seed(0)
    q = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    k, v = (torch.randn(B, S, KVH, d, device="cuda", dtype=DT) for _ in range(2))
    do = torch.randn(B, S, H, d, device="cuda", dtype=DT)
    prob = validate(q, k, v, causal=causal, window=None, segment_ids=None, softmax_scale=None)
    fcall = ForwardCall(q, k, v, prob, configs.plan_forward(prob, spec), None, None)
    o, lse = fcall(*[launch.view(x)[1] for x in (q, k, v)], None)
    bprob = bw.validate_backward(do, q, k, v, o, lse, causal=causal)
    ptrs = tuple(launch.view(x)[1] for x in (do, q, k, v, o))
    fns, grads = {}, {}
    for name, src in (("new", None), ("old", OLD)):
        CUR[0] = src
        call = bw.BackwardCall(do, q, k, v, o, lse, bprob, None, None, None, False)
        grads[name] = [g.float() for g in call(ptrs, lse, None)]
        fns[name] = (lambda call=call: call(ptrs, lse, None))
    CUR[0] = None
    qr, kr, vr = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=True)
    ref.backward(do.float().transpose(1, 2))
    refg = [x.grad.transpose(1, 2) for x in (qr, kr, vr)]
    err = {n: max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads[n], refg)) for n in grads}
    assert max(err.values()) < 0.02, err
    us = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n, f in fns.items():
            us[n].append(timing.benchmark(f, budget_ms=150, min_samples=10).median_ms * 1e3)
    from triton.testing import do_bench
    db = {n: do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3 for n, f in fns.items()}
    gain = float(np.median([us["old"][r] / us["new"][r] for r in range(ROUNDS)]))
    med = {n: float(np.median(x)) for n, x in us.items()}
    rows.append(dict(d=d, B=B, S=S, H=H, KVH=KVH, causal=causal, us=med, do_bench_us=db, old_over_new=gain,
                     rel_err=err, dtype=str(DT)))
    print(f"bwd d{d} B{B} S{S} H{H}/{KVH} {'causal' if causal else 'full'}: new {med['new']:.1f} old {med['old']:.1f} "
          f"old/new {gain:.3f}  do_bench new/old {db['new']:.1f}/{db['old']:.1f}  err {err['new']:.4f}/{err['old']:.4f}",
          flush=True)
json.dump(rows, open(f"{OUT}/s45_bwd{os.environ.get('TAG', '')}.json", "w"), indent=1)
