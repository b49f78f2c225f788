"""Backward A/B: the dK/dV kernel from the tree vs from scratch/oldbwd (HEAD's kernels), same process, interleaved
rounds, held device time of the backward alone (preprocess + dK/dV (+dQ) + conversion), L2 flushed; gradients
compared (dK, dV bitwise; dQ within fp32 reduction order). CASES=name[:causal|nocausal],... DTYPES=bf16,fp16"""
import os, sys
from pathlib import Path
import numpy as np
import cupy as cp
from cukernels import timing, launch
import attention
from attention import backward, suites

ROUNDS = int(os.environ.get("ROUNDS", "3"))
NPROF = int(os.environ.get("NPROF", "10"))
from attention.bwd_configs import BwdTmaConfig, plan_backward
from cukernels import tiling, device as _device
# VARIANTS="name=kernels-dir[@stages],...": "." is the tree's attention/kernels
VARIANTS = {}
for item in os.environ.get("VARIANTS", "old=scratch/oldbwd/attention/kernels,new=.").split(","):
    vn, _, rest = item.partition("=")
    path, _, stages = rest.partition("@")
    src = backward.KERNEL_SOURCE if path == "." else (Path(path) / "flash_bwd.cu").resolve()
    st, _, bm = stages.partition(":")
    bm, _, pers = bm.partition(":")
    VARIANTS[vn] = (src, (int(st), int(bm) if bm else None, pers == "p") if st else None)
default_src = backward.KERNEL_SOURCE
for spec in os.environ.get("CASES", "hb125m:nocausal,hb125m,qwen,seed004_b16_s2048_h16_d64,llama8b_long").split(","):
    name, _, mode = spec.partition(":")
    case = suites.get(name)
    causal = case.causal if not mode else mode == "causal"
    for dt in os.environ.get("DTYPES", "bf16,fp16").split(","):
        dtype = cp.float16 if dt == "fp16" else (cp.dtype("bfloat16") if hasattr(cp, "bfloat16") else None)
        import torch
        tdt = torch.float16 if dt == "fp16" else torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(case.batch, case.seq_q, case.heads, case.head_dim, device="cuda", dtype=tdt, generator=g)
        k = torch.randn(case.batch, case.n_seq_kv, case.n_kv_heads, case.head_dim, device="cuda", dtype=tdt, generator=g)
        v = torch.randn_like(k)
        do = torch.randn_like(q)
        seg = case.segment_ids()
        seg = None if seg is None else torch.as_tensor(seg, device="cuda")
        segs = None if seg is None else (seg, seg)
        o, lse = attention.flash_attention(q, k, v, causal=causal, window=case.window, segment_ids=segs, return_lse=True)
        calls, grads = {}, {}
        for vn, (src, stages) in VARIANTS.items():
            backward.KERNEL_SOURCE = src
            if stages is None:
                call = backward._new_call(do, q, k, v, o, lse, causal, case.window, segs, None, False)
            else:
                problem = backward.validate_backward(do, q, k, v, o, lse, causal=causal, window=case.window,
                                                     segment_ids=segs)
                base = plan_backward(problem, _device.current()).config
                cfg = BwdTmaConfig(head_dim=case.head_dim, block_m=stages[1] or base.block_m, stages=stages[0],
                                   persistent=stages[2])
                if tiling.fits(cfg, _device.current()) is not None:
                    print(f"  {vn}: {cfg} does not fit"); continue
                plan = tiling.Plan(config=cfg, smem_bytes=cfg.smem_bytes(), limit=232_448, reason="A/B")
                print("   ", vn, cfg, flush=True)
                if vn.endswith("full"):  # the persistent kernel on a grid of every tile: one tile per CTA
                    import dataclasses as _dc
                    real = _device.current
                    fake = _dc.replace(real(), sm_count=1 << 20)
                    backward._device.current = lambda: fake
                    try:
                        call = backward.BackwardCall(do, q, k, v, o, lse, problem, plan, None, segs, False)
                    finally:
                        backward._device.current = real
                else:
                    call = backward.BackwardCall(do, q, k, v, o, lse, problem, plan, None, segs, False)
            views = [launch.view(x) for x in (do, q, k, v, o)]
            ptrs = tuple(x[1] for x in views)
            fn = (lambda call=call, ptrs=ptrs: call(ptrs, lse, segs))
            calls[vn] = fn
            r = fn()
            torch.cuda.synchronize()
            grads[vn] = [x.float().clone() for x in r]
        backward.KERNEL_SOURCE = default_src
        names = list(calls)
        dq_o, dk_o, dv_o = grads[names[0]]
        chk = []
        for vn in names[1:]:
            dq_n, dk_n, dv_n = grads[vn]
            chk.append(f"{vn}: dKdV= {bool(torch.equal(dk_n, dk_o) and torch.equal(dv_n, dv_o))} dQ {float((dq_n - dq_o).norm() / dq_o.norm()):.0e}")
        times = {vn: [] for vn in calls}
        order = list(calls)
        for rnd in range(ROUNDS):
            for vn in order[rnd % len(order):] + order[:rnd % len(order)]:
                fn = calls[vn]
                for _ in range(3): fn()
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(NPROF): fn()
                    torch.cuda.synchronize()
                durs = [e.device_time for e in prof.events()
                        if e.device_type == torch.autograd.DeviceType.CUDA and "flash_bwd_tma" in e.name]
                times[vn].append(float(np.median(durs)) / 1e3)
        med = {vn: float(np.median(t)) for vn, t in times.items()}
        b0 = med[names[0]]
        print(f"{name} {'causal' if causal else 'nocausal'} {dt}: " + "  ".join(f"{vn} {med[vn]*1e3:.1f} ({med[vn]/b0:.3f})" for vn in names)
              + "  | " + "; ".join(chk), flush=True)
        print("   rounds: " + " ".join(f"{vn} {[round(x*1e3) for x in times[vn]]}" for vn in names), flush=True)
