"""One decode call for ncu: python ncu_one.py B L H KVH D Q PAGE(0=contig) PIPE(0/1); the call runs 3 times (ncu
profiles the last: --launch-skip 2)."""
import sys
import cupy
from attention import flash_attention_with_kvcache, decode_configs
from attention.decode_bench import _paged
from cukernels import dtypes

B, L, H, KVH, D, Q, PAGE, PIPE = (int(x) for x in sys.argv[1:9])
decode_configs.WARP_PIPE = bool(PIPE)
dt = dtypes.from_name("bf16")
q = dtypes.random((B, Q, H, D), dt, seed=0)
k = dtypes.random((B, L, KVH, D), dt, seed=1)
v = dtypes.random((B, L, KVH, D), dt, seed=2)
lens = cupy.full((B,), L, dtype=cupy.int32)
table = None
if PAGE:
    k, v, table = _paged({"k": k, "v": v}, PAGE, seed=PAGE)
for _ in range(3):
    flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
cupy.cuda.Device().synchronize()
