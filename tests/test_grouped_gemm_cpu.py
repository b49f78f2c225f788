"""Grouped GEMM checks that need no GPU: plans fit every profile, every planned variant compiles offline for every
profile's arch without spills, sm_75 is refused clearly, input validation, the reference."""
import dataclasses

import numpy as np
import pytest

from cukernels import compile, device, dtypes, tiling
from moe import gemm_configs
from moe.grouped_gemm import SOURCE, grouped_gemm, interleave_gate_up, reference, validate

BF16 = dtypes.BF16
PROBLEMS = [
    gemm_configs.GemmProblem(rows=8192, n=11008, k=4096, experts=32, dtype="bf16"),
    gemm_configs.GemmProblem(rows=65536, n=22016, k=4096, experts=32, dtype="fp16", epilogue="swiglu"),
    gemm_configs.GemmProblem(rows=4096, n=4096, k=11008, experts=32, dtype="bf16"),
    gemm_configs.GemmProblem(rows=100, n=64, k=64, experts=8, dtype="fp16", epilogue="gelu"),
    # router logits (out_dtype=float32: any N): one "expert", N = the expert count, wgmma-sized on Hopper
    gemm_configs.GemmProblem(rows=1 << 20, n=500, k=4096, experts=1, dtype="bf16"),
    gemm_configs.GemmProblem(rows=4096, n=3, k=2048, experts=1, dtype="bf16"),
]
SUPPORTED = [s for s in device.all_profiles() if tuple(s.compute_capability) >= gemm_configs.MIN_CC]


@pytest.mark.parametrize("spec", SUPPORTED, ids=lambda s: s.key)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.rows}x{p.n}x{p.k}")
def test_plan_fits(spec, problem):
    plan = gemm_configs.plan(problem, spec)
    assert plan.smem_bytes <= spec.smem_per_block_optin
    assert plan.config.threads <= spec.max_threads_per_block
    kernel = dataclasses.replace(plan.config, split_k=1) if plan.config.kind == "tma" else plan.config
    assert kernel in gemm_configs.variants(spec)  # a tma split runs the same kernel
    assert "smem" in str(plan)


def test_hopper_gets_the_large_deep_tile():
    plan = gemm_configs.plan(PROBLEMS[0], device.profile("h200"))
    assert (plan.config.block_m, plan.config.block_n, plan.config.stages) == (128, 256, 4)


def test_small_memory_gpus_get_smaller_pipelines():
    cfg = gemm_configs.plan(PROBLEMS[0], device.profile("gb10")).config
    assert cfg.smem_bytes() <= 101376 and cfg.block_n == 128


def test_sm75_is_refused_with_a_clear_plan_error():
    with pytest.raises(tiling.PlanError, match="compute capability 8.0"):
        gemm_configs.plan(PROBLEMS[0], device.profile("t4"))


def _variants_by_arch():
    by_arch: dict[str, set] = {}
    for spec in SUPPORTED:
        by_arch.setdefault(spec.arch, set()).update(gemm_configs.variants(spec))
    return by_arch


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(_variants_by_arch()))
def test_every_planned_variant_compiles_without_spills(arch):
    configs = sorted((c for c in _variants_by_arch()[arch] if c.kind != "skinny"), key=str)  # skinny: below
    exprs = [c.name_expression(dtype=dt, epilogue=ep) for c in configs for dt in (np.float16, BF16)
             for ep in c.epilogues()]
    exprs += [c.name_expression(dtype=dt, out_dtype=np.float32) for c in configs for dt in (np.float16, BF16)
              if c.kind != "tma"]  # the tma tile writes 16-bit outputs only (the planner knows)
    exprs += [f"moe_splitk_reduce<{t}, {e}>" for t in ("__half", "__nv_bfloat16") for e in (0, 1)]
    res = compile.compile_offline(SOURCE, exprs, arch)
    for expr, r in res.items():
        assert r.spills == 0 and r.stack_bytes == 0, f"{arch} {expr}: {r}"
        assert r.registers <= 255
        assert not r.performance_warnings, f"{arch} {expr}: {r.performance_warnings}"  # e.g. serialised wgmma


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_skinny_tiles_compile_without_spills(arch):
    """Every skinny tile (the decode-sized groups' kernel), bf16, plain / SwiGLU / fp32 out; fp16 and GELU on the
    widest tiles (the most registers)."""
    exprs = []
    for c in gemm_configs.SKINNY:
        exprs += [c.name_expression(dtype=BF16, epilogue=e) for e in (None, "swiglu")]
        exprs.append(c.name_expression(dtype=BF16, out_dtype=np.float32))
        if c.block_n // c.warps_n == 32 and c.block_m == 16:
            exprs.append(c.name_expression(dtype=np.float16, epilogue="gelu"))
    for expr, r in compile.compile_offline(SOURCE, exprs, arch).items():
        assert r.spills == 0 and r.stack_bytes == 0, f"{arch} {expr}: {r}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fused_ffn_compiles_without_spills(arch):
    """The decode-sized FFN in one launch (moe_ffn_skinny), and with the router GEMM and routing joined to it
    (moe_decode_skinny), for the skinny tiles the planner gives the decode suite's layers (E64 top-8 2048 / 1408
    and seed 004's 4096 / 11008 at T1 and T4), bf16 and fp16."""
    from moe.grouped_gemm import decode_name_expression, ffn_name_expression

    G = gemm_configs.GemmProblem
    exprs = set()
    for spec in (device.profile("h100"), device.profile("a100_80gb")):
        for experts, top_k, hidden, inter in ((64, 8, 2048, 1408), (32, 2, 4096, 11008)):
            for tokens in (1, 4):
                rows = tokens * top_k
                up = gemm_configs.plan(G(rows=rows, n=2 * inter, k=hidden, experts=experts, dtype="bf16",
                                         epilogue="swiglu"), spec).config
                down = gemm_configs.plan(G(rows=rows, n=hidden, k=inter, experts=experts, dtype="bf16"), spec).config
                router = gemm_configs.plan(G(rows=tokens, n=experts, k=hidden, experts=1, dtype="bf16",
                                             out_dtype="fp32"), spec).config
                for dt in (BF16, np.float16):
                    exprs.add(ffn_name_expression(up, down, dt))
                    exprs.add(decode_name_expression(router, up, down, dt, experts))
    for expr, r in compile.compile_offline(SOURCE, sorted(exprs), arch).items():
        assert r.spills == 0 and r.stack_bytes == 0 and not r.performance_warnings, f"{arch} {expr}: {r}"
    with pytest.raises(ValueError, match="same block_m"):
        ffn_name_expression(gemm_configs.SKINNY[0], gemm_configs.SKINNY[-1], BF16)


def test_fused_ffn_only_where_fewer_rows_than_experts():
    """The decode suite's layers on the H100 profile: the two expert GEMMs run as one launch at T1 and T4 (fewer rows
    than experts), with the router GEMM and routing joined to them, as two from T16 with 64 experts (every expert
    touched: measured slower fused)."""
    from moe.grouped_gemm import SkinnyDecode, SkinnyFFN

    G, spec = gemm_configs.GemmProblem, device.profile("h100")
    for experts, top_k, hidden, inter, fused_up_to in ((64, 8, 2048, 1408, 4), (32, 2, 4096, 11008, 4)):
        for tokens in (1, 4, 16, 64):
            up_problem = G(rows=tokens * top_k, n=2 * inter, k=hidden, experts=experts, dtype="bf16", epilogue="swiglu")
            up = gemm_configs.plan(up_problem, spec).config
            down = gemm_configs.plan(G(rows=tokens * top_k, n=hidden, k=inter, experts=experts, dtype="bf16"),
                                     spec).config
            want = tokens <= fused_up_to
            assert SkinnyFFN.planned(up, down, up_problem) == want, (experts, tokens, up, down)
            router = gemm_configs.plan(G(rows=tokens, n=experts, k=hidden, experts=1, dtype="bf16", out_dtype="fp32"),
                                       spec).config
            assert SkinnyDecode.planned(router, want) == want, (experts, tokens, router)  # and the router with them


def test_fused_combine_bounds():
    """The fused kernels run the layer's combine where the down-projection's column blocks fit their counters
    (SkinnyFFN.MAX_COMBINE_BLOCKS, the kernel's SKINNY_MAX_COLS) and top_k the kernel's bound of 8; the counters
    fit the zeroed buffer the layer hands them (SYNC_BYTES)."""
    from types import SimpleNamespace

    from moe.grouped_gemm import SkinnyFFN

    def down(n, block_n):
        return SimpleNamespace(problem=SimpleNamespace(n=n), config=SimpleNamespace(block_n=block_n))

    limit = SkinnyFFN.MAX_COMBINE_BLOCKS
    assert SkinnyFFN.combines(down(2048, 16), 8) and SkinnyFFN.combines(down(16 * limit, 16), 1)
    assert not SkinnyFFN.combines(down(16 * limit + 8, 16), 2)  # one block more than there are counters
    assert not SkinnyFFN.combines(down(2048, 16), 9)
    source = SOURCE.read_text()
    assert f"SKINNY_MAX_COLS = {limit}" in source and "SKINNY_COLS = 2 * SKINNY_MAX_GROUPS + 16" in source
    assert SkinnyFFN.SYNC_BYTES == 4 * (2 * 512 + 16 + limit)


def test_decode_sized_groups_take_skinny_tiles():
    spec = device.profile("h100")
    G = gemm_configs.GemmProblem
    for rows, experts in ((1, 1), (8, 64), (512, 64), (2, 32), (128, 32)):
        plan = gemm_configs.plan(G(rows=rows, n=2816, k=2048, experts=experts, dtype="bf16", epilogue="swiglu"), spec)
        assert plan.config.kind == "skinny" and plan.config in gemm_configs.SKINNY, (rows, experts, plan)
        assert plan.config.grid(G(rows=rows, n=2816, k=2048, experts=experts, dtype="bf16")) >= 1
    for rows, experts in ((2048, 64), (512, 32), (4096, 1)):  # 16+ rows per group: the 128-row tiles
        assert gemm_configs.plan(G(rows=rows, n=2816, k=2048, experts=experts, dtype="bf16"), spec).config.kind \
            != "skinny"
    with pytest.raises(ValueError, match="skinny tile"):
        gemm_configs.GemmConfig(kind="skinny", block_m=24, block_n=256, block_k=32, warps_m=1, warps_n=8, stages=4)
    with pytest.raises(ValueError, match="split_k"):
        gemm_configs.GemmConfig(block_m=128, block_n=128, block_k=64, warps_m=2, warps_n=4, stages=3, split_k=2)


def test_skinny_items_stream_at_most_the_item_bound(monkeypatch):
    """seed 004's decode GEMMs (K 4,096 up, 11,008 down) get items of at most SKINNY_MAX_ITEM_BYTES where the widest
    tile would stream 2-5.5 MB per item; a K too long for any tile drops the bound instead of failing."""
    spec = device.profile("h100")
    G = gemm_configs.GemmProblem
    cap = gemm_configs.SKINNY_MAX_ITEM_BYTES
    assert cap == 3 << 19
    for tokens in (4, 16, 64):
        up = gemm_configs.plan(G(rows=2 * tokens, n=22016, k=4096, experts=32, dtype="bf16", epilogue="swiglu"),
                               spec).config
        down = gemm_configs.plan(G(rows=2 * tokens, n=4096, k=11008, experts=32, dtype="bf16"), spec).config
        assert up.kind == down.kind == "skinny"
        assert up.block_n * 4096 * 2 <= cap and down.block_n * 11008 * 2 <= cap, (tokens, up, down)
    assert (up.block_n, up.split_k, down.block_n, down.split_k) == (128, 1, 64, 2)
    monkeypatch.setattr(gemm_configs, "SKINNY_UNSPLIT_ITEMS_PER_SM", 0)  # the bound alone
    e64 = gemm_configs.plan(G(rows=128, n=2816, k=2048, experts=64, dtype="bf16", epilogue="swiglu"), spec).config
    assert (e64.block_n, e64.split_k) == (256, 1)  # 1 MiB items: within the bound, the widest tile
    huge = gemm_configs.plan(G(rows=8, n=256, k=200_000, experts=4, dtype="bf16"), spec).config
    assert huge.kind == "skinny" and huge.block_n * 200_000 * 2 > cap


def test_skinny_tiles_without_a_k_split_take_finer_items_first():
    """E64 top-8's T16 / T64 up-projections (64 experts, K 2,048) take 128-row items (~4 per CTA) instead of 256-row
    ones; where no unsplit tile reaches SKINNY_UNSPLIT_ITEMS_PER_SM per SM (E64 T4, T1) the plan is the split
    rule's, as before."""
    spec = device.profile("h100")
    G = gemm_configs.GemmProblem
    assert gemm_configs.SKINNY_UNSPLIT_ITEMS_PER_SM == 8
    tiles = {}
    for tokens in (1, 4, 16, 64):
        up = gemm_configs.plan(G(rows=8 * tokens, n=2816, k=2048, experts=64, dtype="bf16", epilogue="swiglu"),
                               spec).config
        tiles[tokens] = (up.block_m, up.block_n, up.split_k)
    assert tiles == {1: (8, 32, 4), 4: (8, 128, 1), 16: (8, 128, 1), 64: (16, 128, 1)}


@pytest.mark.slow
def test_tma_pair_compiles_without_spills():
    """The clustered tile (planned on long groups, gemm_configs.as_pair) builds clean."""
    cfg = gemm_configs.TMA_PAIR[0]
    exprs = [cfg.name_expression(dtype=dt, epilogue=ep) for dt in (np.float16, BF16) for ep in cfg.epilogues()]
    for expr, r in compile.compile_offline(SOURCE, exprs, "sm_90a").items():
        assert r.spills == 0 and r.stack_bytes == 0 and not r.performance_warnings, f"{expr}: {r}"


def test_min_blocks_register_cap_holds():
    cfg = gemm_configs.MEDIUM[0]
    res = compile.compile_offline(SOURCE, [cfg.name_expression(dtype=BF16, epilogue="swiglu")], "sm_90a")
    (r,) = res.values()
    assert r.registers * cfg.threads * cfg.min_blocks <= 65536


def test_config_validation():
    with pytest.raises(ValueError, match="block_k"):
        gemm_configs.GemmConfig(block_m=128, block_n=128, block_k=16, warps_m=2, warps_n=4, stages=3)
    with pytest.raises(ValueError, match="multiples of 16"):
        gemm_configs.GemmConfig(block_m=128, block_n=40, block_k=64, warps_m=2, warps_n=4, stages=3)
    with pytest.raises(ValueError, match="epilogue"):
        gemm_configs.LARGE[0].name_expression(dtype=BF16, epilogue="relu")


def test_tma_config():
    pair, cfg = gemm_configs.TMA_PAIR[0], gemm_configs.TMA[0]
    assert cfg.threads == 384 and cfg.persistent and cfg.needs_arch == "sm_90a" and cfg.cluster_m == 1
    assert cfg.smem_bytes() == 4 * 48 * 1024 + 32 * 1024 + 64 + 1024 <= 232448
    assert cfg.name_expression(dtype=BF16, epilogue="swiglu") == "moe_grouped_gemm_tma<__nv_bfloat16, 4, 1, 256>"
    assert pair.cluster_m == 2 and pair.name_expression(dtype=BF16) == "moe_grouped_gemm_tma_pair<__nv_bfloat16, 4, 0>"
    with pytest.raises(ValueError, match="cluster_m"):
        dataclasses.replace(gemm_configs.WGMMA[0], cluster_m=2)
    assert cfg.epilogues() == (None, "swiglu", "rope64", "rope128", "rope256")  # 128 x 256: whole heads of 64-256
    with pytest.raises(ValueError, match="input dtype"):
        cfg.name_expression(dtype=BF16, out_dtype=np.float32)
    with pytest.raises(ValueError, match="tma tile"):
        gemm_configs.GemmConfig(kind="tma", block_m=64, block_n=256, block_k=64, warps_m=4, warps_n=1, stages=4)
    narrow = gemm_configs.TMA_128[0]
    assert narrow.stages == 6 and narrow.smem_bytes() == 6 * 32 * 1024 + 32 * 1024 + 96 + 1024 <= 232448
    assert narrow.name_expression(dtype=BF16) == "moe_grouped_gemm_tma<__nv_bfloat16, 6, 0, 128>"
    with pytest.raises(ValueError, match="tma tile"):  # 5 stages of 48 KiB do not fit
        dataclasses.replace(cfg, stages=5)
    with pytest.raises(ValueError, match="without split K"):
        dataclasses.replace(pair, split_k=2)
    with pytest.raises(ValueError, match="split_k must be"):
        dataclasses.replace(cfg, split_k=9)
    p = gemm_configs.GemmProblem(rows=1000, n=512, k=64, experts=8, dtype="bf16")
    with pytest.raises(ValueError, match="SM count"):
        cfg.grid(p)
    assert cfg.grid(p, 132) == min(132, gemm_configs.LARGE[0].grid(p)) and cfg.grid(p, 4) == 4
    split = dataclasses.replace(cfg, split_k=3)  # each split of a tile is a work item
    assert split.grid(p, 1000) == 3 * gemm_configs.LARGE[0].grid(p) and "split K 3" in str(split)
    # pairs of m-tiles: (1000 // 256 + 8) x 2 work items, 2 CTAs each, at most the co-resident clusters
    assert pair.grid(p, 132) == 2 * 22 and pair.grid(p, 132, clusters=10) == 20


def test_cluster_k_config():
    """A split across a cluster: 128 x 128 tiles of at most 5 stages (its fp32 sums take 64 KiB), 2-4 CTAs, never
    with split_k or cluster_m; one work item per tile (the cluster's CTAs share it), clusters of CK CTAs."""
    ck = dataclasses.replace(gemm_configs.TMA_128_KSPLIT, cluster_k=3)
    assert ck.smem_bytes() == 5 * 32 * 1024 + 64 * 1024 + 80 + 32 + 1024 <= 232448
    assert ck.name_expression(dtype=BF16, epilogue="swiglu") == "moe_grouped_gemm_tma_ksplit<__nv_bfloat16, 5, 1, 3>"
    assert ck.cluster_size == 3 and "clusters of 3 along K" in str(ck)
    p = gemm_configs.GemmProblem(rows=128, n=4096, k=4096, experts=1, dtype="bf16")
    assert ck.grid(p, 132) == 3 * 44 and ck.grid(p, 132, clusters=39) == 3 * 39
    for bad, match in ((dict(cluster_k=5), "cluster_k must be"), (dict(cluster_k=2, stages=6), "at most 5 stages"),
                       (dict(cluster_k=2, split_k=2), "without split_k"), (dict(cluster_k=2, block_n=256, stages=4),
                                                                           "128 x 128 tiles")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(gemm_configs.TMA_128_KSPLIT, **bad)
    with pytest.raises(ValueError, match="cluster_k is for tma tiles"):
        dataclasses.replace(gemm_configs.LARGE[0], cluster_k=2)


def test_planner_tma_choice(monkeypatch):
    from cukernels import device, tma

    h100 = device.profile("h100_sxm")
    big = gemm_configs.GemmProblem(rows=8192, n=11008, k=4096, experts=8, dtype="bf16")
    monkeypatch.setattr(tma, "available", lambda: None)
    assert gemm_configs.plan(big, h100).config.kind == "tma"
    fp32 = gemm_configs.plan(dataclasses.replace(big, out_dtype="fp32"), h100)
    assert fp32.config.kind == "wgmma" and "fp32 output" in fp32.reason
    assert gemm_configs.plan(dataclasses.replace(big, epilogue="gelu"), h100).config.kind == "mma"
    assert gemm_configs.plan(big, device.profile("a100_80gb")).config.kind == "mma"
    monkeypatch.setattr(tma, "available", lambda: "no cuda-bindings here")
    plan = gemm_configs.plan(big, h100)
    assert plan.config.kind == "wgmma" and "no cuda-bindings here" in plan.reason
    assert all(c.kind != "tma" for c in gemm_configs.candidates(big, h100))


def test_narrow_tma_tiles():
    """64-row tma tiles: one consumer warpgroup (256 threads), 64 or 128 columns, up to 8 stages, alone or split
    along K across a cluster; their kernel names carry the tile (the 128-row names are unchanged)."""
    t64, t128 = gemm_configs.TMA_64[1], gemm_configs.TMA_64[0]
    assert (t64.block_m, t64.block_n, t64.threads) == (64, 64, 256) and t128.block_n == 128
    assert t64.name_expression(dtype=BF16) == "moe_grouped_gemm_tma<__nv_bfloat16, 8, 0, 64, 64>"
    ck = dataclasses.replace(t128, cluster_k=2)
    assert ck.name_expression(dtype=BF16) == "moe_grouped_gemm_tma_ksplit<__nv_bfloat16, 8, 0, 2, 128, 64>"
    assert ck.smem_bytes() == 8 * 24 * 1024 + 32 * 1024 + 128 + 32 + 1024 <= 232448
    p = gemm_configs.GemmProblem(rows=128, n=768, k=768, experts=1, dtype="bf16")
    assert t64.work_items(p, exact_one_group=True) == 24 and t64.one_wave(p, t64.grid(p, 132))
    for bad in (dict(block_n=256, stages=4), dict(stages=9), dict(warps_m=8)):
        with pytest.raises(ValueError, match="a tma tile is"):
            dataclasses.replace(t64, **bad)


def test_planner_takes_narrow_tiles_for_one_wave_projections(monkeypatch):
    """One group of 128 rows: the narrowest 64-row tile whose items fit one wave (measured faster than the
    128 x 128 tiles and their splits, docs/perf/grouped_gemm.md v8); not for grouped problems, long K or more
    items than SMs."""
    from cukernels import tma

    monkeypatch.setattr(tma, "available", lambda: None)
    h100 = device.profile("h100_sxm")

    def planned(rows, n, k, experts=1):
        return gemm_configs.plan(gemm_configs.GemmProblem(rows=rows, n=n, k=k, experts=experts, dtype="bf16"),
                                 h100).config

    assert planned(128, 768, 768) == gemm_configs.TMA_64[1]  # 24 items of 64 x 64
    assert planned(128, 4096, 768) == gemm_configs.TMA_64[1]  # 128 items: still one wave
    assert planned(128, 6144, 2048) == gemm_configs.TMA_64[0]  # 192 of 64 x 64 > 132: 96 of 64 x 128
    assert planned(128, 11264, 2048).block_m == 128  # 176 of 64 x 128: more than one wave
    assert planned(128, 4096, 11008).block_m == 128  # 172 k tiles: the 128 x 128 split across clusters
    assert planned(256, 768, 768, experts=4).block_m == 128  # grouped: not measured, not taken


def test_rotary_epilogue_validation_and_plan(monkeypatch):
    """rotary=(cos, sin, cols): float32 [seq, hd / 2] tables, hd 64/128/256, cols a multiple of hd, offsets=None
    and no other epilogue; planned on tma tiles holding whole heads, never split; refused off sm_90a."""
    from cukernels import tma

    a, b = np.zeros((200, 64), np.float16), np.zeros((1, 384, 64), np.float16)
    cos = np.zeros((64, 32), np.float32)
    assert validate(a, b, None, rotary=(cos, cos, 256)).epilogue == "rope64"
    for rot, kw, match in (((cos, cos, 100), {}, "multiple of the head dim 64"),
                           ((cos, cos, 448), {}, "at most N = 384"),
                           ((cos, cos[:, :16].copy(), 64), {}, "one shape"),
                           ((cos.astype(np.float64), cos, 64), {}, "rotary cos must be a C-contiguous float32"),
                           ((cos[:, :24].copy(), cos[:, :24].copy(), 48), {}, "head dim 2 \\* cos.shape\\[1\\] = 48"),
                           ((cos, cos), {}, "a tuple of 2"),
                           ((cos, cos, 64), dict(epilogue="swiglu"), "epilogue must be None"),
                           ((cos, cos, 64), dict(offsets=np.zeros(2, np.int32)), "offsets=None")):
        with pytest.raises(ValueError, match=match):
            validate(a, b, kw.pop("offsets", None), rotary=rot, **kw)
    with pytest.raises(ValueError, match="epilogue must be one of"):
        validate(a, b, None, epilogue="rope64")  # only through rotary=
    monkeypatch.setattr(tma, "available", lambda: None)
    h100 = device.profile("h100_sxm")

    def planned(n, k, hd, rows=128):
        p = gemm_configs.GemmProblem(rows=rows, n=n, k=k, experts=1, dtype="bf16", epilogue=gemm_configs.ROPE[hd])
        return gemm_configs.plan(p, h100).config

    assert planned(2304, 768, 64) == gemm_configs.TMA_64[1]
    assert planned(2304, 768, 128) == gemm_configs.TMA_64[0]  # 64 columns cannot hold a head of 128
    assert planned(2304, 768, 256).block_n == 256
    big = planned(4096, 11008, 128)  # the plain plan splits K across clusters; rotary takes a whole tile
    assert big.split_k == 1 and big.cluster_k == 1 and big.block_n % 128 == 0
    assert "rope64" in gemm_configs.TMA_64[1].epilogues() and "rope128" not in gemm_configs.TMA_64[1].epilogues()
    assert "rope64" not in dataclasses.replace(gemm_configs.TMA_128[0], split_k=2).epilogues()
    assert "rope64" not in gemm_configs.MEDIUM[0].epilogues()
    with pytest.raises(ValueError, match="has no rope64 epilogue"):
        gemm_configs.MEDIUM[0].name_expression(dtype=BF16, epilogue="rope64")
    with pytest.raises(tiling.PlanError, match="sm_90a tma tiles only"):
        gemm_configs.plan(gemm_configs.GemmProblem(rows=128, n=768, k=768, experts=1, dtype="bf16",
                                                   epilogue="rope64"), device.profile("a100_80gb"))


def test_planner_sizes_tma_tiles_to_the_machine(monkeypatch):
    """Weight-bound one-group GEMMs (128 tokens) take 128-column tiles and split K until the work items fill the
    SMs; compute-bound ones keep 128 x 256 without a split (its partial sums would cost more than the tail)."""
    from cukernels import tma

    monkeypatch.setattr(tma, "available", lambda: None)
    h100 = device.profile("h100_sxm")
    down = gemm_configs.GemmProblem(rows=128, n=4096, k=11008, experts=1, dtype="bf16")
    cfg = gemm_configs.plan(down, h100).config  # the split runs across clusters of 3: 32 of them fit at once
    assert cfg.kind == "tma" and cfg.block_n == 128 and cfg.split_k == 1 and cfg.cluster_k == 3
    assert 32 <= gemm_configs.cluster_capacity(h100, 3) < 44  # GPCs: fewer than SMs / 3
    ranked = gemm_configs.tma_ranked(down, h100)
    assert ranked[1][0].split_k == 3 and ranked[1][0].cluster_k == 1  # what the cost model chose, as a split
    # clusters of 4 would need 32 of them at once: 30 fit, so a split of 4 stays a split through global memory
    wide = dataclasses.replace(gemm_configs.TMA_128[0], split_k=4)
    assert gemm_configs.as_cluster_split(down, wide, h100) is None
    assert gemm_configs.as_cluster_split(dataclasses.replace(down, n=2048), wide, h100).cluster_k == 4
    assert gemm_configs.as_cluster_split(down, gemm_configs.TMA_128[0], h100) is None  # no split: unchanged
    big = gemm_configs.GemmProblem(rows=16384, n=12288, k=4096, experts=1, dtype="bf16")
    cfg = gemm_configs.plan(big, h100).config
    assert (cfg.kind, cfg.block_n, cfg.split_k) == ("tma", 256, 1)
    ranked = gemm_configs.tma_ranked(down, h100)[1:]
    assert [e for _, e in ranked] == sorted(e for _, e in ranked)
    assert all(-(-11008 // 64) // c.split_k >= gemm_configs.TMA_MIN_K_TILES for c, _ in ranked)


def test_grid_bounds_every_split():
    cfg = gemm_configs.LARGE[0]
    p = gemm_configs.GemmProblem(rows=1000, n=512, k=64, experts=8, dtype="bf16")
    rng = np.random.default_rng(0)
    for _ in range(100):
        cuts = np.sort(rng.integers(0, 1001, size=7))
        counts = np.diff(np.concatenate([[0], cuts, [1000]]))
        tiles = sum(-(-int(c) // cfg.block_m) for c in counts) * 2
        assert tiles <= cfg.grid(p)


# ---------------------------------------------------------------- validation (no GPU touched)
# ``validate`` reads the arrays' attributes alone, so host arrays exercise every check; grouped_gemm itself
# refuses host arrays first.


def _args(rows=64, n=32, k=16, experts=4, dtype=np.float16):
    return (np.zeros((rows, k), dtype), np.zeros((experts, n, k), dtype), np.zeros(experts + 1, np.int32))


@pytest.mark.parametrize("change,exc,match", [
    (lambda a, b, o: (a[:, :8], b, o), ValueError, "must match"),
    (lambda a, b, o: (a[0], b, o), ValueError, "a must be 2-D"),
    (lambda a, b, o: (a, b[0], o), ValueError, "b must be 3-D"),
    (lambda a, b, o: (a.astype(np.float32), b, o), TypeError, "a must be float16 or bfloat16"),
    (lambda a, b, o: (a, b.view(np.uint16), o), TypeError, "b must have a's dtype"),
    (lambda a, b, o: (a, b, o[:-1]), ValueError, "offsets must be 1-D"),
    (lambda a, b, o: (a, b, o.astype(np.int64)), TypeError, "offsets must be int32"),
    (lambda a, b, o: (a, b, None), ValueError, "offsets=None .* needs b with one expert"),
    (lambda a, b, o: (a[:, :12].copy(), b[:, :, :12].copy(), o), ValueError, "multiple of 8"),
    (lambda a, b, o: (a, b[:, :12].copy(), o), ValueError, "N = 12"),
    (lambda a, b, o: (np.asfortranarray(a), b, o), ValueError, "C-contiguous"),
])
def test_validation_errors(change, exc, match):
    a, b, o = change(*_args())
    with pytest.raises(exc, match=match):
        validate(a, b, o)


def test_swiglu_needs_n_multiple_of_16():
    a, b, o = _args(n=24)
    validate(a, b, o)
    with pytest.raises(ValueError, match="multiple of 16 for fp16 outputs, written in 16-byte stores; SwiGLU"):
        validate(a, b, o, epilogue="swiglu")


@pytest.mark.parametrize("n", [1, 3, 4, 60, 100, 500])
def test_fp32_output_takes_any_n_and_16_bit_outputs_keep_multiples_of_8(n):
    a, b, o = _args(n=n)
    assert validate(a, b, o, out_dtype=np.float32).n == n
    for out_dtype in (None, np.float16):
        with pytest.raises(ValueError, match=rf"N = {n} \(b.shape\[1\]\): must be a positive multiple of 8 for "
                                             r"fp16 outputs, written in 16-byte stores; out_dtype=float32 accepts any"):
            validate(a, b, o, out_dtype=out_dtype)
    a, b, o = _args(n=n, dtype=BF16)
    with pytest.raises(ValueError, match="multiple of 8 for bf16 outputs"):
        validate(a, b, o)
    with pytest.raises(ValueError, match="multiple of 8 for bf16 outputs, written in 16-byte stores$"):
        validate(a, b, o, epilogue="gelu")


def test_fp32_output_needs_at_least_one_column():
    a, b, o = _args(n=0)
    with pytest.raises(ValueError, match=r"N = 0 \(b.shape\[1\]\): must be at least 1"):
        validate(a, b, o, out_dtype=np.float32)


def test_row_scale_and_epilogue_validation():
    a, b, o = _args()
    with pytest.raises(ValueError, match="row_scale must be 1-D"):
        validate(a, b, o, row_scale=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="row_scale must be float32"):
        validate(a, b, o, row_scale=np.ones(64, np.float16))
    with pytest.raises(ValueError, match="epilogue"):
        validate(a, b, o, epilogue="silu")


def test_out_dtype_validation():
    a, b, o = _args()
    validate(a, b, o, out_dtype=np.float32)
    with pytest.raises(TypeError, match="out_dtype"):
        validate(a, b, o, out_dtype=np.float64)
    with pytest.raises(ValueError, match="plain GEMM"):
        validate(a, b, o, epilogue="gelu", out_dtype=np.float32)


def test_host_arrays_are_refused():
    with pytest.raises(TypeError, match="a must be a cupy.ndarray or a torch CUDA tensor"):
        grouped_gemm(*_args())


# ---------------------------------------------------------------- reference


def test_reference_matches_a_dense_matmul_per_group():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((50, 16)).astype(np.float16)
    b = rng.standard_normal((3, 32, 16)).astype(np.float16)
    off = np.array([0, 20, 20, 50], np.int32)
    ref = reference(a, b, off)
    np.testing.assert_allclose(ref[20:], a[20:].astype(np.float64) @ b[2].T.astype(np.float64))
    scale = rng.random(50).astype(np.float32)
    np.testing.assert_allclose(reference(a, b, off, row_scale=scale), ref * scale[:, None].astype(np.float64))


def test_interleave_and_swiglu_reference():
    rng = np.random.default_rng(2)
    g, u = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    w = interleave_gate_up(g, u)
    assert w.shape == (2, 8, 8) and np.array_equal(w[:, 0::2], g) and np.array_equal(w[:, 1::2], u)
    a = rng.standard_normal((6, 8))
    off = np.array([0, 6, 6], np.int32)
    got = reference(a, w, off, epilogue="swiglu")
    gate = a @ g[0].T
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * (a @ u[0].T))


def test_one_wave_gemms_take_programmatic_launches():
    """PDL only where every work item has its own CTA: the 128-token projections, not a persistent loop."""
    def prob(rows, n, experts=1):
        return gemm_configs.GemmProblem(rows=rows, n=n, k=4096, experts=experts, dtype=dtypes.BF16)

    tma, tma128 = gemm_configs.TMA[0], gemm_configs.TMA_128_KSPLIT
    assert tma.one_wave(prob(128, 22016), 132)  # 86 tiles of 128 x 256
    assert not tma.one_wave(prob(2048, 6144), 132)  # 16 x 24 tiles over 132 CTAs
    ck3 = dataclasses.replace(tma128, cluster_k=3)
    assert ck3.one_wave(prob(128, 4096), 96)  # 32 tiles, 32 clusters of 3
    assert not tma.one_wave(prob(128, 22016, experts=8), 132)  # the bound counts a partial tile per group
    assert not gemm_configs.LARGE[0].one_wave(prob(128, 512), 132)  # not a tma kernel: no pdl.cuh wait in it


def test_pair_ranked_first_on_long_groups_only():
    """tma_ranked puts the B-multicast pair first where the unsplit 128 x 256 tile leads, with two waves of pairs,
    on one group or groups of PAIR_MIN_GROUP_ROWS rows on average (the host cannot see the group sizes); never with
    a rotary epilogue."""
    spec = device.profile("h100")
    pair = gemm_configs.TMA_PAIR[0]

    def first(rows, experts, epilogue=None, n=11008):
        p = gemm_configs.GemmProblem(rows=rows, n=n, k=4096, experts=experts, dtype=dtypes.BF16, epilogue=epilogue)
        return gemm_configs.tma_ranked(p, spec)[0][0]

    assert first(8192, 1) == pair and first(8192, 8) == pair and first(65536, 32, "swiglu", 22016) == pair
    assert first(8192, 32) == gemm_configs.TMA[0]  # 256 rows per group on average
    assert first(8192, 1, "rope128", 4096).cluster_m == 1  # the pair has no rotary epilogue
    assert first(128, 1, n=4096).cluster_m == 1
    assert first(1024, 1, n=4096).cluster_m == 1 and first(2048, 1, n=8192) == pair  # 64 pairs: one wave; 128
    assert pair in gemm_configs.variants(spec)


@pytest.mark.slow
def test_tma_gather_kernels_named_and_built_clean():
    """The fused-gather tma kernels (the layer's up-projection reading token rows through the sorted slots): named
    for the 128 x 256 tile alone and in pairs, refused for tiles and epilogues without it; 0 spills (sm_90a)."""
    tile, pair = gemm_configs.TMA[0], gemm_configs.TMA_PAIR[0]
    assert tile.gathers and pair.gathers and gemm_configs.SKINNY[0].gathers
    assert not gemm_configs.TMA_128[0].gathers and not dataclasses.replace(tile, split_k=2).gathers
    assert (tile.name_expression(dtype=BF16, epilogue="swiglu", gather=True)
            == "moe_grouped_gemm_tma_gather<__nv_bfloat16, 4, 1>")
    assert pair.name_expression(dtype=BF16, gather=True) == "moe_grouped_gemm_tma_pair_gather<__nv_bfloat16, 4, 0>"
    with pytest.raises(ValueError, match="no fused gather"):
        gemm_configs.TMA_128[0].name_expression(dtype=BF16, gather=True)
    exprs = [c.name_expression(dtype=dt, epilogue=ep, gather=True) for c in (tile, pair) for dt in (np.float16, BF16)
             for ep in (None, "swiglu")]
    for expr, r in compile.compile_offline(SOURCE, exprs, "sm_90a").items():
        assert r.spills == 0 and r.stack_bytes == 0 and not r.performance_warnings, f"{expr}: {r}"
