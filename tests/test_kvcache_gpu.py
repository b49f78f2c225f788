"""flash_attention_with_kvcache against the fp32 reference per sequence: contiguous and paged caches (shuffled
pages), ragged lengths including 0, 1 and page boundaries, appended k/v, GQA packing, causal bottom-right for
seq_q > 1, windows, every head dim and dtype, any number of splits; bad input refused before any launch."""
from __future__ import annotations

import numpy as np
import pytest

from cukernels import checks, dtypes

pytestmark = pytest.mark.gpu

ATOL = {"fp16": 1e-3, "bf16": 8e-3}


def _case(batch, seq_q, heads, kv_heads, dim, lens, *, dtype="bf16", page=None, max_seq=None, new=0, seed=0):
    """Inputs: q, the cache (contiguous or paged with a shuffled block table), cache_seqlens, k/v new tokens."""
    import cupy

    dt = dtypes.from_name(dtype)
    max_seq = max_seq or max(max(lens) + new, 1)
    q = dtypes.random((batch, seq_q, heads, dim), dt, seed=seed)
    lens_d = cupy.asarray(np.asarray(lens, dtype=np.int32))
    kn = vn = None
    if new:
        kn = dtypes.random((batch, new, kv_heads, dim), dt, seed=seed + 5)
        vn = dtypes.random((batch, new, kv_heads, dim), dt, seed=seed + 6)
    if page is None:
        kc = dtypes.random((batch, max_seq, kv_heads, dim), dt, seed=seed + 1)
        vc = dtypes.random((batch, max_seq, kv_heads, dim), dt, seed=seed + 2)
        return q, kc, vc, lens_d, None, kn, vn
    max_pages = -(-max_seq // page)
    pages = batch * max_pages + 3
    kc = dtypes.random((pages, page, kv_heads, dim), dt, seed=seed + 1)
    vc = dtypes.random((pages, page, kv_heads, dim), dt, seed=seed + 2)
    order = np.random.default_rng(seed).permutation(pages)[: batch * max_pages]
    table = cupy.asarray(order.reshape(batch, max_pages).astype(np.int32))
    return q, kc, vc, lens_d, table, kn, vn


def _check(q, kc, vc, lens, table, kn, vn, dtype, num_splits=None, **kw):
    import cupy

    from attention import flash_attention_with_kvcache
    from attention.kvcache import kvcache_reference

    kc0, vc0 = kc.copy(), vc.copy()
    ref_o, ref_lse = kvcache_reference(q, kc0, vc0, lens, block_table=table, k=kn, v=vn, **kw)
    checks.poison_pool(q.size * 2 + (1 << 20))
    o, lse = flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, k=kn, v=vn,
                                          num_splits=num_splits, return_lse=True, **kw)
    cupy.cuda.Device().synchronize()
    assert o.shape == q.shape and o.dtype == q.dtype
    naive_kw = dict(kw)
    tol = checks.Tolerance(atol=ATOL[dtype], rtol=2e-2)
    checks.compare(o, ref_o, tol=tol, name="o").raise_if_failed()
    finite = cupy.isfinite(ref_lse)
    assert bool((cupy.isfinite(lse) == finite).all())
    checks.compare(cupy.where(finite, lse, 0), cupy.where(finite, ref_lse, 0),
                   tol=checks.Tolerance(atol=2e-3, rtol=2e-4), name="lse").raise_if_failed()
    del naive_kw
    return o, lse


@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_decode_contiguous_ragged(dim, dtype):
    _check(*_case(4, 1, 8, 2, dim, [0, 1, 300, 1000], dtype=dtype, max_seq=1024, seed=dim), dtype)


@pytest.mark.parametrize("page", [16, 48, 64, 240, 256])  # 48, 240: page / 16 not a power of two
def test_paged_shuffled_pages_and_page_boundaries(page):
    lens = [0, 1, page, page + 1, 3 * page - 1, 5 * page]
    _check(*_case(6, 1, 8, 8, 128, lens, page=page, max_seq=6 * page, seed=page), "bf16")


@pytest.mark.parametrize("dim,ring", [(64, (4, 4)), (64, (8, 3)), (128, None)])
@pytest.mark.parametrize("splits", [1, 3])
def test_paged_long_splits_wrap_the_page_lookup_ring(dim, ring, splits, monkeypatch):
    """A CTA that streams many stages of a shuffled paged cache: the page lookups (a block of stages at a time, in
    a ring of two blocks) wrap many times, on the 4 x 4 and 8 x 3 rings of head dim 64 and the planned one of 128."""
    from attention import decode_configs, kvcache

    if ring is not None:
        space = decode_configs.search_space
        monkeypatch.setattr(decode_configs, "search_space", lambda *a, **kw: [
            decode_configs.DecodeConfig(head_dim=dim, warps=ring[0], stages=ring[1])] + space(*a, **kw))
    kvcache._CACHE.clear()
    try:
        _check(*_case(2, 1, 8, 2, dim, [700, 2000], page=16, max_seq=2048, seed=dim + splits), "bf16",
               num_splits=splits)
        if ring is not None:
            assert [c.config.warps for c in kvcache._CACHE._entries.values()] == [ring[0]]
    finally:
        kvcache._CACHE.clear()


@pytest.mark.parametrize("pipe", [False, True])
@pytest.mark.parametrize("dim,page,seq_q,splits,window", [
    (64, 16, 1, 1, None), (128, 48, 4, 3, None), (256, 16, 1, 4, None), (128, None, 4, 2, None),
    (256, None, 3, 1, None), (64, 48, 2, 1, (37, 0)), (128, 16, 1, 2, (300, 0)), (256, 256, 1, None, None)])
def test_both_copy_pipelines(pipe, dim, page, seq_q, splits, window, monkeypatch):
    """Each warp copying its own keys (flash_decode's WARP_PIPE) and the CTA copying each stage, forced either
    way: shuffled pages (a warp's page ids in its lanes, more than a block of 32 stages at 3,000 keys), ragged
    lengths with 0, 1 and page boundaries, GQA rows over several tiles, splits (4: a cluster), windows whose start
    moves the first group, every head dim (256: Q read from shared memory in the loop)."""
    from attention import decode_configs, kvcache

    monkeypatch.setattr(decode_configs, "WARP_PIPE", pipe)
    lens = [0, 1, 16, 48, 1000, 3000]
    kvcache._CACHE.clear()
    try:
        _check(*_case(6, seq_q, 8, 2, dim, lens, page=page, max_seq=3072, seed=dim + seq_q), "bf16",
               num_splits=splits, window=window, causal=window is not None)
        assert [c.config.warp_pipe for c in kvcache._CACHE._entries.values()] == [pipe]
    finally:
        kvcache._CACHE.clear()


@pytest.mark.parametrize("splits,page", [(1, None), (3, 16), (4, None)])  # 4: one cluster on sm_90
def test_without_lse_the_output_is_the_same(splits, page):
    """return_lse=False passes the kernel no LSE buffer (nothing is written, none is allocated): the output is
    bitwise that of the call that returns the LSE, with one split, splits merged in global memory and a cluster."""
    import cupy

    from attention import flash_attention_with_kvcache

    q, kc, vc, lens, table, _, _ = _case(3, 2, 8, 2, 128, [0, 300, 1000], page=page, max_seq=1024, seed=splits)
    o1, lse = flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, num_splits=splits,
                                           return_lse=True)
    o2 = flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, num_splits=splits)
    cupy.cuda.Device().synchronize()
    assert lse.shape == (3, 8, 2) and bool((o1 == o2).all())


@pytest.mark.parametrize("seq_q,causal", [(1, False), (4, True), (4, False), (7, True)])
def test_gqa_packing_and_causal_bottom_right(seq_q, causal):
    # 32 query heads over 8 KV heads: 4 x seq_q packed rows per KV head (more than 16 rows: several row tiles)
    _check(*_case(2, seq_q, 32, 8, 128, [513, 2000], max_seq=2048, seed=seq_q), "bf16", causal=causal)


def test_append_new_tokens_lands_in_the_right_slots():
    import cupy

    from attention import flash_attention_with_kvcache

    q, kc, vc, lens, table, kn, vn = _case(3, 2, 4, 2, 64, [5, 16, 31], page=16, max_seq=64, new=2, seed=9)
    _check(q, kc.copy(), vc.copy(), lens, table, kn, vn, "bf16", causal=True)
    flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, k=kn, v=vn, causal=True)
    cupy.cuda.Device().synchronize()
    t = cupy.asnumpy(table)
    for b, n in enumerate(cupy.asnumpy(lens)):
        for i in range(2):
            j = int(n) + i
            page, slot = int(t[b, j // 16]), j % 16
            assert bool((kc[page, slot] == kn[b, i]).all()) and bool((vc[page, slot] == vn[b, i]).all())


def test_splits_give_the_same_answer():
    case = _case(2, 1, 8, 2, 128, [3000, 4096], max_seq=4096, seed=3)
    outs = [_check(*case, "bf16", num_splits=s)[0] for s in (1, 2, 7, 32)]
    for o in outs[1:]:
        checks.compare(o, outs[0], tol=checks.Tolerance(atol=8e-3, rtol=1e-2), name="splits").raise_if_failed()


@pytest.mark.parametrize("dim,page,seq_q,splits", [(64, None, 1, 8), (128, None, 5, 4), (256, None, 3, 2),
                                                    (128, 16, 1, 8), (64, 64, 4, 2), (256, 32, 2, 4)])
def test_splits_merged_in_a_cluster(dim, page, seq_q, splits):
    """sm_90: 2, 4 or 8 splits of a tile are one thread block cluster that merges its rows through distributed
    shared memory (flash_decode_cluster): ragged lengths (0, 1, a page boundary), GQA rows over two row tiles
    (the second partly filled), contiguous and paged, against the reference; other split counts and older GPUs
    take the global merge."""
    from attention import kvcache
    from cukernels import device

    lens = [0, 1, 64, 700]
    kvcache._CACHE.clear()
    _check(*_case(4, seq_q, 16, 2, dim, lens, page=page, max_seq=1024, seed=dim + seq_q), "bf16",
           num_splits=splits, causal=seq_q > 1)
    clustered = [c.cluster for c in kvcache._CACHE._entries.values()]
    assert clustered == [splits if device.current().compute_capability >= (9, 0) else 1]


@pytest.mark.parametrize("page,splits,dtype,causal,window", [(None, None, "bf16", False, None),
                                                              (None, 3, "fp16", True, None),
                                                              (None, 4, "bf16", True, None),
                                                              (32, None, "bf16", True, (200, 0)),
                                                              (64, 5, "bf16", False, None)])
def test_head_dim_64_in_pairs(page, splits, dtype, causal, window):
    """Head dim 64 on a grid that fills the GPU runs KV heads in pairs (one 128-wide row per key): ragged lengths
    (0 and 1 included), GQA, seq_q 2, splits, paged, causal/window, against the reference; LSE of both halves."""
    from attention import kvcache
    from attention.decode_configs import DecodeProblem, paired
    from cukernels import device

    spec = device.current()
    kv_heads = 8
    batch = -(-spec.sm_count // kv_heads) + 1
    problem = DecodeProblem(batch=batch, seq_q=2, heads=16, kv_heads=kv_heads, head_dim=64, max_keys=1024,
                            dtype=dtype, paged=page is not None)
    assert paired(problem, spec) is not None
    lens = [int(x) for x in np.random.default_rng(11).integers(0, 1023, batch)]
    lens[0], lens[1] = 0, 1
    case = _case(batch, 2, 16, kv_heads, 64, lens, dtype=dtype, page=page, max_seq=1024, seed=12)
    kvcache._CACHE.clear()
    kw = dict(causal=causal) if window is None else dict(causal=causal, window=window)
    _check(*case, dtype, num_splits=splits, **kw)
    assert any(c.pair for c in kvcache._CACHE._entries.values())


def _replays_in_a_graph(call, ref, tol):
    """``call`` captured on a stream of its own (CuPy graph), the graph replayed twice into a zeroed output, each
    replay checked against ``ref``."""
    import cupy

    capture = cupy.cuda.Stream(non_blocking=True)
    with capture:
        capture.begin_capture()
        captured = call()
        graph = capture.end_capture()
        for _ in range(2):
            captured[...] = 0
            graph.launch()
            capture.synchronize()
            checks.compare(captured, ref, tol=tol, name="graph replay").raise_if_failed()


def _all_equal_to(outs, ref, tol):
    import cupy

    cupy.cuda.Device().synchronize()
    for i, o in enumerate(outs):
        checks.compare(o, ref, tol=tol, name=f"call {i}").raise_if_failed()


def test_split_counters_reset_across_calls_streams_and_graphs():
    """The last split of a tile sets its counter back to zero (no memset per call): back-to-back calls, a second
    stream and a captured graph replayed twice each give the reference answer."""
    import cupy

    from attention import flash_attention_with_kvcache
    from attention.kvcache import kvcache_reference

    q, kc, vc, lens, table, _, _ = _case(3, 2, 8, 2, 128, [1, 2500, 4096], page=64, max_seq=4096, seed=7)
    ref, _ = kvcache_reference(q, kc, vc, lens, block_table=table, causal=True)
    tol = checks.Tolerance(atol=8e-3, rtol=2e-2)

    def call():
        return flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                            num_splits=9, check_values=False)
    outs = [call() for _ in range(4)]
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        outs += [call() for _ in range(2)]
    side.synchronize()
    _replays_in_a_graph(call, ref, tol)
    outs.append(call())
    _all_equal_to(outs, ref, tol)


def test_cluster_merge_back_to_back_and_in_a_graph():
    """The cluster merge keeps nothing between launches (no counters, no partials): back-to-back calls and a
    captured graph replayed twice give the reference answer."""
    from attention import flash_attention_with_kvcache
    from attention.kvcache import kvcache_reference

    q, kc, vc, lens, table, _, _ = _case(3, 1, 8, 2, 128, [0, 300, 1024], page=16, max_seq=1024, seed=21)
    ref, _ = kvcache_reference(q, kc, vc, lens, block_table=table)
    tol = checks.Tolerance(atol=8e-3, rtol=2e-2)

    def call():
        return flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, num_splits=4,
                                            check_values=False)
    outs = [call() for _ in range(3)]
    _replays_in_a_graph(call, ref, tol)
    _all_equal_to(outs, ref, tol)


def test_window():
    _check(*_case(2, 3, 8, 4, 64, [700, 1500], max_seq=1536, seed=4), "fp16", window=(100, 0), causal=True)


@pytest.mark.parametrize("dim,splits", [(64, 1), (128, 5), (256, 3)])
def test_paged_window_starts_between_groups(dim, splits):
    """A paged cache reads keys in 16-key groups from a multiple of 16: a window whose first key is not on one
    (37 keys back, page 48) loads a few keys below it, which must stay masked, with and without splits."""
    lens = [0, 1, 48, 95, 700]
    _check(*_case(5, 2, 8, 2, dim, lens, page=48, max_seq=768, seed=dim), "bf16", num_splits=splits,
           window=(37, 0), causal=True)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    from attention import flash_attention_with_kvcache
    from attention.kvcache import kvcache_reference

    q = torch.randn(2, 1, 16, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 512, 4, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(2, 512, 4, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([100, 512], device="cuda", dtype=torch.int32)
    o = flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16
    import cupy

    def c(t):
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    ref, _ = kvcache_reference(c(q), c(kc), c(vc), cupy.from_dlpack(lens))
    checks.compare(c(o), ref, tol=checks.Tolerance(atol=8e-3, rtol=2e-2), name="o").raise_if_failed()


def test_bad_input_is_refused_before_launch():
    import cupy

    from attention import flash_attention_with_kvcache

    q, kc, vc, lens, table, _, _ = _case(2, 1, 4, 2, 64, [10, 20], page=16, max_seq=32, seed=1)
    cases = [
        (dict(cache_seqlens=cupy.asarray([10, 40], dtype=cupy.int32), block_table=table), ValueError,
         r"cache_seqlens\[1\] = 40"),
        (dict(cache_seqlens=lens.astype(cupy.int64), block_table=table), TypeError, "cache_seqlens must be int32"),
        (dict(cache_seqlens=lens, block_table=table.astype(cupy.float32)), TypeError, "block_table must be int32"),
        (dict(cache_seqlens=lens, block_table=table[:1]), ValueError, "block_table"),
        (dict(cache_seqlens=lens, block_table=table + 1000), ValueError, r"page ids must be in"),
        (dict(cache_seqlens=lens, block_table=table, num_splits=0), ValueError, "num_splits"),
        (dict(cache_seqlens=lens, block_table=table, k=q[:, :, :2]), ValueError, "pass both"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            flash_attention_with_kvcache(q, kc, vc, **kw)
    with pytest.raises(ValueError, match="page size"):
        flash_attention_with_kvcache(q, kc[:, :8], vc[:, :8], cache_seqlens=lens, block_table=table)
