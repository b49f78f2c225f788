"""Grouped GEMM and MoE layer on a GPU, against float64 references: random and empty groups, ragged tails in M,
N and K, both dtypes, every epilogue, every config that fits, poisoned outputs, CUDA-graph capture of the layer."""
import dataclasses

import numpy as np
import pytest

from cukernels import checks, device, dtypes, tma
from moe import gemm_configs
from moe.grouped_gemm import grouped_gemm, interleave_gate_up, reference
from moe.layer import MoELayer, reference_forward

pytestmark = pytest.mark.gpu
DTYPES = [np.float16, dtypes.BF16]
TOL = {"fp16": checks.Tolerance(atol=1e-3, naive_factor=2.0), "bf16": checks.Tolerance(atol=8e-3, naive_factor=2.0)}


def _groups(rows, experts, rng, *, empty=(1,)):
    """Random group sizes summing to rows, with the experts in ``empty`` given no rows."""
    w = rng.random(experts)
    w[list(empty)] = 0
    counts = np.floor(w / w.sum() * rows).astype(np.int64)
    counts[int(np.argmax(w))] += rows - counts.sum()
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def _problem(rows, n, k, experts, dtype, seed, *, empty=(1,)):
    import cupy

    rng = np.random.default_rng(seed)
    a = dtypes.random((rows, k), dtype, seed=seed)
    b = dtypes.random((experts, n, k), dtype, seed=seed + 1, scale=1.0 / np.sqrt(k))
    off = _groups(rows, experts, rng, empty=empty)
    return a, b, cupy.asarray(off), off


def _naive(ref, dtype):
    """The reference rounded to the storage dtype: the error no kernel can avoid."""
    return dtypes.to_float32(dtypes.from_float32(ref.astype(np.float32), dtype))


def _check(out, ref, dtype, name):
    res = checks.compare(out, ref, tol=TOL[dtypes.dtype_name(dtype)], naive=_naive(ref, dtype), name=name)
    res.raise_if_failed()
    return res


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
@pytest.mark.parametrize("epilogue", [None, "swiglu", "gelu"])
@pytest.mark.parametrize("scaled", [False, True])
def test_grouped_gemm_matches_reference(dtype, epilogue, scaled):
    import cupy

    # 1000 rows over 7 experts (one empty): tails in M; N = 336 is not a multiple of 128/256; K = 264 not of 64
    a, b, off_d, _ = _problem(1000, 336, 264, 7, dtype, seed=11)
    scale = cupy.random.default_rng(3).random(1000, dtype=cupy.float32) + 0.5 if scaled else None
    checks.poison_pool(64 << 20)
    out = grouped_gemm(a, b, off_d, epilogue=epilogue, row_scale=scale)
    ref = reference(a, b, off_d, epilogue=epilogue, row_scale=scale)
    _check(out, ref, dtype, f"grouped_gemm {dtypes.dtype_name(dtype)} {epilogue} scaled={scaled}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
def test_fp32_output(dtype):
    import cupy

    a, b, off_d, _ = _problem(300, 40, 72, 3, dtype, seed=21, empty=())
    scale = cupy.random.default_rng(5).random(300, dtype=cupy.float32)
    checks.poison_pool(16 << 20)
    out = grouped_gemm(a, b, off_d, out_dtype=np.float32, row_scale=scale)
    assert out.dtype == np.float32
    ref = reference(a, b, off_d, row_scale=scale)
    checks.compare(out, ref, tol=checks.Tolerance(atol=1e-4, rtol=1e-4), name="fp32 out").raise_if_failed()


def test_every_config_that_fits():
    import cupy

    spec = device.current()
    a, b, off_d, _ = _problem(777, 528, 136, 5, dtypes.BF16, seed=5, empty=(0, 3))
    scale = cupy.random.default_rng(4).random(777, dtype=cupy.float32)
    for epilogue in (None, "swiglu"):
        ref = reference(a, b, off_d, epilogue=epilogue, row_scale=scale)
        for cfg in gemm_configs.ALL:
            if cfg.smem_bytes() > spec.smem_per_block_optin:  # the 48 KiB edge (MEDIUM[2]) included
                continue
            if (cfg.kind != "mma" and spec.arch != "sm_90a") or epilogue not in cfg.epilogues():
                continue
            if cfg.kind == "tma" and tma.available():
                continue
            checks.poison_pool(64 << 20)
            out = grouped_gemm(a, b, off_d, epilogue=epilogue, row_scale=scale, config=cfg)
            _check(out, ref, dtypes.BF16, f"{cfg} {epilogue}")


def _tma_configs():
    spec = device.current()
    if spec.arch != "sm_90a":
        pytest.skip("the tma tile needs sm_90a")
    if tma.available():
        pytest.skip(tma.available())
    return [c for c in gemm_configs.TMA + gemm_configs.TMA_128 + gemm_configs.TMA_PAIR + gemm_configs.TMA_64
            + (dataclasses.replace(gemm_configs.TMA_128_KSPLIT, cluster_k=3),
               dataclasses.replace(gemm_configs.TMA_64[1], cluster_k=2))
            if c.smem_bytes() <= spec.smem_per_block_optin]


@pytest.mark.parametrize("epilogue", [None, "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
def test_tma_persistent_many_tiles(dtype, epilogue):
    """More tiles than SMs (each CTA loops, the stage ring's phases run on across tiles), skewed groups with an
    empty one and one of a single row, N and K tails, row scale."""
    import cupy

    rows, n, k, experts = 9000, 1040, 200, 9
    rng = np.random.default_rng(7)
    counts = np.array([4000, 0, 1, 129, 2000, 127, 1500, 243, 0])
    counts[-1] = rows - counts[:-1].sum()
    off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    a = dtypes.random((rows, k), dtype, seed=31)
    b = dtypes.random((experts, n, k), dtype, seed=32, scale=1.0 / np.sqrt(k))
    scale = cupy.asarray(rng.random(rows, dtype=np.float32) + 0.5)
    ref = reference(a, b, off, epilogue=epilogue, row_scale=scale)
    for cfg in _tma_configs():
        tiles = sum(-(-int(c) // 128) for c in counts) * -(-n // 256)
        assert tiles > cfg.grid(gemm_configs.GemmProblem(rows=rows, n=n, k=k, experts=experts, dtype="bf16"),
                                device.current().sm_count)
        checks.poison_pool(128 << 20)
        out = grouped_gemm(a, b, off, epilogue=epilogue, row_scale=scale, config=cfg)
        _check(out, ref, dtype, f"{cfg} {epilogue}")
        # rows outside [offsets[0], offsets[-1]) are not written: a sub-range of the groups
        sub = cupy.asarray(np.array([129, 129, 4129, 4130], dtype=np.int32))
        got = grouped_gemm(a, b[:3], sub, epilogue=epilogue, config=cfg)
        ref2 = reference(a, b[:3], sub, epilogue=epilogue)
        _check(got[129:4130], ref2[129:4130], dtype, f"{cfg} {epilogue} sub-range")


@pytest.mark.parametrize("epilogue", [None, "swiglu"])
@pytest.mark.parametrize("n", [1040, 1024])
def test_pair_tail_items(n, epilogue):
    """The B-multicast pair on groups whose last pair holds 1-128 rows (cut into tail items: both CTAs on the last
    m-tile, one n-tile each; an odd n-tile count leaves the last tail's second CTA past N) and groups that fill it:
    bitwise equal to the unpaired 128 x 256 tile and within tolerance of the reference; rows past the groups stay
    poisoned; one group (offsets=None) with a tail too."""
    import cupy

    cfgs = _tma_configs()
    pair, tile = gemm_configs.TMA_PAIR[0], gemm_configs.TMA[0]
    if pair not in cfgs:
        pytest.skip("the pair does not fit this GPU")
    dtype, k = dtypes.BF16, 200
    counts = np.array([1, 128, 129, 255, 256, 257, 384, 385, 0, 640, 2000, 100])
    rows = int(counts.sum()) + 16
    off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    a = dtypes.random((rows, k), dtype, seed=71)
    b = dtypes.random((len(counts), n, k), dtype, seed=72, scale=1.0 / np.sqrt(k))
    scale = cupy.asarray(np.random.default_rng(11).random(rows, dtype=np.float32) + 0.5)
    ref = reference(a, b, off, epilogue=epilogue, row_scale=scale)
    last = int(counts.sum())
    checks.poison_pool(64 << 20)
    got = grouped_gemm(a, b, off, epilogue=epilogue, row_scale=scale, config=pair)
    _check(got[:last], ref[:last], dtype, f"pair {epilogue} n {n}")
    assert (got[last:].view(np.uint16).get() == 0xFFFF).all(), "pair: rows past the groups were written"
    want = grouped_gemm(a, b, off, epilogue=epilogue, row_scale=scale, config=tile)
    assert (got[:last].view(np.uint16) == want[:last].view(np.uint16)).all(), "pair differs from the 128 x 256 tile"
    for dense_rows in (384, 500):  # 384: a tail item of 128 rows; 500: a last pair of 244
        d_a = a[:dense_rows].copy()
        d_got = grouped_gemm(d_a, b[:1], None, epilogue=epilogue, config=pair)
        d_want = grouped_gemm(d_a, b[:1], None, epilogue=epilogue, config=tile)
        assert (d_got.view(np.uint16) == d_want.view(np.uint16)).all(), f"pair, one group of {dense_rows} rows"


@pytest.mark.parametrize("epilogue", [None, "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
def test_tma_split_k(dtype, epilogue):
    """Split K on both tma tiles: K ranges of unequal length (K = 1000: 16 k tiles, a tail), splits 2-8, row scale,
    one group of 200 rows (a partial m tile) and a grouped case with an empty group; the poisoned output's rows
    outside the groups stay unwritten; the planner's own split for a weight-bound GEMM agrees too."""
    import cupy

    _tma_configs()
    n, k = 1296, 1000
    for counts in ([200], [70, 0, 300, 5]):
        rows = sum(counts) + 16  # rows past the last group: the reduce must not write them
        off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        a = dtypes.random((rows, k), dtype, seed=51)
        b = dtypes.random((len(counts), n, k), dtype, seed=52, scale=1.0 / np.sqrt(k))
        scale = cupy.asarray(np.random.default_rng(9).random(rows, dtype=np.float32) + 0.5)
        ref = reference(a, b, off, epilogue=epilogue, row_scale=scale)
        ksplit = gemm_configs.TMA_128_KSPLIT
        for cfg in (*(dataclasses.replace(base, split_k=split) for base, split in (
                (gemm_configs.TMA_128[0], 2), (gemm_configs.TMA_128[1], 3), (gemm_configs.TMA[0], 4),
                (gemm_configs.TMA_128[0], 8))),
                *(dataclasses.replace(ksplit, cluster_k=c) for c in (2, 3, 4)),
                dataclasses.replace(ksplit, cluster_k=3, stages=3),
                *(dataclasses.replace(base, cluster_k=c) for base in gemm_configs.TMA_64 for c in (2, 3, 4)),
                dataclasses.replace(gemm_configs.TMA_64[1], cluster_k=4, stages=2)):
            checks.poison_pool(64 << 20)
            out = grouped_gemm(a, b, off, epilogue=epilogue, row_scale=scale, config=cfg)
            last = sum(counts)
            _check(out[:last], ref[:last], dtype, f"{cfg} {epilogue} {counts}")
            assert (out[last:].view(np.uint16).get() == 0xFFFF).all(), f"{cfg}: rows past the groups were written"
    with pytest.raises(ValueError, match="exceeds K's 2 k tiles"):  # an empty split: refused before any launch
        grouped_gemm(a[:, :128].copy(), b[:, :, :128].copy(), off,
                     config=dataclasses.replace(gemm_configs.TMA[0], split_k=3))
    with pytest.raises(ValueError, match="cluster_k 3 exceeds K's 2 k tiles"):
        grouped_gemm(a[:, :128].copy(), b[:, :, :128].copy(), off,
                     config=dataclasses.replace(gemm_configs.TMA_128_KSPLIT, cluster_k=3))
    p = gemm_configs.GemmProblem(rows=128, n=4096, k=11008, experts=1, dtype=dtypes.dtype_name(dtype),
                                 epilogue=epilogue)
    plan = gemm_configs.plan(p, device.current())
    if device.current().sm_count >= 100:
        assert plan.config.kind == "tma" and plan.config.split_k * plan.config.cluster_k > 1, plan
    a = dtypes.random((128, 11008), dtype, seed=53)
    b = dtypes.random((1, 4096, 11008), dtype, seed=54, scale=1.0 / np.sqrt(11008))
    off = cupy.asarray(np.array([0, 128], dtype=np.int32))
    _check(grouped_gemm(a, b, off, epilogue=epilogue), reference(a, b, off, epilogue=epilogue), dtype,
           f"planned {plan.config}")


@pytest.mark.parametrize("epilogue", [None, "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
def test_dense_offsets_none(dtype, epilogue):
    """offsets=None (one group of all rows): the tma tiles read no offsets (rows from the call), the other tiles an
    array the call keeps; a partial last m tile (200 and 100 rows), N and K tails, row scale; every tma shape, the
    splits, a cluster split and the planner's choice; equal to the same call with offsets [0, rows]."""
    import cupy

    n, k = 784, 328
    spec = device.current()
    cfgs = [None, gemm_configs.MEDIUM[0]]
    if spec.arch == "sm_90a" and not tma.available():
        cfgs += [*gemm_configs.TMA_64, gemm_configs.TMA_128[0], gemm_configs.TMA[0], gemm_configs.TMA_PAIR[0],
                 dataclasses.replace(gemm_configs.TMA_128[0], split_k=2),
                 dataclasses.replace(gemm_configs.TMA_64[1], cluster_k=3)]
    for rows in (200, 100):
        a = dtypes.random((rows, k), dtype, seed=61)
        b = dtypes.random((1, n, k), dtype, seed=62, scale=1.0 / np.sqrt(k))
        scale = cupy.asarray(np.random.default_rng(3).random(rows, dtype=np.float32) + 0.5)
        off = cupy.asarray(np.array([0, rows], dtype=np.int32))
        ref = reference(a, b, None, epilogue=epilogue, row_scale=scale)
        for cfg in cfgs:
            checks.poison_pool(64 << 20)
            out = grouped_gemm(a, b, None, epilogue=epilogue, row_scale=scale, config=cfg)
            _check(out, ref, dtype, f"{cfg} {epilogue} rows {rows} offsets=None")
            same = grouped_gemm(a, b, off, epilogue=epilogue, row_scale=scale, config=cfg)
            assert (out.view(np.uint16) == same.view(np.uint16)).all(), f"{cfg}: offsets=None differs from [0, rows]"
    with pytest.raises(ValueError, match="needs b with one expert"):
        grouped_gemm(a, cupy.concatenate([b, b]), None)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
def test_rotary_epilogue(dtype):
    """rotary=(cos, sin, cols): q/k heads rotated in the tma epilogue, v columns untouched; head dims 64/128/256
    on every tile that holds them whole; positions wrap every seq rows (two sequences and a part); a partial last
    m tile; row scale after the rotation; the planner's choice; equal to the reference within the GEMM's bound."""
    import cupy

    spec = device.current()
    if spec.arch != "sm_90a" or tma.available():
        pytest.skip("the rotary epilogue runs on the sm_90a tma tiles")
    from models.norm_rope import rotary_tables

    rows, seq, k = 200, 80, 264
    for hd in (64, 128, 256):
        n = 3 * 2 * 256  # q, k, v of two heads of 256 (or more heads of a smaller dim)
        cols = 2 * n // 3
        cos, sin = rotary_tables(seq, hd, like=cupy.zeros(1))
        a = dtypes.random((rows, k), dtype, seed=hd)
        b = dtypes.random((1, n, k), dtype, seed=hd + 1, scale=1.0 / np.sqrt(k))
        scale = cupy.asarray(np.random.default_rng(hd).random(rows, dtype=np.float32) + 0.5)
        ref = reference(a, b, None, row_scale=scale, rotary=(cos, sin, cols))
        cfgs = [None] + [c for c in (*gemm_configs.TMA_64, *gemm_configs.TMA_128, *gemm_configs.TMA)
                         if gemm_configs.ROPE[hd] in c.epilogues()]
        for cfg in cfgs:
            checks.poison_pool(64 << 20)
            out = grouped_gemm(a, b, None, row_scale=scale, rotary=(cos, sin, cols), config=cfg)
            _check(out, ref, dtype, f"{cfg} rotary hd {hd}")
    with pytest.raises(ValueError, match="has no rope128 epilogue"):  # 64 columns cannot hold a head of 128
        grouped_gemm(a, b, None, rotary=(*rotary_tables(seq, 128, like=cupy.zeros(1)), 256),
                     config=gemm_configs.TMA_64[1])


def _skinny_cases():
    """Every split and rows-per-pass of the skinny tiles, the two warp widths alternating."""
    return [c for i, c in enumerate(gemm_configs.SKINNY) if i % 2 == (c.block_m // 8) % 2]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
def test_skinny_tiles(dtype):
    """Decode-sized groups: 0, 1, 7, 8, 9, 33 and 70 rows (more than one pass of every block_m), N and K tails
    (N = 336, K = 264: neither a multiple of a CTA's rows nor of 32), every epilogue, row scale, fp32 out."""
    import cupy

    counts = [0, 1, 7, 8, 0, 9, 33, 70]
    rows, n, k = sum(counts), 336, 264
    off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    a = dtypes.random((rows, k), dtype, seed=41)
    b = dtypes.random((len(counts), n, k), dtype, seed=42, scale=1.0 / np.sqrt(k))
    scale = cupy.asarray(np.random.default_rng(8).random(rows, dtype=np.float32) + 0.5)
    refs = {epi: reference(a, b, off, epilogue=epi, row_scale=scale) for epi in (None, "swiglu", "gelu")}
    for i, cfg in enumerate(_skinny_cases()):
        for epi in (None, "swiglu") + (("gelu",) if i % 4 == 0 else ()):
            checks.poison_pool(16 << 20)
            out = grouped_gemm(a, b, off, epilogue=epi, row_scale=scale, config=cfg)
            _check(out, refs[epi], dtype, f"{cfg} {epi}")
        if i % 4 == 1:
            out = grouped_gemm(a, b, off, out_dtype=np.float32, row_scale=scale, config=cfg)
            checks.compare(out, refs[None], tol=checks.Tolerance(atol=1e-4, rtol=1e-4),
                           name=f"{cfg} fp32 out").raise_if_failed()


def test_planner_takes_skinny_for_decode_groups():
    spec = device.current()
    for rows, experts in ((8, 64), (512, 64), (2, 32)):
        p = gemm_configs.GemmProblem(rows=rows, n=2816, k=2048, experts=experts, dtype="bf16", epilogue="swiglu")
        assert gemm_configs.plan(p, spec).config.kind == "skinny", (rows, experts)
    p = gemm_configs.GemmProblem(rows=8192, n=2816, k=2048, experts=64, dtype="bf16")
    assert gemm_configs.plan(p, spec).config.kind != "skinny"


def test_planner_takes_tma_for_large_problems():
    _tma_configs()
    p = gemm_configs.GemmProblem(rows=8192, n=11008, k=4096, experts=8, dtype="bf16")
    assert gemm_configs.plan(p, device.current()).config.kind == "tma"
    fp32 = gemm_configs.GemmProblem(rows=8192, n=11008, k=4096, experts=8, dtype="bf16", out_dtype="fp32")
    assert gemm_configs.plan(fp32, device.current()).config.kind != "tma"


@pytest.mark.parametrize("counts", [[0, 0, 300, 0], [1, 0, 0, 0], [0, 0, 0, 129], [128, 128, 0, 256]])
def test_edge_group_sizes(counts):
    import cupy

    rows = sum(counts)
    a = dtypes.random((rows, 64), np.float16, seed=1)
    b = dtypes.random((4, 64, 64), np.float16, seed=2, scale=0.125)
    off = cupy.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    checks.poison_pool(16 << 20)
    out = grouped_gemm(a, b, off)
    _check(out, reference(a, b, off), np.float16, f"counts {counts}")


def test_zero_rows_and_torch_inputs():
    import cupy

    b = dtypes.random((3, 16, 16), dtypes.BF16, seed=1)
    out = grouped_gemm(cupy.empty((0, 16), dtypes.BF16), b, cupy.zeros(4, cupy.int32))
    assert out.shape == (0, 16)
    torch = pytest.importorskip("torch")
    a = dtypes.random((40, 16), dtypes.BF16, seed=2)
    off = cupy.asarray([0, 10, 10, 40], dtype=cupy.int32)
    got = grouped_gemm(dtypes.like_input(a, True), dtypes.like_input(b, True), off)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    _check(dtypes.as_cupy(got, name="got")[0], reference(a, b, off), dtypes.BF16, "torch in/out")


def test_large_k_accumulates_in_fp32():
    a, b, off_d, _ = _problem(512, 256, 4096, 4, dtypes.BF16, seed=9, empty=())
    _check(grouped_gemm(a, b, off_d), reference(a, b, off_d), dtypes.BF16, "K=4096")


# ---------------------------------------------------------------- layer


def _graph_replays(layer, x, cases):
    """``layer`` captured on a CuPy stream over a static copy of ``x``, replayed for each (input, expected output)
    of ``cases`` into a poisoned output: bitwise equal each time."""
    import cupy

    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        static_x = x.copy()
        stream.begin_capture()
        out = layer(static_x)
        graph = stream.end_capture()
        for xi, want in cases:
            static_x[...] = xi
            checks.poison(out)
            graph.launch()
            stream.synchronize()
            assert bool((out == want).all())


def _layer(tokens, hidden, inter, experts, top_k, dtype, activation, seed=0):
    import cupy

    x = dtypes.random((tokens, hidden), dtype, seed=seed)
    router = cupy.random.default_rng(seed + 1).standard_normal((hidden, experts), dtype=cupy.float32)
    n_up = 2 * inter if activation == "swiglu" else inter
    if activation == "swiglu":
        g = dtypes.random((experts, inter, hidden), dtype, seed=seed + 2, scale=1 / np.sqrt(hidden))
        u = dtypes.random((experts, inter, hidden), dtype, seed=seed + 3, scale=1 / np.sqrt(hidden))
        w_up = interleave_gate_up(g, u)
    else:
        w_up = dtypes.random((experts, n_up, hidden), dtype, seed=seed + 2, scale=1 / np.sqrt(hidden))
    w_down = dtypes.random((experts, hidden, inter), dtype, seed=seed + 4, scale=1 / np.sqrt(inter))
    return x, router, w_up, w_down


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.dtype_name)
@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_layer_matches_reference(dtype, activation):
    x, router, w_up, w_down = _layer(300, 256, 384, 8, 2, dtype, activation)
    layer = MoELayer(router, w_up, w_down, 2, activation=activation)
    checks.poison_pool(64 << 20)
    out = layer(x)
    ref = reference_forward(x, router, w_up, w_down, 2, activation=activation)
    naive = reference_forward(x, router, w_up, w_down, 2, activation=activation, round_to=dtype)
    naive = _naive(naive, dtype)
    res = checks.compare(out, ref, tol=TOL[dtypes.dtype_name(dtype)], naive=naive, name=f"layer {activation}")
    res.raise_if_failed()


def _layer_fused_against_launch(flag, pair, dtype, top_k, seed, check_call):
    """The seed-``seed`` layer (1,500 tokens, hidden 328, 8 experts, SwiGLU) with its expert GEMMs forced onto the
    128 x 256 tma tile (``pair``: in pairs), built and called with ``moe.grouped_gemm.<flag>`` False then True:
    ``check_call(call, fused)`` on each cached call, each output bitwise equal over two calls and between the two
    settings, within tolerance of the reference, and again under a CUDA graph with fresh inputs."""
    import importlib

    from moe import layer as layer_mod

    gg = importlib.import_module("moe.grouped_gemm")  # (``from moe import grouped_gemm`` is the function)
    _tma_configs()
    x, router, w_up, w_down = _layer(1500, 328, 384, 8, top_k, dtype, "swiglu", seed=seed)
    tile = gemm_configs.TMA_PAIR[0] if pair else gemm_configs.TMA[0]
    outs = {}
    try:
        for fused in (False, True):
            setattr(gg, flag, fused)
            layer_mod._LAYER.clear()
            with gemm_configs.expert_gemms_planned_as(tile):
                layer = MoELayer(router, w_up, w_down, top_k)
                checks.poison_pool(64 << 20)
                outs[fused] = layer(x)
                again = layer(x)
            key = (*(layer_mod._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)),
                   top_k, "swiglu")
            check_call(layer_mod._LAYER.get(key), tile, fused)
            assert bool((again == outs[fused]).all()), f"{flag}={fused}: a second call differs"
        assert bool((outs[False] == outs[True]).all()), f"{flag}: the fused layer differs from the launches'"
        ref = reference_forward(x, router, w_up, w_down, top_k)
        naive = _naive(reference_forward(x, router, w_up, w_down, top_k, round_to=dtype), dtype)
        checks.compare(outs[True], ref, tol=TOL[dtypes.dtype_name(dtype)], naive=naive, name=flag).raise_if_failed()
        x2 = dtypes.random(x.shape, dtype, seed=seed + 70)
        with gemm_configs.expert_gemms_planned_as(tile):
            _graph_replays(layer, x, ((x2, layer(x2)), (x, outs[True])))
    finally:
        setattr(gg, flag, True)
        layer_mod._LAYER.clear()


@pytest.mark.parametrize("pair", [False, True])
def test_layer_tma_gather_equals_gather_launch(pair):
    """The token gather fused into the up-projection's loads on the 128 x 256 tma tile (alone and in pairs): the
    layer's output bitwise equal to the one with the gather launch, within tolerance of the reference; groups of
    ragged size (tails of pairs), K with a tail of the 64-wide k tile; again under a CUDA graph with fresh inputs."""
    def check(call, tile, fused):
        assert call.up.config == tile and call.fused_gather == fused, (call.up.config, call.fused_gather)

    _layer_fused_against_launch("TMA_GATHER", pair, dtypes.BF16, 2, 5, check)


@pytest.mark.parametrize("pair", [False, True], ids=["tile", "pair"])
@pytest.mark.parametrize("dtype,top_k", [(dtypes.BF16, 2), (dtypes.FP16, 2), (dtypes.BF16, 1), (dtypes.BF16, 3)],
                         ids=["bf16-top2", "fp16-top2", "bf16-top1", "bf16-top3"])
def test_layer_tma_scatter_equals_combine_launch(pair, dtype, top_k):
    """The combine fused into the down-projection on the 128 x 256 tma tile in pairs (the single tile keeps the
    combine launch): each row added into its token's row of the zeroed output by 16-byte reductions. With top-k <= 2
    the layer's output is bitwise equal to the one with the combine launch, call after call (the reductions' order
    cannot move a bit), within tolerance of the reference, and again under a CUDA graph with fresh inputs; ragged
    groups, hidden 328 (a partial pass and a tile past the last column). Top-k 3 keeps the combine launch."""
    def check(call, tile, fused):
        assert call.down.config == tile and call.fused_scatter == (fused and pair and top_k <= 2), (
            call.down.config, call.fused_scatter)
        assert (call.combine is None) == call.fused_scatter

    _layer_fused_against_launch("TMA_SCATTER", pair, dtype, top_k, 7 + top_k, check)


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 64, 8), (5, 16, 4), (24, 8, 2)])
def test_layer_decode_sizes(tokens, experts, top_k):
    """Decode-sized layers: skinny expert GEMMs, the up-projection gathering the token rows itself."""
    from moe import layer as layer_mod

    x, router, w_up, w_down = _layer(tokens, 256, 192, experts, top_k, dtypes.BF16, "swiglu", seed=tokens)
    layer = MoELayer(router, w_up, w_down, top_k)
    checks.poison_pool(64 << 20)
    out = layer(x)
    key = (*(layer_mod._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)), top_k,
           "swiglu")
    call = layer_mod._LAYER.get(key)
    assert call.fused_gather and call.up.config.kind == "skinny" and call.down.config.kind == "skinny"
    # fewer rows than experts: both GEMMs list the experts from the routing's counts and prefetch before their wait
    assert (call.up.early > 0 and call.down.early > 0) == (tokens * top_k < experts), (call.up.early, call.down.early)
    assert (call.ffn is not None) == (tokens * top_k < experts)  # and then one launch for both (moe_ffn_skinny)
    ref = reference_forward(x, router, w_up, w_down, top_k)
    naive = _naive(reference_forward(x, router, w_up, w_down, top_k, round_to=dtypes.BF16), dtypes.BF16)
    checks.compare(out, ref, tol=TOL["bf16"], naive=naive, name=f"decode layer T{tokens}").raise_if_failed()


@pytest.mark.parametrize("tokens,experts,top_k,early", [(1, 64, 8, True), (3, 16, 4, True), (20, 60, 2, False),
                                                        (2, 200, 6, True), (6, 200, 6, True), (4, 64, 8, False),
                                                        (1, 512, 8, False)])
def test_fused_ffn_equals_two_launches(tokens, experts, top_k, early):
    """The decode-sized FFN in one launch (down items waiting on per-expert counters), the whole layer but the
    combine in one launch (router GEMM, routing and permutation joined to it: moe_decode_skinny), and either with
    the combine in the same launch (the last CTA of each column block sums it), are bitwise the launches they
    replace, call after call (the counters left zeroed), and under a CUDA graph with fresh inputs; with the experts
    listed before the programmatic wait (early) and after it; the decode kernel's routing by warp 0 (up to 32
    slots: 4 x 8 the most) and by its counting sort (6 x 6)."""
    from cukernels import launch as engine_launch
    from moe import layer as layer_mod

    x, router, w_up, w_down = _layer(tokens, 256, 192, experts, top_k, dtypes.BF16, "swiglu", seed=tokens + 11)
    outs = {}
    layer_mod.EARLY_WEIGHTS = early
    modes = ((False, False, False), (True, False, False), (True, False, True), (True, True, False), (True, True, True))
    try:
        for fused, decode, combine in modes:
            layer_mod.FUSED_FFN, layer_mod.FUSED_DECODE, layer_mod.FUSED_COMBINE = fused, decode, combine
            layer_mod._LAYER.clear()
            layer = MoELayer(router, w_up, w_down, top_k)
            checks.poison_pool(16 << 20)  # the output a fused combine writes starts as garbage
            outs[fused, decode, combine] = [layer(x) for _ in range(3)]
            key = (*(layer_mod._launch.view(t)[0] for t in (x, layer.router_b, layer.w_gate_up, layer.w_down)),
                   top_k, "swiglu")
            call = layer_mod._LAYER.get(key)
            assert (call.ffn is not None) == fused and (call.up.early > 0) == early
            assert (call.decode is not None) == (decode and call.router.config.kind == "skinny")
            assert call.fused_combine == (fused and combine)
            if tokens < 8:
                assert call.router.config.kind == "skinny"
            if call.decode is not None:  # the layer in one launch, or two with the combine's own
                assert engine_launch.count_launches(lambda: layer(x)) == (1 if combine else 2)
        for mode in modes[1:]:
            for a, b in zip(outs[modes[0]], outs[mode]):
                assert bool((a == b).all()), mode
        x2 = dtypes.random(x.shape, dtypes.BF16, seed=99)
        eager2 = layer(x2)
        _graph_replays(layer, x, ((x, outs[modes[-1]][0]), (x2, eager2), (x, outs[modes[-1]][0])))
    finally:
        layer_mod.FUSED_FFN = layer_mod.EARLY_WEIGHTS = layer_mod.FUSED_DECODE = layer_mod.FUSED_COMBINE = True
        layer_mod._LAYER.clear()


def test_layer_is_graph_capturable():
    import cupy

    x, router, w_up, w_down = _layer(512, 128, 256, 8, 2, dtypes.BF16, "swiglu", seed=4)
    layer = MoELayer(router, w_up, w_down, 2)
    # the inputs and the layer's weights were made on the null stream, which a non-blocking stream does not
    # wait for
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        eager = layer(x)
        stream.synchronize()
        stream.begin_capture()
        out = layer(x)  # any host synchronisation inside raises during capture
        graph = stream.end_capture()
        checks.poison(out)
        graph.launch()
        stream.synchronize()
    assert bool((out == eager).all())
