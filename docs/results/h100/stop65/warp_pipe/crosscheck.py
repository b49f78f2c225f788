"""Issue 12 cross-check of the warp pipe on torch tensors through the public API: held (our timer), as called
(back-to-back calls) and triton's do_bench, the pipe forced on and off, same process, outputs compared."""
import json, sys
import numpy as np
import torch
import triton.testing
from attention import flash_attention_with_kvcache, kvcache, decode_configs
from cukernels import timing

ROWS = [(1, 1024, 32, 8, 128, 1, 16), (1, 1024, 16, 16, 64, 4, 16), (1, 8192, 16, 16, 64, 1, 16),
        (8, 1024, 16, 16, 64, 1, 16), (1, 8192, 16, 16, 256, 1, None)]
out = []
for B, L, H, KV, D, SQ, page in ROWS:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, SQ, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, L, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, L, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    table = None
    if page:
        per = L // page
        rng = np.random.default_rng(page)
        table = torch.tensor(np.stack([i * per + rng.permutation(per) for i in range(B)]), dtype=torch.int32, device="cuda")
        k, v = k.reshape(B * per, page, KV, D), v.reshape(B * per, page, KV, D)
    res, outs = {}, {}
    for pipe in (False, True, False, True):
        decode_configs.WARP_PIPE = pipe
        kvcache._CACHE.clear()
        fn = lambda: flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
        outs[pipe] = fn().float()
        held = timing.benchmark(fn, budget_ms=150).median_ms * 1e3
        called = timing.as_called(fn) * 1e3
        db = triton.testing.do_bench(fn, warmup=50, rep=200) * 1e3
        res.setdefault(pipe, []).append((held, called, db))
    decode_configs.WARP_PIPE = None
    err = float((outs[True] - outs[False]).abs().max())
    med = {p: [float(np.median([r[i] for r in res[p]])) for i in range(3)] for p in res}
    name = f"B{B} L{L} {H}/{KV} d{D} q{SQ} {'p%d' % page if page else 'contig'}"
    print(f"{name}: CTA copies held/as called/do_bench {med[False][0]:.2f}/{med[False][1]:.2f}/{med[False][2]:.2f} us; "
          f"warp pipe {med[True][0]:.2f}/{med[True][1]:.2f}/{med[True][2]:.2f}; ratios "
          + "/".join(f"{med[True][i] / med[False][i]:.3f}" for i in range(3)) + f"; max |diff| {err:.1e}", flush=True)
    out.append({"case": name, "cta": med[False], "pipe": med[True], "max_abs_diff": err})
json.dump(out, open(sys.argv[1], "w"), indent=1)
