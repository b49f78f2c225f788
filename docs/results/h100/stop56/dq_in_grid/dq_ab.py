"""A/B in one process: the autograd fwd+bwd with dQ converted in the dK/dV grid (2 launches) against the
conversion launched (3), interleaved rounds with SDPA's own choice, host us per call (timing.host_us)."""
import json, os, sys
import numpy as np
import torch
import torch.nn.functional as F
import cupy
sys.path.insert(0, ".")
import attention.torch as at
from attention import backward as bw
from cukernels import timing

ROUNDS = 25
tq, tk, tv = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))
do = torch.randn_like(tq)
def fb():
    o = at.flash_attention(gq, gk, gv, causal=True)
    return torch.autograd.grad(o, (gq, gk, gv), do)
g_in = fb()
(key, call_in), = bw._BACKWARD_AFTER._entries.items()
assert call_in.dq_in_grid and len(call_in.steps) == 2
saved = bw.DQ_CONVERT_IN_GRID_BYTES
bw.DQ_CONVERT_IN_GRID_BYTES = 0
bw._BACKWARD_AFTER.clear()
g_out = fb()
(_, call_out), = bw._BACKWARD_AFTER._entries.items()
assert not call_out.dq_in_grid and len(call_out.steps) == 3
bw.DQ_CONVERT_IN_GRID_BYTES = saved
err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(g_in, g_out))
print("max |in-grid - launched| over dq, dk, dv:", err)
hq, hk, hv = (t.transpose(1, 2).clone().requires_grad_() for t in (tq, tk, tv))
hdo = do.transpose(1, 2)
def sdpa():
    o = F.scaled_dot_product_attention(hq, hk, hv, is_causal=True)
    return torch.autograd.grad(o, (hq, hk, hv), hdo)
rows = {"ours, dQ converted in the grid (2 launches)": call_in, "ours, dQ conversion launched (3 launches)": call_out,
        "torch SDPA (its own backend choice)": None}
res = {n: [] for n in rows}
for r in range(ROUNDS):
    for name, c in rows.items():
        fn = sdpa if c is None else fb
        if c is not None:
            bw._BACKWARD_AFTER._entries[key] = c
        fn(); cupy.cuda.Device().synchronize()
        us, held = timing.host_us(fn, per_call_ms=0.3, repeats=1)
        res[name].append(us)
s = np.asarray(res["torch SDPA (its own backend choice)"])
out = []
for name in rows:
    h = np.asarray(res[name])
    out.append({"row": name, "host us median": round(float(np.median(h)), 1),
                "p20-p80": f"{np.percentile(h, 20):.1f}-{np.percentile(h, 80):.1f}",
                "median of (row - SDPA) per round": round(float(np.median(h - s)), 1)})
from tabulate import tabulate
print(tabulate(out, headers="keys", tablefmt="github"))
if os.environ.get("OUT"):
    json.dump({"rows": out, "raw": res, "max_abs_diff": err}, open(os.environ["OUT"] + "/dq_ab.json", "w"), indent=1)
