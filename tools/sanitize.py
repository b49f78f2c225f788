"""Small launches of every kernel family, for `compute-sanitizer --tool memcheck|racecheck python tools/sanitize.py`.

Run from the repository root with PYTHONPATH=. on a GPU. Each case is tiny (the sanitizer slows kernels by
100x or more) but reaches the edges: ragged tiles, empty groups, rows with no visible key, every mask kind.
The cases that encode TMA tensor maps load cuda-bindings, whose driver probes (`cuGetProcAddress` of symbols this
driver lacks) the sanitizer counts as host API errors ("Program hit CUDA_ERROR_INVALID_VALUE ... cuGetProcAddress",
34 in the gemm cases): `--report-api-errors no` leaves only the device-side findings in the summary.
"""
import dataclasses
import sys

import cupy
import numpy as np

from cukernels import bandwidth, cli, device, dtypes

PROG = "python tools/sanitize.py"

# head dim, dtype, masks: one small problem per head dim, each with a mask kind (causal, window, both)
_ATTENTION_SHAPES = ((64, "fp16", dict(causal=True)), (128, "bf16", dict(window=(40, 7))),
                     (256, "fp16", dict(causal=True, window=(50, 0))))


def _attention_inputs(d, dt, seq_q, seq_kv):
    """q [1, seq_q, 2, d], k and v [1, seq_kv, 1, d] (GQA), dO like q, packed segment ids over seq_kv (3 documents;
    the queries take the last seq_q of them, as at the end of a KV cache)."""
    from attention.suites import packed_segment_ids

    t = dtypes.from_name(dt)
    q, do = dtypes.random((1, seq_q, 2, d), t, seed=1), dtypes.random((1, seq_q, 2, d), t, seed=4)
    k, v = dtypes.random((1, seq_kv, 1, d), t, seed=2), dtypes.random((1, seq_kv, 1, d), t, seed=3)
    ids = cupy.asarray(packed_segment_ids(1, seq_kv, 3, seed=0))
    return q, k, v, do, (ids[:, seq_kv - seq_q:], ids)


def attention_cases():
    from attention import flash_attention

    for d, dt, kw in _ATTENTION_SHAPES:
        q, k, v, _, seg = _attention_inputs(d, dt, 150, 150)
        flash_attention(q, k, v, segment_ids=seg, **kw)
        flash_attention(q, k, v, **kw)
    for d in (64, 128, 256):  # CTAs whose rows see no key at all
        q = dtypes.random((1, 600, 2, d), dtypes.FP16, seed=4)
        k = dtypes.random((1, 50, 2, d), dtypes.FP16, seed=5)
        flash_attention(q, k, k, causal=True)
    tma_cases()


def _tma_device():
    """(device spec, cu_seqlens of a packed batch of three sequences, 100 / 1 / 299 tokens) where the TMA kernels
    run (sm_90a with cuda-bindings), else (None, None)."""
    from cukernels import tma

    spec = device.current()
    if spec.arch != "sm_90a" or tma.available() is not None:
        return None, None
    return spec, cupy.asarray(np.array([0, 100, 101, 400], dtype=np.int32))


def tma_cases():
    """The warp-specialised TMA forward (sm_90a with cuda-bindings), forced with each of its tiles: every mask
    kind, more KV tiles than stages, and a packed batch whose tiles reach into the next sequence."""
    from attention import configs, flash_attention, flash_attention_varlen
    from cukernels import tune

    spec, cu = _tma_device()
    if spec is None:
        return
    for d, dt, kw in _ATTENTION_SHAPES:
        q, k, v, _, seg = _attention_inputs(d, dt, 400, 700)
        qp, kp = q[0], k[0, :400]
        for c in configs.tma_tiles(spec, d):
            plan, masks = tune.explicit(c, spec), configs.kernel_masks(c)
            if configs.mask_of(**kw, segments=True) in masks:
                flash_attention(q, k, v, segment_ids=seg, plan=plan, **kw)
            if configs.mask_of(**kw) in masks:
                flash_attention(q, k, v, plan=plan, **kw)
            flash_attention(q, k, v, plan=plan)
            if configs.mask_of(**kw, varlen=True) in masks:
                flash_attention_varlen(qp, kp, kp, cu, cu, 299, 299, plan=plan, **kw)


def backward_cases():
    from attention import flash_attention, flash_attention_backward

    for d, dt, kw in _ATTENTION_SHAPES:  # seq_q != seq_kv: ragged tiles on both sides
        q, k, v, do, ids = _attention_inputs(d, dt, 150, 170)
        for seg in (None, ids):
            o, lse = flash_attention(q, k, v, segment_ids=seg, return_lse=True, **kw)
            for det in (False, True):
                flash_attention_backward(do, q, k, v, o, lse, segment_ids=seg, deterministic=det, **kw)


def tma_backward_cases():
    """The warp-specialised TMA backward (sm_90a with cuda-bindings), forced with each of its tiles: every mask
    kind, more query tiles than ring stages, both dQ modes, a packed batch whose query tiles reach into the
    next sequence, and a problem small enough for the dQ conversion in the dK/dV grid."""
    from attention import bwd_configs, flash_attention, flash_attention_backward
    from attention.varlen import flash_attention_varlen, flash_attention_varlen_backward
    from cukernels import tune

    spec, cu = _tma_device()
    if spec is None:
        return
    for d, dt, kw in _ATTENTION_SHAPES:
        q, k, v, do, ids = _attention_inputs(d, dt, 400, 450)
        for c in bwd_configs.tma_tiles(spec, d):
            plan = tune.explicit(c, spec)
            for seg in (None, ids):
                o, lse = flash_attention(q, k, v, segment_ids=seg, return_lse=True, **kw)
                for det in (False, True):
                    flash_attention_backward(do, q, k, v, o, lse, segment_ids=seg, deterministic=det, plan=plan, **kw)
        qp, kp, dop = q[0], k[0, :400], do[0]
        o, lse = flash_attention_varlen(qp, kp, kp, cu, cu, 299, 299, return_lse=True, **kw)
        flash_attention_varlen_backward(dop, qp, kp, kp, o, lse, cu, cu, 299, 299, **kw)
        # few query rows per kv head: dQ converted by the dK/dV grid's last CTA of each group (convert_dq)
        q, k, v, do, _ = _attention_inputs(d, dt, 60, 200)
        o, lse = flash_attention(q, k, v, return_lse=True, **kw)
        flash_attention_backward(do, q, k, v, o, lse, **kw)


def gemm_cases():
    from cukernels import device
    from moe import gemm_configs, grouped_gemm

    spec = device.current()
    counts = [0, 130, 1, 0, 257]
    off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    for dt in (dtypes.FP16, dtypes.BF16):
        a = dtypes.random((sum(counts), 200), dt, seed=1)
        b = dtypes.random((len(counts), 528, 200), dt, seed=2)
        for cfg in gemm_configs.ALL:
            if cfg.smem_bytes() > spec.smem_per_block_optin or (cfg.kind != "mma" and spec.arch != "sm_90a"):
                continue
            for epi in cfg.epilogues():
                if epi in gemm_configs.NAMED_EPILOGUES:  # the rotary ones below (rotary=)
                    grouped_gemm(a, b, off, epilogue=epi, config=cfg)
    if spec.arch == "sm_90a":  # the persistent tile over more tiles than SMs: each CTA loops, phases wrap
        counts = [5000, 0, 1, 3000, 129, 2000]
        off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        a = dtypes.random((sum(counts), 72), dtypes.BF16, seed=3)
        b = dtypes.random((len(counts), 272, 72), dtypes.BF16, seed=4)
        splits = [dataclasses.replace(c, split_k=2) for c in (gemm_configs.TMA_128[0], gemm_configs.TMA[0])]
        splits.append(dataclasses.replace(gemm_configs.TMA_128_KSPLIT, cluster_k=2))
        tiles = gemm_configs.TMA + gemm_configs.TMA_128 + gemm_configs.TMA_64 + gemm_configs.TMA_PAIR
        for cfg in tiles + tuple(splits):
            for epi in (None, "swiglu"):
                grouped_gemm(a, b, off, epilogue=epi, config=cfg, row_scale=cupy.ones(sum(counts), cupy.float32))
        # clusters along K of 3 and 4 CTAs (K = 264: 5 k tiles, a tail), a partial m tile and an empty group
        counts = [300, 0, 70]
        off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        a = dtypes.random((sum(counts), 264), dtypes.BF16, seed=5)
        b = dtypes.random((len(counts), 528, 264), dtypes.BF16, seed=6)
        for ck in (3, 4):
            for epi in (None, "swiglu"):
                for base in (gemm_configs.TMA_128_KSPLIT, *gemm_configs.TMA_64):
                    grouped_gemm(a, b, off, epilogue=epi, config=dataclasses.replace(base, cluster_k=ck))
        # one group of all rows (offsets=None: the tma tiles read no offsets, the others an array the call keeps)
        a, b = a[:300], b[:1]
        for cfg in (*gemm_configs.TMA_64, gemm_configs.TMA_128[0], dataclasses.replace(gemm_configs.TMA_64[0],
                                                                                         cluster_k=2),
                    dataclasses.replace(gemm_configs.TMA_128[0], split_k=2), gemm_configs.MEDIUM[0]):
            for epi in (None, "swiglu"):
                grouped_gemm(a, b, None, epilogue=epi, config=cfg)
        # the rotary epilogue (q/k heads rotated in registers; positions wrap every 64 rows), head dims 64 and 128
        b512 = b[:, :512].copy()
        for hd in (64, 128):
            half = np.arange(64 * hd // 2, dtype=np.float32).reshape(64, hd // 2) / 1e3
            cos, sin = cupy.asarray(np.cos(half)), cupy.asarray(np.sin(half))
            for cfg in (*gemm_configs.TMA_64, gemm_configs.TMA_128[0], gemm_configs.TMA[0]):
                if gemm_configs.ROPE[hd] in cfg.epilogues():
                    grouped_gemm(a, b512, None, rotary=(cos, sin, 256), config=cfg)
        # the layer's up-projection gathering the token rows in its loads and its down-projection adding its rows
        # into the tokens' (the 128 x 256 tile alone and in pairs; ragged groups, a K tail of the 64-wide k tile)
        _tma_gather_layers(gemm_configs.TMA[0], gemm_configs.TMA_PAIR[0])


def _tma_gather_layers(*tiles):
    """A small MoE layer whose expert GEMMs are planned as each of ``tiles`` (the router as the planner says)."""
    from moe import MoELayer, gemm_configs
    from moe import layer as layer_mod

    router = cupy.random.default_rng(7).standard_normal((328, 8), dtype=cupy.float32)
    w_up, w_down = dtypes.random((8, 768, 328), dtypes.BF16, seed=8), dtypes.random((8, 328, 384), dtypes.BF16, seed=9)
    x = dtypes.random((700, 328), dtypes.BF16, seed=10)
    for tile in tiles:
        layer_mod._LAYER.clear()
        with gemm_configs.expert_gemms_planned_as(tile):
            MoELayer(router, w_up, w_down, 2)(x)
        layer_mod._LAYER.clear()


def skinny_cases():
    """The decode-sized tiles: groups of 0-20 rows (two passes of 8), N and K tails, fp32 out, every split, and a
    decode-sized layer whose up-projection gathers the token rows itself (fewer rows than experts: the router GEMM,
    routing, permutation and both expert GEMMs in one launch, moe_decode_skinny, with the early weight prefetch),
    at 16 and 200 experts."""
    from moe import MoELayer, gemm_configs, grouped_gemm

    counts = [0, 1, 9, 0, 20, 3]
    off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    a = dtypes.random((sum(counts), 200), dtypes.BF16, seed=1)
    b = dtypes.random((len(counts), 272, 200), dtypes.BF16, seed=2)
    for i, cfg in enumerate(gemm_configs.SKINNY):
        if cfg.block_m == 8 or i % 4 == 1:
            grouped_gemm(a, b, off, epilogue="swiglu" if i % 2 else None, config=cfg,
                         row_scale=cupy.ones(sum(counts), cupy.float32))
            grouped_gemm(a, b, off, out_dtype=np.float32, config=cfg)
    router = cupy.random.default_rng(5).standard_normal((128, 16), dtype=cupy.float32)
    w_up, w_down = dtypes.random((16, 192, 128), dtypes.BF16, seed=6), dtypes.random((16, 128, 96), dtypes.BF16, seed=7)
    MoELayer(router, w_up, w_down, 4)(dtypes.random((3, 128), dtypes.BF16, seed=8))
    router = cupy.random.default_rng(9).standard_normal((128, 200), dtype=cupy.float32)
    w_up = dtypes.random((200, 64, 128), dtypes.BF16, seed=6)
    w_down = dtypes.random((200, 128, 32), dtypes.BF16, seed=7)
    MoELayer(router, w_up, w_down, 6)(dtypes.random((2, 128), dtypes.BF16, seed=8))
    MoELayer(router, w_up, w_down, 6)(dtypes.random((6, 128), dtypes.BF16, seed=9))  # 36 slots: the counting sort


def moe_cases():
    import moe

    for tokens in (300, 29):  # 29: decode-sized routing, one block that also finishes
        logits = dtypes.random((tokens, 60), dtypes.BF16, seed=3)
        r = moe.route(logits, 4)
        d = moe.permute(r, block_m=64)
        x = dtypes.random((tokens, 136), dtypes.BF16, seed=4)
        moe.combine(moe.gather(x, d), d, r)


def decode_cases():
    """Attention over a KV cache: contiguous and paged (shuffled pages), ragged lengths with 0 and a page boundary,
    appended tokens, GQA rows over two row tiles, several splits (the last split's merge; 2 and 4 on sm_90: one
    cluster's) and one, every head dim, and head dim 64 with its KV heads in pairs."""
    import numpy as np

    from attention import flash_attention_with_kvcache

    lens = cupy.asarray(np.array([0, 16, 37], dtype=np.int32))
    for d, dt in ((64, "fp16"), (128, "bf16"), (256, "bf16")):
        t = dtypes.from_name(dt)
        q = dtypes.random((3, 5, 8, d), t, seed=d)
        kn, vn = (dtypes.random((3, 5, 2, d), t, seed=d + i) for i in (1, 2))
        k, v = (dtypes.random((3, 64, 2, d), t, seed=d + i) for i in (3, 4))
        pk, pv = (dtypes.random((13, 16, 2, d), t, seed=d + i) for i in (5, 6))
        table = cupy.asarray(np.random.default_rng(d).permutation(13)[:12].reshape(3, 4).astype(np.int32))
        for splits in (1, 3, 4):  # 4: one cluster on sm_90
            flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, k=kn, v=vn, causal=True, num_splits=splits)
            flash_attention_with_kvcache(q, pk, pv, cache_seqlens=lens, block_table=table, k=kn, v=vn,
                                         num_splits=splits)
    # a paged cache long enough for the page lookups' ring (two blocks of stages) to wrap in every CTA
    lens = cupy.asarray(np.array([700, 513], dtype=np.int32))
    for d in (64, 128):
        t = dtypes.from_name("bf16")
        q = dtypes.random((2, 1, 4, d), t, seed=d + 20)
        pk, pv = (dtypes.random((96, 16, 2, d), t, seed=d + i) for i in (21, 22))
        table = cupy.asarray(np.random.default_rng(d).permutation(96)[:88].reshape(2, 44).astype(np.int32))
        for splits in (1, 2):
            flash_attention_with_kvcache(q, pk, pv, cache_seqlens=lens, block_table=table, num_splits=splits)
    # head dim 64 with KV heads in pairs (a grid of at least one CTA per SM): ragged, contiguous and paged
    batch = -(-cupy.cuda.Device().attributes["MultiProcessorCount"] // 8) + 1
    lens = cupy.asarray(np.random.default_rng(1).integers(0, 96, batch).astype(np.int32))
    t = dtypes.from_name("bf16")
    q = dtypes.random((batch, 2, 16, 64), t, seed=7)
    k, v = (dtypes.random((batch, 96, 8, 64), t, seed=i) for i in (8, 9))
    pk, pv = (dtypes.random((batch * 6 + 1, 16, 8, 64), t, seed=i) for i in (10, 11))
    table = cupy.asarray(np.random.default_rng(2).permutation(batch * 6 + 1)[:batch * 6].reshape(batch, 6)
                         .astype(np.int32))
    for splits in (1, 2, 3):
        flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, num_splits=splits)
        flash_attention_with_kvcache(q, pk, pv, cache_seqlens=lens, block_table=table, num_splits=splits)


def main(names) -> int:
    cases = {"attention": attention_cases, "tma": tma_cases, "backward": backward_cases,
             "tma-backward": tma_backward_cases, "decode": decode_cases,
             "gemm": gemm_cases, "skinny": skinny_cases, "moe": moe_cases,
             "copy": lambda: bandwidth.measure_copy(1 << 20, budget_ms=1)}
    unknown = [n for n in names if n not in cases]
    if unknown:
        return cli.usage_error(PROG, f"{', '.join(unknown)}: unknown; known: {', '.join(cases)} (none: all of them)")
    if not device.gpu_available():
        return cli.no_gpu(PROG, "On a GPU: `compute-sanitizer --tool memcheck python tools/sanitize.py`. Without one, "
                                "`python -m pytest` compiles every kernel variant offline for every profile.")
    for name in names or list(cases):
        cases[name]()
        cupy.cuda.runtime.deviceSynchronize()
        print(f"sanitize: {name} ran", flush=True)
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
