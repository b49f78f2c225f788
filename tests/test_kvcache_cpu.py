"""Attention over a KV cache without a GPU: the planner fits every profile, every planned kernel compiles offline
for every profile's arch with zero spills, and the split heuristic fills the GPU in whole waves."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from attention.decode_configs import (MIN_STAGES_PER_SPLIT, DecodeConfig, DecodeProblem, plan_decode, plan_splits,
                                      search_space)
from attention.kvcache import SOURCE
from cukernels import compile, device, tiling

PROFILES = device.all_profiles()
HEAD_DIMS = (64, 128, 256)


def _problem(batch=8, seq_q=1, heads=32, kv_heads=8, head_dim=128, max_keys=32768, paged=False):
    return DecodeProblem(batch=batch, seq_q=seq_q, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         max_keys=max_keys, dtype="bf16", paged=paged)


@pytest.mark.parametrize("spec", PROFILES, ids=lambda s: s.key)
def test_plans_fit_every_profile(spec):
    for d in HEAD_DIMS:
        if spec.compute_capability < (8, 0):
            with pytest.raises(tiling.PlanError, match="sm_80"):
                plan_decode(_problem(head_dim=d), spec)
            continue
        plan = plan_decode(_problem(head_dim=d), spec)
        assert plan.smem_bytes <= spec.smem_per_block_optin
        assert 1 <= plan_splits(_problem(head_dim=d), plan.config, spec) <= 128


def _archs():
    return sorted({s.arch for s in PROFILES if s.compute_capability >= (8, 0)})


@pytest.mark.slow
@pytest.mark.parametrize("arch", _archs())
def test_planned_kernels_compile_without_spills(arch):
    specs = [s for s in PROFILES if s.arch == arch]
    configs = {plan_decode(_problem(batch=b, kv_heads=kvh, head_dim=d, paged=p, max_keys=keys), s).config
               for s in specs for d in HEAD_DIMS for p in (False, True)
               for b, kvh, keys in ((1, 8, 32768), (64, 32, 32768), (64, 32, 1024))}  # (short caches: 8 x 3)
    exprs = [c.name_expression(dtype=np.uint16, paged=p) for c in configs for p in (False, True)]
    exprs += [c.name_expression(dtype=t, paged=p, pair=True) for c in configs if c.head_dim == 128
              for p in (False, True) for t in (np.uint16, np.float16)]
    exprs += [c.name_expression(dtype=np.float16, paged=False) for c in configs]
    exprs += ["kv_append<__nv_bfloat16,true>", "kv_append<__half,false>"]
    if arch.startswith("sm_9"):  # the cluster merge (sm_90): the largest cluster contiguous, the smallest paged
        exprs += [c.name_expression(dtype=np.uint16, paged=p, cluster=n) for c in configs
                  for p, n in ((False, 8), (True, 2))]
    for expr, res in compile.compile_offline(SOURCE, exprs, arch).items():
        assert res.spills == 0 and res.stack_bytes == 0, f"{expr} on {arch}: {res}"


def test_search_space_is_valid_and_ordered():
    for d in HEAD_DIMS:
        for waves, paged in itertools.product((0.5, 1.0, 4.0), (False, True)):
            space = search_space(d, waves, paged)
            assert len(set(space)) == len(space)
            assert all(c.smem_bytes() == 2 * d * (16 + 2 * c.stages * 16 * c.warps) + 16 * 2 * c.stages * c.warps
                       for c in space)
    # the measured preferences: small grids at head dim 64 take 4 warps, large ones 8; head dim 128 deepens the
    # ring from two waves
    assert search_space(64, 0.5)[0] == DecodeConfig(head_dim=64, warps=4, stages=4)
    assert search_space(64, 1.0)[0] == DecodeConfig(head_dim=64, warps=8, stages=4)
    assert search_space(128, 1.9)[0] == DecodeConfig(head_dim=128, warps=4, stages=3)
    assert search_space(128, 2.0, keys=8192)[0] == DecodeConfig(head_dim=128, warps=4, stages=4)
    # short caches from two waves: 8 x 3 on an H100's bandwidth, 4 x 3 on an H200's (or when it is unknown)
    assert search_space(128, 2.0, keys=1024, bandwidth_gbs=3350)[0] == DecodeConfig(head_dim=128, warps=8, stages=3)
    assert search_space(128, 2.0, keys=1024, bandwidth_gbs=4800)[0] == DecodeConfig(head_dim=128, warps=4, stages=3)
    assert search_space(128, 2.0, keys=1024)[0] == DecodeConfig(head_dim=128, warps=4, stages=3)
    assert search_space(128, 1.9, keys=1024, bandwidth_gbs=3350)[0] == DecodeConfig(head_dim=128, warps=4, stages=3)
    # paged caches plan like contiguous ones under two waves, and keep rings two CTAs can share from two
    assert search_space(64, 0.5, paged=True) == search_space(64, 0.5)
    assert search_space(128, 1.9, paged=True) == search_space(128, 1.9)
    assert search_space(64, 2.0, paged=True)[0] == DecodeConfig(head_dim=64, warps=8, stages=3)
    assert search_space(128, 2.0, paged=True)[0] == DecodeConfig(head_dim=128, warps=4, stages=3)
    # paged head dim 64: 8 warps x 3 stages where a CTA streams >= 6k keys (keys x min(waves, 1)), the contiguous
    # plan on shorter streams (B1 L8k-32k: the splits make the grid)
    assert search_space(64, 0.97, paged=True, keys=8192)[0] == DecodeConfig(head_dim=64, warps=8, stages=3)
    assert search_space(64, 0.24, paged=True, keys=32768)[0] == DecodeConfig(head_dim=64, warps=8, stages=3)
    assert search_space(64, 0.12, paged=True, keys=131072)[0] == DecodeConfig(head_dim=64, warps=8, stages=3)
    assert search_space(64, 0.12, paged=True, keys=32768) == search_space(64, 0.12)
    assert search_space(64, 0.5, paged=True, keys=8192) == search_space(64, 0.5)
    assert search_space(64, 0.5, paged=True, keys=1024) == search_space(64, 0.5)
    spec = device.profile("h100_sxm")
    assert plan_decode(_problem(batch=64, kv_heads=32), spec).config.stages == 4
    assert plan_decode(_problem(batch=64, kv_heads=32, max_keys=1024), spec).config.stages == 3
    assert plan_decode(_problem(batch=64, kv_heads=32, head_dim=256), spec).config.stages == 3  # 4 does not fit
    with pytest.raises(ValueError, match="head_dim"):
        DecodeConfig(head_dim=96)


def test_head_dim_64_pairs_only_where_they_pay():
    from attention.decode_configs import paired

    spec = device.profile("h100_sxm")
    big = _problem(batch=64, heads=16, kv_heads=16, head_dim=64, seq_q=4)
    pair = paired(big, spec)
    assert pair is not None and pair.head_dim == 128 and pair.kv_heads == 8 and pair.row_tiles == 1
    assert plan_decode(pair, spec).config.head_dim == 128
    assert paired(big, spec, heads_adjacent=False) is None  # the cache's heads are not adjacent
    assert paired(_problem(batch=8, heads=16, kv_heads=16, head_dim=64), spec) is None  # under one wave
    assert paired(_problem(batch=64, heads=15, kv_heads=15, head_dim=64), spec) is None  # odd kv heads
    assert paired(_problem(batch=64, heads=32, kv_heads=8, head_dim=64, seq_q=4), spec) is None  # 32 rows
    assert paired(_problem(batch=64, heads=32, kv_heads=32, head_dim=128), spec) is None


def test_splits_fill_the_gpu_and_keep_whole_stages():
    spec = device.profile("h100_sxm")
    cfg = plan_decode(_problem(), spec).config
    # one sequence, 8 KV heads: the splits make about one CTA per SM
    s = plan_splits(_problem(batch=1, max_keys=131072), cfg, spec)
    assert 0.9 <= 8 * s / spec.sm_count <= 1.0
    # a grid that already fills the GPU is not split
    assert plan_splits(_problem(batch=64, max_keys=8192), cfg, spec) == 1
    # short caches keep at least MIN_STAGES_PER_SPLIT stages per split
    s = plan_splits(_problem(batch=1, max_keys=1024), cfg, spec)
    assert s * MIN_STAGES_PER_SPLIT * cfg.keys_per_stage <= 1024


def test_plan_call_is_the_one_planning_path():
    from attention.decode_configs import plan_call

    spec = device.profile("h100_sxm")
    dp = plan_call(_problem(batch=64, heads=16, kv_heads=16, head_dim=64, seq_q=4), spec)
    assert dp.pair and dp.problem.head_dim == 128 and dp.config.head_dim == 128 and dp.splits == 1
    assert not plan_call(_problem(batch=64, heads=16, kv_heads=16, head_dim=64), spec, heads_adjacent=False).pair
    # an override is cut so that no split is empty, in whole stages
    dp = plan_call(_problem(batch=1, max_keys=1000), spec, num_splits=128)
    assert dp.split_keys % dp.config.keys_per_stage == 0
    assert (dp.splits - 1) * dp.split_keys < 1000 <= dp.splits * dp.split_keys


def test_clusters_merge_short_splits_on_sm90_only():
    from attention.decode_configs import CLUSTER_MAX_SPLIT_KEYS, CLUSTER_SPLITS, plan_call

    h100, a100 = device.profile("h100_sxm"), device.profile("a100_80gb")
    dp = plan_call(_problem(batch=1, max_keys=1024), h100)
    assert dp.splits in CLUSTER_SPLITS and dp.cluster == dp.splits
    assert plan_call(_problem(batch=1, max_keys=1024), a100).cluster == 1  # no clusters before sm_90
    assert plan_call(_problem(batch=1, max_keys=1024), h100, num_splits=3).cluster == 1  # not a cluster size
    long = plan_call(_problem(batch=1, kv_heads=32, max_keys=32768), h100)  # 4 splits of 8k keys
    assert long.splits in CLUSTER_SPLITS and long.split_keys > CLUSTER_MAX_SPLIT_KEYS and long.cluster == 1


def test_decode_bench_reports_the_paged_plan_for_paged_rows():
    """The paged rows' plan (JSON and --plan) is the paged call's, not the contiguous one's: at head dim 64 with 8k
    keys the two differ (search_space), and --plan shows both."""
    from attention import decode_bench
    from cukernels import bench

    case = bench.Case(name="decode_b8_L8k_h16-16_d64_q1", params={"batch": 8, "seq_q": 1, "heads": 16,
                      "kv_heads": 16, "head_dim": 64, "length": 8192})
    spec = device.profile("h100_sxm")
    row, = decode_bench.plan_rows([case], spec, with_compile=False)
    assert row["config"] == "DecodeConfig(d64 w4 s4)" and row["paged config"] == "DecodeConfig(d64 w8 s3)"
    paged = [i for i in decode_bench.impls(None) if i.name.startswith("ours-paged")]
    assert paged and all(i.plan_of is not None for i in paged)


def test_short_caches_of_one_sequence_split_for_half_the_sms_on_sm90():
    from attention.decode_configs import plan_call

    h100, a100 = device.profile("h100_sxm"), device.profile("a100_80gb")
    one_seq = _problem(batch=1, kv_heads=32, max_keys=1024)  # a grid of 32: two splits (64 CTAs), not four
    assert plan_call(one_seq, h100).splits == 2
    assert plan_call(_problem(batch=1, heads=16, kv_heads=16, head_dim=64, max_keys=1024), h100).splits == 4
    assert plan_call(_problem(batch=8, max_keys=1024), h100).splits == 2  # a grid of 64: the fill rule
    assert plan_call(_problem(batch=1, kv_heads=32, max_keys=8192), h100).splits == 4  # not a short cache
    assert plan_call(one_seq, a100).splits == 3  # measured on sm_90 only: the fill rule elsewhere


@pytest.mark.slow
def test_decode_timeline_probe_compiles_without_spills():
    """The ATTN_DECODE_TIMELINE probe of flash_decode.cu (off in the engine's builds; docs/results/h100/stop64/
    decode_paged/decode_tl.py) compiles on sm_90a with no spills for a clustered paged instance, a contiguous one and
    a head-dim-64 paged one."""
    exprs = ["flash_decode_cluster<__nv_bfloat16,128,4,3,true,false,8>",
             "flash_decode_cluster<__nv_bfloat16,128,4,3,false,false,8>", "flash_decode<__nv_bfloat16,64,4,4,true,false>"]
    res = compile.compile_offline(SOURCE, exprs, "sm_90a", options=("-DATTN_DECODE_TIMELINE=64",))
    for expr, r in res.items():
        assert r.spills == 0 and r.stack_bytes == 0, (expr, r)


def test_decode_ab_parses_cases_variants_caches_and_tables(decode_ab_tool):
    """tools/decode_ab.py: suite names or free shapes, variants with the tool's ring / splits items beside module
    attributes and definitions, caches and page orders; bad forms refused with the option's name."""
    t = decode_ab_tool
    c = t.parse_case("b1_L1k_h32-8_d128_q1")
    assert c == t.parse_case("decode_b1_L1k_h32-8_d128_q1")
    assert (c["name"], c["suite"], c["batch"], c["length"], c["heads"], c["kv_heads"], c["head_dim"], c["seq_q"]) == (
        "decode_b1_L1k_h32-8_d128_q1", True, 1, 1024, 32, 8, 128, 1)
    c = t.parse_case("8:8192:16/4:256:4")
    assert (c["suite"], c["batch"], c["length"], c["heads"], c["kv_heads"], c["head_dim"], c["seq_q"]) == (
        False, 8, 8192, 16, 4, 256, 4)
    for bad in ("b1_L1k", "8:8192:16:256:4"):
        with pytest.raises(SystemExit, match="--case"):
            t.parse_case(bad)
    assert t.parse_variant("w8:ring=8/3,splits=4,attention.decode_configs.WARP_PIPE=True,-DX=1") == (
        "w8", [("ring", "", (8, 3)), ("splits", "", 4), ("attention.decode_configs", "WARP_PIPE", True),
               ("define", "-DX=1", None)])
    assert t.parse_variant("base") == ("base", [])
    for bad, msg in (("x:ring=8", "ring=WARPS/STAGES"), ("x:splits=0", "splits=N"), ("x:WARP_PIPE=1", "--variant"),
                     ("x:a.b=notaliteral", "literal")):
        with pytest.raises(SystemExit, match=msg):
            t.parse_variant(bad)
    assert t.parse_caches("contig,p16,p256") == [None, 16, 256]
    for bad in ("p20", "q16", "p512"):
        with pytest.raises(SystemExit, match="--cache"):
            t.parse_caches(bad)
    assert t.parse_tables("shuffled,inorder,sorted,window:262144") == ["shuffled", "inorder", "sorted",
                                                                        "window:262144"]
    with pytest.raises(SystemExit, match="--table"):
        t.parse_tables("random")


def test_decode_ab_page_orders(decode_ab_tool):
    """tools/decode_ab.py's block tables: every order visits each sequence's own pages once; shuffled is the bench's
    order (attention.decode_bench._paged's generator), windows shuffle within their span, sorted sorts each split."""
    t = decode_ab_tool
    batch, per = 3, 64
    orders = {name: t.page_order(name, batch, per, 32768, 16, seed=16)
              for name in ("inorder", "shuffled", "sorted", "window:262144")}
    for name, order in orders.items():
        assert order.shape == (batch, per) and order.dtype == np.int32, name
        for b in range(batch):
            assert sorted(order[b]) == list(range(b * per, (b + 1) * per)), name
    rng = np.random.default_rng(16)
    assert (orders["shuffled"] == np.stack([i * per + rng.permutation(per) for i in range(batch)])).all()
    assert (orders["inorder"] == np.arange(batch * per).reshape(batch, per)).all()
    w = orders["window:262144"] - np.arange(batch)[:, None] * per  # windows of 8 pages of 32 KB
    assert all(sorted(w[b, s:s + 8]) == list(range(s, s + 8)) for b in range(batch) for s in range(0, per, 8))
    srt = orders["sorted"]
    assert all((np.diff(srt[b, s:s + 16]) > 0).all() for b in range(batch) for s in range(0, per, 16))
    assert (np.sort(srt[:, :16], axis=1) == np.sort(orders["shuffled"][:, :16], axis=1)).all()


def test_warp_pipe_rule():
    """decode_configs.use_warp_pipe: sm_90 paged caches (and head dim 256) whose splits hold at most 1,024 keys copy
    by warp; longer splits, contiguous head dims 64 / 128 and other archs copy by CTA; WARP_PIPE forces either."""
    from attention import decode_configs as dc

    h100, a100 = device.profile("h100_sxm"), device.profile("a100_80gb")

    def planned(batch, length, heads, kv_heads, dim, paged, spec):
        p = DecodeProblem(batch=batch, seq_q=1, heads=heads, kv_heads=kv_heads, head_dim=dim, max_keys=length,
                          dtype="bf16", paged=paged)
        plan = dc.plan_call(p, spec, heads_adjacent=False)
        assert plan.config.name_expression(dtype=np.uint16, paged=paged).endswith(",true>") == plan.config.warp_pipe
        return plan.config.warp_pipe

    assert planned(1, 1024, 32, 8, 128, True, h100) and planned(8, 1024, 16, 16, 64, True, h100)
    assert planned(1, 8192, 16, 16, 256, False, h100) and planned(1, 8192, 16, 16, 64, True, h100)
    assert not planned(1, 1024, 32, 8, 128, False, h100)  # contiguous d128
    assert not planned(1, 32768, 16, 16, 64, True, h100)  # 4,096 keys a split
    assert not planned(1, 1024, 32, 8, 128, True, a100)  # not measured there
    orig = dc.WARP_PIPE
    try:
        dc.WARP_PIPE = True
        assert planned(1, 32768, 16, 16, 64, False, a100)
        dc.WARP_PIPE = False
        assert not planned(1, 1024, 32, 8, 128, True, h100)
    finally:
        dc.WARP_PIPE = orig
