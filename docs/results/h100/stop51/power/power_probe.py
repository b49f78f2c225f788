"""Sustained power and clock of ours against cuDNN on the same problem: each implementation runs back to back for
SECS seconds (a sync every few calls), NVML sampled every 50 ms; reported over the last half of each run: time per
call (wall, back to back), SM clock, power, and energy per call. Turns alternate, COOL seconds of idle between."""
import os, sys, time
import numpy as np
import torch
import attention
from attention import backward
from cukernels import device as dev
from torch.nn.attention import sdpa_kernel, SDPBackend

SECS = float(os.environ.get("SECS", "3"))
COOL = float(os.environ.get("COOL", "3"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
dt = torch.float16 if os.environ.get("DT") == "fp16" else torch.bfloat16
g = torch.Generator(device="cuda").manual_seed(0)

def problem(B, S, H, D, causal, bwd):
    q = torch.randn(B, S, H, D, device="cuda", dtype=dt, generator=g)
    k = torch.randn_like(q); v = torch.randn_like(q); do = torch.randn_like(q)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(bwd) for x in (q, k, v))
    dot = do.transpose(1, 2)
    if bwd:
        def ours():
            o, lse = attention.flash_attention(q, k, v, causal=causal, return_lse=True)
            return backward.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
        def cud():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                return torch.autograd.grad(out, (qt, kt, vt), dot)
    else:
        ours = lambda: attention.flash_attention(q, k, v, causal=causal)
        def cud():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return {"ours": ours, "cudnn": cud}

def sustained(fn):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter(); samples = []; calls = []; last = t0
    n = 0
    while True:
        for _ in range(8): fn()
        torch.cuda.synchronize(); n += 8
        now = time.perf_counter()
        calls.append((now, n))
        if now - last >= 0.05:
            s = dev.nvml_sample(0); s["t"] = now - t0; samples.append(s); last = now
        if now - t0 >= SECS: break
    half = [s for s in samples if s["t"] >= SECS / 2]
    c0 = next(c for c in calls if c[0] - t0 >= SECS / 2); c1 = calls[-1]
    per_call = (c1[0] - c0[0]) / (c1[1] - c0[1]) * 1e6
    p = np.mean([s.get("power_w", 0) for s in half]); clk = np.mean([s.get("sm_clock_mhz", 0) for s in half])
    reasons = sorted({r for s in half for r in s.get("throttle_reasons", [])})
    return per_call, clk, p, p * per_call / 1e6 * 1e3, samples[-1].get("temperature_c"), reasons

_DEFAULT = "fwd_seed004a_causal:16,2048,16,64,1,0;fwdbwd_hb125m_noncausal:16,2048,8,128,0,1"
_CASES = [(c.split(":")[0], tuple(int(x) for x in c.split(":")[1].split(",")))
          for c in os.environ.get("CASES", _DEFAULT).split(";")]
for label, (B_, S_, H_, D_, c_, b_) in (_CASES if __name__ == "__main__" else []):  # imported: sustained() only
    args = (B_, S_, H_, D_, bool(c_), bool(b_))
    impls = problem(*args)
    print(f"== {label} {dt}")
    for r in range(ROUNDS):
        for name in (["ours", "cudnn"] if r % 2 == 0 else ["cudnn", "ours"]):
            time.sleep(COOL)
            per_call, clk, p, mj, temp, reasons = sustained(impls[name])
            print(f"  round {r} {name:6s} {per_call:8.1f} us/call  {clk:6.0f} MHz  {p:5.0f} W  {mj:6.2f} mJ/call  {temp} C  {reasons}", flush=True)
