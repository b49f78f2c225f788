"""flash_attention against the fp32 reference on a GPU: every mask alone and combined, ragged lengths,
seq_q != seq_kv, GQA/MQA, each head dim and dtype, LSE, empty rows, strided and torch inputs.

Outputs come from a poisoned memory pool (an unwritten element is NaN and fails). The tolerance is the
project's policy: the kernel's max error within 2x the error of the same computation done naively in the
storage precision (P and the output rounded), plus a small absolute term.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cukernels import checks, dtypes

pytestmark = pytest.mark.gpu

ATOL = {"fp16": 1e-3, "bf16": 8e-3}
LSE_TOL = checks.Tolerance(atol=2e-3, rtol=2e-4)


def _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed):
    dt = dtypes.from_name(dtype)
    q = dtypes.random((batch, seq_q, heads, dim), dt, seed=seed)
    k = dtypes.random((batch, seq_kv, kv_heads, dim), dt, seed=seed + 1)
    v = dtypes.random((batch, seq_kv, kv_heads, dim), dt, seed=seed + 2)
    return q, k, v


def _serves(plan, **kw) -> bool:
    """Whether a plan handed in has a kernel for the mask kind of these options (configs.kernel_masks)."""
    from attention import configs

    mask = configs.mask_of(causal=kw.get("causal", False), window=kw.get("window"),
                           segments=kw.get("segment_ids") is not None)
    return plan is None or mask in configs.kernel_masks(plan.config)


def _check(q, k, v, dtype, plan=None, **kw):
    """o and lse against the fp32 reference; None when ``plan`` has no kernel for this mask (``_serves``)."""
    import cupy

    from attention import attention_reference, flash_attention

    if not _serves(plan, **kw):
        return None
    batch, seq_q, heads, dim = q.shape
    checks.poison_pool(batch * seq_q * heads * dim * 2)
    checks.poison_pool(batch * heads * seq_q * 4)
    o, lse = flash_attention(q, k, v, return_lse=True, plan=plan, **kw)
    cupy.cuda.get_current_stream().synchronize()
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (batch, heads, seq_q) and lse.dtype == np.float32
    ref_o, ref_lse = attention_reference(q, k, v, return_lse=True, **kw)
    naive = attention_reference(q, k, v, round_to=dtype, **kw)
    res = checks.compare(o, ref_o, tol=checks.Tolerance(atol=ATOL[dtype], naive_factor=2.0), naive=naive, name="o")
    res.raise_if_failed()
    checks.compare(lse, ref_lse, tol=LSE_TOL, name="lse").raise_if_failed()
    return o, lse


# (batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, options)
CASES = [
    # each head dim x dtype, GQA 2
    *[(2, 257, 257, 4, 2, d, dt, {}) for d in (64, 128, 256) for dt in ("fp16", "bf16")],
    # lengths
    *[(1, s, s, 2, 2, 128, "bf16", {"causal": c}) for s in (1, 17, 1000, 4099) for c in (False, True)],
    (1, 1000, 1000, 2, 1, 64, "fp16", {"causal": True}),
    (1, 4099, 4099, 2, 1, 256, "bf16", {"causal": True}),
    # seq_q != seq_kv (bottom-right causal; seq_q > seq_kv leaves the first rows with no key)
    (2, 17, 1000, 4, 4, 128, "fp16", {"causal": True}),
    (2, 1000, 17, 4, 4, 128, "bf16", {"causal": True}),
    (2, 300, 513, 4, 2, 64, "bf16", {}),
    (1, 513, 300, 2, 2, 256, "fp16", {"window": (40, 7)}),
    # heads ratios 1/2/4/8 and MQA
    *[(1, 333, 333, 8, 8 // r, 128, "bf16", {"causal": True}) for r in (1, 2, 4, 8)],
    (2, 200, 200, 16, 1, 64, "fp16", {}),
    # windows
    (1, 1000, 1000, 4, 2, 128, "fp16", {"window": (64, 32)}),
    (1, 1000, 1000, 4, 2, 128, "bf16", {"window": (0, 0)}),
    (1, 1000, 1000, 2, 2, 64, "bf16", {"window": (-1, 16)}),
    (1, 1000, 1000, 2, 2, 256, "fp16", {"window": (100, -1)}),
    (1, 1000, 1000, 4, 1, 128, "bf16", {"causal": True, "window": (200, 0)}),
    (1, 700, 900, 4, 1, 128, "bf16", {"causal": True, "window": (129, -1)}),
]
IDS = [f"b{c[0]}_q{c[1]}_kv{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_{c[6]}_{'_'.join(f'{k}{v}' for k, v in c[7].items())}"
       for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_reference(case):
    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, opts = case
    q, k, v = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed=zlib.crc32(IDS[CASES.index(case)].encode()) % 1000)
    _check(q, k, v, dtype, **opts)


SEGMENT_CASES = [
    # (batch, seq, heads, kv_heads, dim, dtype, documents, options)
    (2, 1000, 4, 2, 128, "bf16", 4, {}),
    (2, 4099, 2, 1, 64, "fp16", 3, {"causal": True}),
    (1, 2048, 4, 4, 256, "bf16", 5, {"causal": True, "window": (300, 0)}),
    (3, 517, 8, 2, 128, "fp16", 40, {"window": (50, 50)}),
]


@pytest.mark.parametrize("dim", [64, 128])
def test_tma_persistent_rounds(dim):
    """The persistent TMA tile with more query tiles than SMs (each CTA takes several, every other round in
    reverse): equal to the reference, and bitwise equal to the same tile run one query tile per CTA, with no mask,
    causal, a window and segments (a ragged last query tile, GQA)."""
    import dataclasses

    import cupy

    from attention import configs, flash_attention
    from attention.suites import packed_segment_ids
    from cukernels import device, tune

    plans = [p for p in _tma_plans(dim) if p.config.persistent]
    assert plans, "no persistent TMA tile fits this GPU"
    batch, seq, heads, kv_heads = 3, 1100, 8, 2
    tiles = batch * heads * -(-seq // plans[0].config.block_m)
    assert tiles > device.current().sm_count  # several rounds per CTA
    q, k, v = _inputs(batch, seq, seq, heads, kv_heads, dim, "bf16", seed=dim + 11)
    ids = cupy.asarray(packed_segment_ids(batch, seq, 4, seed=dim))
    for plan in plans:
        single = tune.explicit(dataclasses.replace(plan.config, persistent=False), device.current())
        for kw in ({}, {"causal": True}, {"window": (300, 40)}, {"segment_ids": ids}):
            o, lse = _check(q, k, v, "bf16", plan=plan, **kw)
            o1, lse1 = flash_attention(q, k, v, return_lse=True, plan=single, **kw)
            assert bool(cupy.array_equal(o.view(cupy.uint16), o1.view(cupy.uint16))), (plan.config, kw)
            assert bool(cupy.array_equal(lse, lse1)), (plan.config, kw)


@pytest.mark.parametrize("dim", [64, 128])
def test_tma_persistent_tile_orders(monkeypatch, dim):
    """The persistent TMA tile's two tile orders under a causal/window mask (head by head, and by weight across
    heads: configs.persistent_order decides from the K/V size; forced both ways here), with a ragged last query
    tile, GQA and several rounds per CTA: bitwise equal to one query tile per CTA."""
    import dataclasses

    import cupy

    from attention import api, flash_attention
    from cukernels import device, tune

    plans = [p for p in _tma_plans(dim) if p.config.persistent]
    assert plans, "no persistent TMA tile fits this GPU"
    q, k, v = _inputs(2, 1500, 1500, 8, 2, dim, "fp16", seed=dim + 17)
    for plan in plans:
        single = tune.explicit(dataclasses.replace(plan.config, persistent=False), device.current())
        for kw in ({"causal": True}, {"window": (700, 0)}):
            monkeypatch.setattr(api, "tile_order", lambda *a, **k: False)
            api._FORWARD.clear()
            o1, lse1 = flash_attention(q, k, v, return_lse=True, plan=single, **kw)
            for by_weight in (False, True):
                monkeypatch.setattr(api, "tile_order", lambda *a, **k: by_weight)
                api._FORWARD.clear()  # the call is built anew with the forced order
                o, lse = flash_attention(q, k, v, return_lse=True, plan=plan, **kw)
                same = cupy.array_equal(o.view(cupy.uint16), o1.view(cupy.uint16))
                assert bool(same), (plan.config, kw, by_weight)
                assert bool(cupy.array_equal(lse, lse1)), (plan.config, kw, by_weight)
    api._FORWARD.clear()


@pytest.mark.parametrize("dim", [64, 128])
def test_tma_persistent_first_tile_without_keys(monkeypatch, dim):
    """A persistent CTA whose first query tile sees no key (causal, seq_q > seq_kv: the first rows see none) and
    whose next tile does: thread 0 issues a tile's first K/V stage before the setup barrier only where the tile has
    one, and the producer then loads the next tile's first stage itself (docs/perf/attention.md v3.9). Head by head
    order (the one that puts such a tile first on a CTA); equal to the reference and bitwise to one tile per CTA."""
    import dataclasses

    import cupy

    from attention import api, flash_attention
    from cukernels import device, tune

    plans = [p for p in _tma_plans(dim) if p.config.persistent]
    assert plans, "no persistent TMA tile fits this GPU"
    seq_q, seq_kv, heads = 2048, 1536, 16
    q, k, v = _inputs(1, seq_q, seq_kv, heads, 8, dim, "bf16", seed=dim + 23)
    monkeypatch.setattr(api, "tile_order", lambda *a, **k: False)
    for plan in plans:
        bm, sms = plan.config.block_m, device.current().sm_count
        n_m = -(-seq_q // bm)
        tiles = n_m * heads
        grid = min(tiles, sms)  # a persistent CTA per SM (flash_fwd_tma.cu)
        sees_keys = lambda t: (n_m - 1 - t % n_m) * bm + bm - 1 + seq_kv - seq_q >= 0  # noqa: E731
        # the kernel's order: round 0 of CTA c is tile c, round 1 tile 2 grid - 1 - c
        assert any(not sees_keys(c) and 2 * grid - 1 - c < tiles and sees_keys(2 * grid - 1 - c) for c in range(grid))
        single = tune.explicit(dataclasses.replace(plan.config, persistent=False), device.current())
        api._FORWARD.clear()
        o1, lse1 = flash_attention(q, k, v, return_lse=True, plan=single, causal=True)
        api._FORWARD.clear()
        o, lse = _check(q, k, v, "bf16", plan=plan, causal=True)
        assert bool(cupy.array_equal(o.view(cupy.uint16), o1.view(cupy.uint16))), plan.config
        assert bool(cupy.array_equal(lse, lse1)), plan.config
    api._FORWARD.clear()


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_tma_one_tile_orders(monkeypatch, dim):
    """One query tile per CTA launched by weight across heads (tile_order: the planner's choice under a causal mask
    whose K/V fit L2) or head by head: bitwise the same outputs, with a ragged last tile, GQA, no mask, causal and a
    window, on every one-tile TMA config of the head dim (the 64-row tile of one consumer among them)."""
    import cupy

    from attention import api, configs, flash_attention

    plans = [p for p in _tma_plans(dim) if not p.config.persistent]
    assert plans, "no one-tile TMA config fits this GPU"
    q, k, v = _inputs(2, 1100, 1100, 8, 2, dim, "bf16", seed=dim + 5)
    for plan in plans:
        for kw in ({}, {"causal": True}, {"window": (300, 0)}):
            if configs.mask_of(**kw) not in configs.kernel_masks(plan.config):
                continue  # (the 192-row tile has no causal/window kernel)
            out = []
            for by_weight in (False, True):
                monkeypatch.setattr(api, "tile_order", lambda *a, **k: by_weight)
                api._FORWARD.clear()
                out.append(flash_attention(q, k, v, return_lse=True, plan=plan, **kw))
            (o0, l0), (o1, l1) = out
            assert bool(cupy.array_equal(o0.view(cupy.uint16), o1.view(cupy.uint16))), (plan.config, kw)
            assert bool(cupy.array_equal(l0, l1)), (plan.config, kw)
    api._FORWARD.clear()


@pytest.mark.parametrize("case", SEGMENT_CASES, ids=[f"seg{c[6]}_s{c[1]}_d{c[4]}_{c[5]}_{len(c[7])}" for c in SEGMENT_CASES])
def test_segments(case):
    import cupy

    from attention.suites import packed_segment_ids

    batch, seq, heads, kv_heads, dim, dtype, docs, opts = case
    q, k, v = _inputs(batch, seq, seq, heads, kv_heads, dim, dtype, seed=docs)
    ids = cupy.asarray(packed_segment_ids(batch, seq, docs, seed=docs))
    _check(q, k, v, dtype, segment_ids=ids, **opts)


def test_segment_pair_and_empty_rows():
    """q/kv id pair with seq_q != seq_kv; ids present only on the query side give rows with no key."""
    import cupy

    q, k, v = _inputs(2, 300, 700, 4, 2, 128, "bf16", seed=7)
    q_ids = cupy.asarray(np.repeat(np.array([[0, 1, 2, 9]], dtype=np.int32), 75, axis=1).repeat(2, axis=0))
    kv_ids = cupy.asarray(np.sort(np.random.default_rng(1).integers(0, 3, size=(2, 700)), axis=1).astype(np.int32))
    o, lse = _check(q, k, v, "bf16", segment_ids=(q_ids, kv_ids))
    empty = cupy.asnumpy(q_ids == 9)
    o_host = dtypes.bf16_to_float32(cupy.asnumpy(o))
    assert (o_host[empty] == 0).all()
    lse_host = cupy.asnumpy(lse).transpose(0, 2, 1)
    assert np.isneginf(lse_host[empty]).all()


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_fully_masked_rows_zero_not_nan(dim):
    """Rows 0..549 see no key (bottom-right alignment): whole CTAs skip the KV loop, so their epilogue must
    not race the Q tile's in-flight copies (Q stays in shared memory at head_dim 256)."""
    import cupy

    q, k, v = _inputs(1, 600, 50, 2, 2, dim, "fp16", seed=3)
    o, lse = _check(q, k, v, "fp16", causal=True)
    o_host = cupy.asnumpy(o).astype(np.float32)
    assert (o_host[:, :550] == 0).all() and np.isfinite(o_host).all()
    assert np.isneginf(cupy.asnumpy(lse)[:, :, :550]).all()


def test_strided_views_of_packed_qkv():
    import cupy

    qkv = dtypes.random((2, 333, 3, 4, 128), dtypes.FP16, seed=11)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    _check(q, k, v, "fp16", causal=True)
    bad = cupy.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    from attention import flash_attention

    with pytest.raises(ValueError, match="q must be contiguous along head_dim"):
        flash_attention(bad, k, v)


def test_softmax_scale_and_plain_output():
    q, k, v = _inputs(1, 100, 100, 2, 2, 64, "bf16", seed=5)
    _check(q, k, v, "bf16", softmax_scale=0.3)
    from attention import flash_attention

    o = flash_attention(q, k, v, softmax_scale=0.3)
    assert o.shape == q.shape


def test_torch_tensors_bf16():
    torch = pytest.importorskip("torch")
    from attention import attention_reference, flash_attention

    q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16)
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16 and o.shape == q.shape
    qc, kc, vc = (dtypes.as_cupy(t, name="x")[0] for t in (q, k, v))
    ref = attention_reference(qc, kc, vc, causal=True)
    naive = attention_reference(qc, kc, vc, causal=True, round_to="bf16")
    checks.compare(o, ref, tol=checks.Tolerance(atol=ATOL["bf16"]), naive=naive).raise_if_failed()
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(4, 2).transpose(1, 2), v.repeat_interleave(4, 2).transpose(1, 2),
        is_causal=True).transpose(1, 2)
    assert (o.float() - sdpa.float()).abs().max().item() < 0.05


def test_host_arrays_rejected_before_launch():
    from attention import flash_attention

    q = np.zeros((1, 8, 2, 64), dtype=np.float16)
    with pytest.raises(TypeError, match="host data"):
        flash_attention(q, q, q)


# The portable mma.sync kernel, forced on GPUs whose planner prefers another (the wgmma kernel on sm_90a).
MMA_SYNC_CASES = [
    (2, 257, 257, 4, 2, 64, "fp16", {}),
    (1, 1000, 1000, 2, 1, 128, "bf16", {"causal": True}),
    (1, 333, 333, 2, 2, 256, "fp16", {"window": (64, 32)}),
    (2, 17, 1000, 4, 4, 128, "fp16", {"causal": True}),
]


@pytest.mark.parametrize("case", MMA_SYNC_CASES, ids=lambda c: f"{c[1]}x{c[2]}_d{c[5]}_{c[6]}_{sorted(c[7])}")
def test_mma_sync_kernel_everywhere(case):
    from attention import configs
    from cukernels import device, tiling

    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, kw = case
    spec = device.current()
    mma = [c for c in configs.plannable(spec, dim) if isinstance(c, configs.FwdConfig)]
    if not mma:
        mma = [c for c in configs.search_space(dim) if isinstance(c, configs.FwdConfig) and tiling.fits(c, spec) is None][:1]
    plan = tiling.Plan(config=mma[0], smem_bytes=mma[0].smem_bytes(), limit=spec.smem_per_block_optin,
                       reason="forced mma.sync")
    q, k, v = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed=11)
    _check(q, k, v, dtype, plan=plan, **kw)


# The warp-specialised TMA kernel (sm_90a with cuda-bindings), forced with each of its tiles on every case above:
# the planner gives small grids the 64-row wgmma tile, so most of these would not reach it otherwise.
def _tma_plans(dim):
    from attention import configs
    from cukernels import device, tma, tune

    spec = device.current()
    if spec.arch != "sm_90a":
        pytest.skip(f"the TMA kernel needs sm_90a, this GPU is {spec.arch}")
    if (why := tma.available()) is not None:
        pytest.skip(why)
    return [tune.explicit(c, spec) for c in configs.tma_tiles(spec, dim)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tma_kernel(case):
    batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, opts = case
    q, k, v = _inputs(batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, seed=zlib.crc32(IDS[CASES.index(case)].encode()) % 997)
    for plan in _tma_plans(dim):
        _check(q, k, v, dtype, plan=plan, **opts)


@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_tma_kernel_row_max_jumps(dim, dtype, causal):
    """Lazy rescaling (docs/perf/attention.md v3.10): the TMA forward keeps a row's old max while it grows by at most
    2^8 and rescales O only past that. Keys whose scores jump by far more than that from one K/V tile to a later
    one (K scaled by 8 and then 40 over the sequence), and tiles whose max stays or falls, on every TMA tile."""
    import cupy

    q, k, v = _inputs(1, 700, 700, 4, 2, dim, dtype, seed=dim + len(dtype) + causal)
    gain = np.ones(700, dtype=np.float32)
    gain[200:400], gain[400:] = 8.0, 40.0
    gain[600:] = 0.5  # and a fall after the jumps
    dt = dtypes.from_name(dtype)
    k = dtypes.from_float32(dtypes.to_float32(k) * cupy.asarray(gain)[None, :, None, None], dt)
    for plan in _tma_plans(dim):
        _check(q, k, v, dtype, plan=plan, causal=causal)


@pytest.mark.parametrize("case", SEGMENT_CASES, ids=[f"seg{c[6]}_s{c[1]}_d{c[4]}_{c[5]}_{len(c[7])}" for c in SEGMENT_CASES])
def test_tma_kernel_segments(case):
    import cupy

    from attention.suites import packed_segment_ids

    batch, seq, heads, kv_heads, dim, dtype, docs, opts = case
    q, k, v = _inputs(batch, seq, seq, heads, kv_heads, dim, dtype, seed=docs + 5)
    ids = cupy.asarray(packed_segment_ids(batch, seq, docs, seed=docs))
    for plan in _tma_plans(dim):
        _check(q, k, v, dtype, plan=plan, segment_ids=ids, **opts)


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_tma_kernel_strided_and_empty_rows(dim):
    """Strided views of a packed qkv tensor (the maps carry the strides); rows with no visible key (zeros, LSE
    -inf) and CTAs with no KV tile at all."""
    import cupy

    qkv = dtypes.random((2, 333, 3, 4, dim), dtypes.BF16, seed=dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q2, k2, v2 = _inputs(1, 600, 50, 2, 2, dim, "fp16", seed=3)
    for plan in _tma_plans(dim):
        if not _serves(plan, causal=True):
            continue
        _check(q, k, v, "bf16", plan=plan, causal=True)
        o, lse = _check(q2, k2, v2, "fp16", plan=plan, causal=True)
        assert (cupy.asnumpy(o)[:, :550] == 0).all()
        assert np.isneginf(cupy.asnumpy(lse)[:, :, :550]).all()


def test_tma_plan_refused_for_a_broadcast_axis():
    """A k/v broadcast over the batch (stride 0) is a layout tensor maps cannot hold: the planner takes another
    kernel, and a TMA plan handed in is refused by name before any launch."""
    import cupy

    from attention import configs, flash_attention
    from cukernels import device

    plans = _tma_plans(128)
    q, k, v = _inputs(3, 200, 200, 4, 2, 128, "bf16", seed=9)
    kb, vb = (cupy.broadcast_to(x[:1], x.shape) for x in (k, v))
    problem = configs.FwdProblem(batch=3, seq_q=200, seq_kv=200, heads=4, kv_heads=2, head_dim=128, tma_layout=False)
    assert not isinstance(configs.plan_forward(problem, device.current()).config, configs.FwdTmaConfig)
    _check(q, kb, vb, "bf16")
    with pytest.raises(ValueError, match="tensor maps"):
        flash_attention(q, kb, vb, plan=plans[0])
