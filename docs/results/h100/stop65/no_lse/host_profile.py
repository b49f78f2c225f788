"""Where the host time of a decode call goes (B1 L1k 32/8 d128 q1, paged 16 and contiguous): cProfile over N calls
through the public API with CuPy arrays and with torch tensors, check_values=False."""
import cProfile, pstats, io, time
import cupy
import torch
from attention import flash_attention_with_kvcache
from cukernels import dtypes

N = 3000
dt = dtypes.from_name("bf16")
q = dtypes.random((1, 1, 32, 128), dt, seed=0)
k = dtypes.random((1, 1024, 8, 128), dt, seed=1)
v = dtypes.random((1, 1024, 8, 128), dt, seed=2)
lens = cupy.full((1,), 1024, dtype=cupy.int32)
tq, tk, tv = (torch.as_tensor(x, device="cuda").view(torch.bfloat16) for x in (q, k, v))
tl = torch.as_tensor(lens, device="cuda")
for name, args, rl in (("cupy", (q, k, v, lens), False), ("torch", (tq, tk, tv, tl), False),
                       ("cupy, return_lse", (q, k, v, lens), True)):
    fn = lambda: flash_attention_with_kvcache(args[0], args[1], args[2], cache_seqlens=args[3], check_values=False,
                                              return_lse=rl)
    for _ in range(200):
        fn()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    t1 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    print(f"{name}: {1e6 * (t1 - t0) / N:.2f} us per call (host, no sync)", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(N):
        fn()
    pr.disable()
    cupy.cuda.Device().synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
    print(s.getvalue()[:3500], flush=True)
