"""flash_attention_backward against the fp32 analytic reference on a GPU: each head dim and dtype, lengths 1,
17, 1000, 4099, seq_q != seq_kv (rows with no key), GQA/MQA, windows, segment ids (with block_m != block_n),
deterministic mode (bitwise repeatable), the forward's own o/lse, and the torch autograd op.

o and lse come from the reference (rounded o), so these tests do not depend on the forward kernel, except
``test_through_forward_kernel``. Outputs come from a poisoned memory pool: an unwritten element is NaN and fails.
Tolerance (cukernels.checks policy): max error within NAIVE_FACTOR x the error of the same backward done naively
in the storage precision (P and dS rounded), plus a small absolute term.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cukernels import checks, dtypes, launch, tiling

pytestmark = pytest.mark.gpu

ATOL = {"fp16": 2e-3, "bf16": 1.6e-2}
NAIVE_FACTOR = 3.0


def _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed):
    dt = dtypes.from_name(dtype)
    q = dtypes.random((batch, seq_q, heads, dim), dt, seed=seed)
    k = dtypes.random((batch, seq_kv, kv_heads, dim), dt, seed=seed + 1)
    v = dtypes.random((batch, seq_kv, kv_heads, dim), dt, seed=seed + 2)
    do = dtypes.random((batch, seq_q, heads, dim), dt, seed=seed + 3)
    return q, k, v, do


def _o_lse(q, k, v, dtype, **kw):
    from attention.backward_reference import attention_forward_reference

    o, lse = attention_forward_reference(q, k, v, **kw)
    return dtypes.from_float32(o, dtypes.from_name(dtype)), lse.astype(np.float32)


def _run(q, k, v, do, dtype, *, o=None, lse=None, deterministic=False, plan=None, **kw):
    import cupy

    from attention import flash_attention_backward

    if o is None:
        o, lse = _o_lse(q, k, v, dtype, **kw)
    nbytes = 4 * (q.size + 2 * k.size) + (1 << 20)
    checks.poison_pool(nbytes)
    grads = flash_attention_backward(do, q, k, v, o, lse, deterministic=deterministic, plan=plan, **kw)
    cupy.cuda.get_current_stream().synchronize()
    return grads, o


def _check(q, k, v, do, dtype, **kw):
    from attention.backward_reference import attention_backward_reference

    (dq, dk, dv), o = _run(q, k, v, do, dtype, **kw)
    for x, ref in ((dq, q), (dk, k), (dv, v)):
        assert x.shape == ref.shape and x.dtype == ref.dtype
    kw.pop("deterministic", None)
    kw.pop("plan", None)
    kw.pop("lse", None)
    kw.pop("o", None)
    ref = attention_backward_reference(do, q, k, v, o=o, **kw)
    naive = attention_backward_reference(do, q, k, v, o=o, round_to=dtype, **kw)
    tol = checks.Tolerance(atol=ATOL[dtype], naive_factor=NAIVE_FACTOR)
    results = [checks.compare(g, r, tol=tol, naive=n, name=name)
               for g, r, n, name in zip((dq, dk, dv), ref, naive, ("dq", "dk", "dv"))]
    print(" | ".join(str(r) for r in results))
    for r in results:
        r.raise_if_failed()
    return dq, dk, dv


# (batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, options)
CASES = [
    *[(2, 257, 257, 4, 2, d, dt, {}) for d in (64, 128, 256) for dt in ("fp16", "bf16")],
    *[(1, s, s, 2, 2, 128, "bf16", {"causal": c}) for s in (1, 17, 1000, 4099) for c in (False, True)],
    (1, 1000, 1000, 2, 1, 64, "fp16", {"causal": True}),
    (1, 4099, 4099, 2, 1, 256, "bf16", {"causal": True}),
    (1, 4099, 4099, 2, 2, 64, "fp16", {}),
    (2, 17, 1000, 4, 4, 128, "fp16", {"causal": True}),
    (2, 1000, 17, 4, 4, 128, "bf16", {"causal": True}),  # rows 0..982 see no key
    (2, 300, 513, 4, 2, 64, "bf16", {}),
    (1, 513, 300, 2, 2, 256, "fp16", {"window": (40, 7)}),
    *[(1, 333, 333, 8, 8 // r, 128, "bf16", {"causal": True}) for r in (1, 2, 4, 8)],
    (2, 200, 200, 16, 1, 64, "fp16", {}),
    (1, 1000, 1000, 4, 2, 128, "fp16", {"window": (64, 32)}),
    (1, 1000, 1000, 4, 2, 128, "bf16", {"window": (0, 0)}),
    (1, 1000, 1000, 2, 2, 64, "bf16", {"window": (-1, 16)}),
    (1, 1000, 1000, 2, 2, 256, "fp16", {"window": (100, -1)}),
    (1, 1000, 1000, 4, 1, 128, "bf16", {"causal": True, "window": (200, 0)}),
    (1, 700, 900, 4, 1, 128, "bf16", {"causal": True, "window": (129, -1), "softmax_scale": 0.2}),
]
IDS = [f"b{c[0]}_q{c[1]}_kv{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_{c[6]}_{'_'.join(f'{k}{v}' for k, v in c[7].items())}"
       for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_reference(case):
    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, opts = case
    seed = zlib.crc32(IDS[CASES.index(case)].encode()) % 1000
    q, k, v, do = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed)
    _check(q, k, v, do, dtype, **opts)


def _plan(**cfg):
    from attention.bwd_configs import BwdConfig

    c = BwdConfig(**cfg)
    return tiling.Plan(config=c, smem_bytes=c.smem_bytes(), limit=232_448, reason="test: block_m != block_n")


SEGMENT_CASES = [
    # (batch, seq, heads, kv_heads, dim, dtype, documents, options, plan)
    (2, 1000, 4, 2, 64, "bf16", 4, {}, None),  # planned (Hopper: the wgmma kernel, m128 n128; dq kernel n64)
    (2, 1000, 4, 2, 128, "bf16", 6, {"causal": True}, None),  # planned (Hopper: wgmma, block_m 64, block_n 128)
    (2, 1000, 4, 2, 64, "fp16", 4, {}, dict(head_dim=64, block_m=64, block_n=128, warps=8, stages=2)),
    (2, 1000, 4, 2, 128, "fp16", 7, {"causal": True},
     dict(head_dim=128, block_m=64, block_n=32, warps=4, stages=2, dq_block_m=32, dq_block_n=64)),
    (1, 2048, 4, 4, 256, "bf16", 5, {"causal": True, "window": (300, 0)}, None),  # dq kernel m64 n32
    (3, 517, 8, 2, 128, "fp16", 40, {"window": (50, 50)},
     dict(head_dim=128, block_m=32, block_n=64, warps=8, stages=2, dq_block_m=64, dq_block_n=16)),
]


# On Hopper the planner picks the warp-specialised TMA kernel at head dims 64 and 128 (with cuda-bindings); these
# cases force the mma.sync kernel that every other sm_80+ GPU runs and the cp.async wgmma kernel the TMA one falls
# back to (no cuda-bindings, a stride 0), so all three are validated on the one GPU we have ...
MMA_SYNC_CASES = [CASES[i] for i in (0, 1, 2, 3, 4, 5, 7, 12, 14, 18, 19, 21, 23)]
WGMMA_CASES = [CASES[i] for i in (0, 1, 2, 3, 12, 15, 18, 19, 23)]
FORCED = [("mma_sync", c) for c in MMA_SYNC_CASES] + [("wgmma", c) for c in WGMMA_CASES]


@pytest.mark.parametrize("kind,case", FORCED, ids=[f"{k}-{IDS[CASES.index(c)]}" for k, c in FORCED])
def test_forced_kernel_against_reference(kind, case):
    from attention.bwd_configs import BwdConfig, BwdWgmmaConfig, search_space

    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, opts = case
    cls = BwdConfig if kind == "mma_sync" else BwdWgmmaConfig
    cfg = next(c for c in search_space(dim) if type(c) is cls)
    plan = tiling.Plan(config=cfg, smem_bytes=cfg.smem_bytes(), limit=232_448, reason=f"test: {kind} kernel")
    seed = zlib.crc32(IDS[CASES.index(case)].encode()) % 1000 + (1 if kind == "mma_sync" else 2)
    q, k, v, do = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed)
    _check(q, k, v, do, dtype, plan=plan, **opts)


# ... and every TMA tile the planner can choose (not only its first), with and without masks and GQA.
TMA_CASES = [CASES[i] for i in (0, 1, 3, 4, 7, 12, 14, 15, 18, 20, 23, 25, 29)]  # 4, 15, 20, 29: head dim 256


def _tma_plans(dim):
    from attention.bwd_configs import tma_tiles
    from cukernels import device, tune

    spec = device.current()
    return [tune.explicit(c, spec) for c in tma_tiles(spec, dim)]


@pytest.mark.parametrize("case", TMA_CASES, ids=[IDS[CASES.index(c)] for c in TMA_CASES])
def test_tma_kernel_every_tile(case):
    from cukernels import tma

    if tma.available():
        pytest.skip(tma.available())
    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, opts = case
    seed = zlib.crc32(IDS[CASES.index(case)].encode()) % 1000 + 3
    q, k, v, do = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed)
    for plan in _tma_plans(dim):
        print(plan.config)
        _check(q, k, v, do, dtype, plan=plan, **opts)


def test_tma_broadcast_grad_falls_back_and_forced_plan_is_refused():
    """A dO with a stride 0 (the gradient of a sum, expanded) cannot be a tensor map: the planner takes the
    cp.async kernel and says why; a TMA plan handed in raises before any launch."""
    import cupy

    from attention import flash_attention_backward
    from attention.backward import validate_backward
    from attention.bwd_configs import BwdTmaConfig, plan_backward
    from cukernels import device as _device

    q, k, v, _ = _inputs(1, 300, 300, 4, 2, 128, "bf16", seed=5)
    do = cupy.broadcast_to(dtypes.random((1, 1, 4, 128), dtypes.BF16, seed=6), q.shape)
    o, lse = _o_lse(q, k, v, "bf16", causal=True)
    problem = validate_backward(do, q, k, v, o, lse, causal=True)
    assert not problem.tma_layout
    plan = plan_backward(problem, _device.current())
    assert not isinstance(plan.config, BwdTmaConfig)
    if _device.current().arch == "sm_90a":
        assert "stride of 0" in plan.reason
    _check(q, k, v, do, "bf16", causal=True)
    with pytest.raises(ValueError, match="tensor maps"):
        flash_attention_backward(do, q, k, v, o, lse, causal=True, plan=_tma_plans(128)[0])


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("case", SEGMENT_CASES, ids=[f"seg{c[6]}_s{c[1]}_d{c[4]}_{c[5]}" for c in SEGMENT_CASES])
def test_segments_with_different_q_and_kv_tiles(case, deterministic):
    """Seed 000: segment-id masks when the query and KV tiles differ in size."""
    import cupy

    from attention.suites import packed_segment_ids

    batch, seq, heads, kv_heads, dim, dtype, docs, opts, cfg = case
    q, k, v, do = _inputs(batch, seq, seq, heads, kv_heads, dim, dtype, seed=docs)
    ids = cupy.asarray(packed_segment_ids(batch, seq, docs, seed=docs))
    plan = None if cfg is None else _plan(**cfg)
    _check(q, k, v, do, dtype, segment_ids=ids, deterministic=deterministic, plan=plan, **opts)


def test_segment_pair_and_empty_rows():
    import cupy

    q, k, v, do = _inputs(2, 300, 700, 4, 2, 128, "bf16", seed=7)
    q_ids = cupy.asarray(np.repeat(np.array([[0, 1, 2, 9]], dtype=np.int32), 75, axis=1).repeat(2, axis=0))
    kv_ids = cupy.asarray(np.sort(np.random.default_rng(1).integers(0, 3, size=(2, 700)), axis=1).astype(np.int32))
    dq, dk, dv = _check(q, k, v, do, "bf16", segment_ids=(q_ids, kv_ids))
    empty = cupy.asnumpy(q_ids == 9)
    assert (dtypes.bf16_to_float32(cupy.asnumpy(dq))[empty] == 0).all()


def test_fully_masked_rows_zero_not_nan():
    import cupy

    q, k, v, do = _inputs(1, 200, 50, 2, 2, 64, "fp16", seed=3)
    dq, dk, dv = _check(q, k, v, do, "fp16", causal=True)
    dq_h = cupy.asnumpy(dq).astype(np.float32)
    assert (dq_h[:, :150] == 0).all() and np.isfinite(dq_h).all()


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_deterministic_is_bitwise_repeatable(dim):
    import cupy

    q, k, v, do = _inputs(1, 1500, 1500, 8, 2, dim, "bf16", seed=dim)
    first = _check(q, k, v, do, "bf16", causal=True, deterministic=True)
    first = [cupy.asnumpy(x) for x in first]
    for _ in range(2):
        (dq, dk, dv), _ = _run(q, k, v, do, "bf16", causal=True, deterministic=True)
        for a, b in zip(first, (dq, dk, dv)):
            assert np.array_equal(a, cupy.asnumpy(b))


def test_strided_views_of_packed_qkv():
    qkv = dtypes.random((2, 333, 3, 4, 128), dtypes.FP16, seed=11)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    do = dtypes.random((2, 333, 4, 128), dtypes.FP16, seed=12)
    assert not q.flags.c_contiguous
    _check(q, k, v, do, "fp16", causal=True)


def test_through_forward_kernel():
    """o and lse from attention.flash_attention, then the backward."""
    from attention import flash_attention

    q, k, v, do = _inputs(2, 600, 600, 8, 2, 128, "bf16", seed=21)
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    _check(q, k, v, do, "bf16", causal=True, o=o, lse=lse)


def test_torch_autograd_op():
    torch = pytest.importorskip("torch")
    from attention.torch import flash_attention

    q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    o = flash_attention(q, k, v, causal=True)
    do = torch.randn_like(o)
    o.backward(do)
    qs, ks, vs = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref_o = torch.nn.functional.scaled_dot_product_attention(
        qs.transpose(1, 2), ks.repeat_interleave(4, 2).transpose(1, 2), vs.repeat_interleave(4, 2).transpose(1, 2),
        is_causal=True).transpose(1, 2)
    ref_o.backward(do.float())
    for ours, ref in ((q.grad, qs.grad), (k.grad, ks.grad), (v.grad, vs.grad)):
        assert ours.dtype == torch.bfloat16 and ours.shape == ref.shape
        rel = ((ours.float() - ref).norm() / ref.norm()).item()
        assert rel < 2e-2, rel


def _backward_call(q, k, v, do, o, lse, **kw):
    from attention import backward as bw
    from cukernels import launch

    views = [launch.view(x) for x in (do, q, k, v, o, lse)]
    key = (*(x[0] for x in views), bw.api.options_key(kw.get("causal", False), None, None, None), False)
    return bw._BACKWARD.get(key)


def test_kept_workspace_back_to_back_on_one_stream():
    """A small workspace is kept for the call's next run on the same stream: calls enqueued back to back, with
    fresh inputs and no sync between them, each give the reference answer; the second reuses the first's memory."""
    import cupy

    from attention import flash_attention_backward
    from attention.backward_reference import attention_backward_reference

    stream = cupy.cuda.Stream(non_blocking=True)
    runs = []
    with stream:
        for seed in (31, 41, 51):
            q, k, v, do = _inputs(1, 200, 200, 4, 2, 64, "bf16", seed=seed)
            o, lse = _o_lse(q, k, v, "bf16", causal=True)
            runs.append(((q, k, v, do, o), flash_attention_backward(do, q, k, v, o, lse, causal=True)))
            call = _backward_call(q, k, v, do, o, lse, causal=True)
            assert call is not None
            kept = call.workspace.kept
            assert kept is not None and kept[0] == stream.ptr
            if len(runs) == 1:
                first = kept[2]
            assert kept[2] == first  # the same workspace every call
        stream.synchronize()
    tol = checks.Tolerance(atol=ATOL["bf16"], naive_factor=NAIVE_FACTOR)
    for (q, k, v, do, o), grads in runs:
        ref = attention_backward_reference(do, q, k, v, o=o, causal=True)
        naive = attention_backward_reference(do, q, k, v, o=o, causal=True, round_to="bf16")
        for g, r, n, name in zip(grads, ref, naive, ("dq", "dk", "dv")):
            checks.compare(g, r, tol=tol, naive=n, name=name).raise_if_failed()


def test_kept_workspace_not_used_under_capture():
    """Captured calls allocate their own workspace (the graph's), never the one kept for eager calls, and an
    eager call after the capture does not write into the graph's."""
    import cupy

    from attention import flash_attention_backward
    from attention.backward_reference import attention_backward_reference

    q, k, v, do = _inputs(1, 200, 200, 4, 2, 64, "bf16", seed=61)
    o, lse = _o_lse(q, k, v, "bf16")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        flash_attention_backward(do, q, k, v, o, lse)  # eager: keeps a workspace for this stream
        call = _backward_call(q, k, v, do, o, lse)
        kept = call.workspace.kept
        stream.synchronize()
        stream.begin_capture()
        grads = flash_attention_backward(do, q, k, v, o, lse)
        graph = stream.end_capture()
        assert call.workspace.kept == kept
        for x in grads:
            checks.poison(x)
        eager = flash_attention_backward(do, q, k, v, o, lse)  # kept workspace, same stream, before the replay
        graph.launch()
        stream.synchronize()
    ref = attention_backward_reference(do, q, k, v, o=o)
    naive = attention_backward_reference(do, q, k, v, o=o, round_to="bf16")
    tol = checks.Tolerance(atol=ATOL["bf16"], naive_factor=NAIVE_FACTOR)
    for got in (grads, eager):
        for g, r, n, name in zip(got, ref, naive, ("dq", "dk", "dv")):
            checks.compare(g, r, tol=tol, naive=n, name=name).raise_if_failed()


@pytest.mark.parametrize("launches", [1, 2, 3])
@pytest.mark.parametrize("case", [(1, 128, 128, 8, 8, 64, "bf16", {"causal": True}),
                                  (2, 60, 150, 8, 2, 64, "bf16", {"causal": True}),
                                  (3, 64, 64, 4, 4, 128, "fp16", {}),
                                  (2, 33, 200, 3, 1, 128, "bf16", {"window": (50, 3)})],
                         ids=["b1_s128_h8_d64", "b2_gqa4_d64", "b3_d128_fp16", "b2_mqa_window"])
def test_small_backward_in_one_and_two_launches(case, launches):
    """A small problem's backward in one launch (flash_bwd_tma's prologue does the preprocess, a grid-wide barrier,
    the last CTA of each (batch, kv head) converts dQ), in two (the preprocess launched) and in three (the
    conversion launched too), against the reference: three calls back to back on one stream with fresh inputs
    (the counters each launch leaves at zero), then a CuPy graph capture replayed on new inputs with a poisoned
    output between eager calls."""
    import cupy

    from attention import backward as bw
    from attention import flash_attention_backward
    from attention.backward_reference import attention_backward_reference
    from cukernels import tma

    if tma.available():
        pytest.skip(tma.available())
    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, opts = case
    saved = bw.DQ_CONVERT_IN_GRID_BYTES, bw.ONE_LAUNCH
    bw.DQ_CONVERT_IN_GRID_BYTES = saved[0] if launches < 3 else 0
    bw.ONE_LAUNCH = launches == 1
    bw._BACKWARD.clear()
    tol = checks.Tolerance(atol=ATOL[dtype], naive_factor=NAIVE_FACTOR)

    def check(grads, q, k, v, do, o):
        ref = attention_backward_reference(do, q, k, v, o=o, **opts)
        naive = attention_backward_reference(do, q, k, v, o=o, round_to=dtype, **opts)
        for g, r, n, name in zip(grads, ref, naive, ("dq", "dk", "dv")):
            checks.compare(g, r, tol=tol, naive=n, name=name).raise_if_failed()

    try:
        stream = cupy.cuda.Stream(non_blocking=True)
        runs = []
        with stream:
            for seed in (7, 8, 9):
                q, k, v, do = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed=seed)
                o, lse = _o_lse(q, k, v, dtype, **opts)
                checks.poison_pool(4 * (q.size + 2 * k.size) + (1 << 20))
                runs.append(((q, k, v, do, o), flash_attention_backward(do, q, k, v, o, lse, **opts)))
            call = _backward_call(q, k, v, do, o, lse, **opts) if not opts.get("window") else None
            if call is not None:
                assert (call.dq_in_grid, call.one_launch, len(call.steps)) == (launches < 3, launches == 1, launches)
            stream.synchronize()
            for (q, k, v, do, o), grads in runs:
                check(grads, q, k, v, do, o)
            # captured on fresh static inputs, replayed on new values, eager calls before and after
            sq, sk, sv, sdo = (x.copy() for x in runs[0][0][:4])
            so, slse = _o_lse(sq, sk, sv, dtype, **opts)
            stream.synchronize()
            stream.begin_capture()
            captured = []
            recorded = launch.count_launches(
                lambda: captured.append(flash_attention_backward(sdo, sq, sk, sv, so, slse, **opts)))
            graph = stream.end_capture()
            graph_grads = captured[0]
            if call is not None:  # a capture takes the plan of least device time: three launches, no memset
                assert recorded == len(call.graph_steps) == 3
            for seed in (11, 12):
                q, k, v, do = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed=seed)
                o, lse = _o_lse(q, k, v, dtype, **opts)
                eager = flash_attention_backward(do, q, k, v, o, lse, **opts)
                for dst, src in zip((sq, sk, sv, sdo, so, slse), (q, k, v, do, o, lse)):
                    dst[...] = src
                for g in graph_grads:
                    checks.poison(g)
                graph.launch()
                stream.synchronize()
                check(graph_grads, q, k, v, do, o)
                check(eager, q, k, v, do, o)
    finally:
        bw.DQ_CONVERT_IN_GRID_BYTES, bw.ONE_LAUNCH = saved
        bw._BACKWARD.clear()
