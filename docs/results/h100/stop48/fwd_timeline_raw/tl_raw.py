"""Raw per-CTA stamps of the TMA forward (tools/fwd_timeline.py's probe) saved as .npy, plus cuDNN's time for the
same call. argv: batch,seq,heads,kv_heads,head_dim causal(0/1) out.npy"""
import sys, importlib.util, numpy as np
spec = importlib.util.spec_from_file_location("fwd_timeline", "tools/fwd_timeline.py")
tl = importlib.util.module_from_spec(spec); spec.loader.exec_module(tl)
import cupy, torch
from attention import flash_attention
from cukernels import dtypes, timing
B, S, H, KVH, D = (int(x) for x in sys.argv[1].split(","))
causal = sys.argv[2] == "1"
built = tl._instrumented(65536)
t = dtypes.from_name("bf16")
q = dtypes.random((B, S, H, D), t, seed=1)
k, v = (dtypes.random((B, S, KVH, D), t, seed=s) for s in (2, 3))
flash_attention(q, k, v, causal=causal)
st = tl._stamps(built[-1], 65536)
res = []
for r in range(3):
    st.fill(0); timing.flush_l2()
    flash_attention(q, k, v, causal=causal); cupy.cuda.runtime.deviceSynchronize()
    res.append(cupy.asnumpy(st).copy())
np.save(sys.argv[3], np.stack(res))
print(built[-1].name_expression, tl.summarize(res[-1])["kernel_us"])
qt, kt, vt = (torch.randn(B, H if i == 0 else KVH, S, D, device="cuda", dtype=torch.bfloat16) for i in range(3))
from torch.nn.attention import sdpa_kernel, SDPBackend
def cud():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
def ours():
    return flash_attention(q, k, v, causal=causal)
print("cudnn held us", timing.benchmark(cud, budget_ms=100).median_ms * 1e3, "ours held us (probe build)", timing.benchmark(ours, budget_ms=100).median_ms * 1e3)
