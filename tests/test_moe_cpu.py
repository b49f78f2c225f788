"""MoE on the CPU: the NumPy references on small hand-checked inputs (ties, skew, NaN), the planners on every
profile, ``python -m moe.bench --plan`` for every profile, and every kernel variant the planners can choose
compiled offline for every profile's architecture with no spills."""
import contextlib
import io
import itertools

import numpy as np
import pytest

from cukernels import compile, device, dtypes, tiling
from moe import bench, configs, launch, reference, routing, suites

# ---------------------------------------------------------------- references


def test_route_reference_ties_go_to_the_lower_expert():
    logits = np.array([[0.0, 1.0, 1.0, 0.5, 1.0],
                       [2.0, 2.0, 2.0, 2.0, 2.0],
                       [-0.0, 0.0, -1.0, 0.0, -0.0]], dtype=np.float32)
    ref = reference.route(logits, 3)
    assert ref.experts.tolist() == [[1, 2, 4], [0, 1, 2], [0, 1, 3]]  # -0.0 ties with 0.0
    np.testing.assert_allclose(ref.weights[0], [1 / 3] * 3)
    np.testing.assert_allclose(ref.weights.sum(axis=1), 1.0)
    assert ref.counts.tolist() == [2, 3, 2, 1, 1]


def test_route_reference_nan_ranks_below_minus_inf():
    logits = np.array([[np.nan, -np.inf, 0.0, np.nan]], dtype=np.float32)
    assert reference.route(logits, 3).experts.tolist() == [[2, 1, 0]]


def test_route_reference_uniform_logits_give_balanced_losses():
    tokens, experts, k = 64, 8, 2
    ref = reference.route(np.zeros((tokens, experts), np.float32), k)
    assert ref.counts.tolist() == [tokens] * k + [0] * (experts - k)  # every token ties: experts 0 and 1
    np.testing.assert_allclose(ref.mean_prob, 1 / experts)
    assert ref.aux_loss == pytest.approx(1.0)  # experts * sum(f_i / experts) = sum f_i
    assert ref.z_loss == pytest.approx(np.log(experts) ** 2)
    np.testing.assert_allclose(ref.share, ref.counts / (tokens * k))
    assert ref.usage_cv == pytest.approx(np.std(ref.counts) / np.mean(ref.counts))


def test_route_reference_skew_sends_every_token_to_one_expert():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((100, 16)).astype(np.float32)
    logits[:, 5] += 50.0
    ref = reference.route(logits, 1)
    assert (ref.experts == 5).all() and ref.counts[5] == 100 and ref.counts.sum() == 100
    np.testing.assert_allclose(ref.weights, 1.0)
    assert ref.aux_loss == pytest.approx(16 * ref.mean_prob[5])
    assert ref.usage_cv == pytest.approx(np.sqrt(15.0))  # one expert holds everything: std/mean = sqrt(E - 1)


def test_route_reference_sigmoid_and_softmax_weights():
    x = np.array([[1.0, -2.0, 3.0, 0.5]], dtype=np.float32)
    sig = 1 / (1 + np.exp(-x.astype(np.float64)))
    r = reference.route(x, 2, scoring="sigmoid", renormalize=False)
    assert r.experts.tolist() == [[2, 0]]
    np.testing.assert_allclose(r.weights, sig[:, [2, 0]])
    np.testing.assert_allclose(r.mean_prob, (sig / sig.sum())[0])
    r = reference.route(x, 2, scoring="sigmoid")
    np.testing.assert_allclose(r.weights, sig[:, [2, 0]] / sig[:, [2, 0]].sum())
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(reference.route(x, 2, renormalize=False).weights, p[:, [2, 0]])


def test_route_reference_reads_bf16_and_fp16_bits():
    x = np.array([[0.5, 3.0, -1.0]], dtype=np.float32)
    for stored in (dtypes.to_bf16(x), x.astype(np.float16)):
        assert reference.route(stored, 2).experts.tolist() == [[1, 0]]


def test_permute_reference_is_stable_padded_and_inverse():
    experts = np.array([[2, 0], [0, 2], [1, 0], [2, 1]], dtype=np.int32)  # slots 0..7
    d = reference.permute(experts, 4)
    assert d.sorted_slots.tolist() == [1, 2, 5, 4, 7, 0, 3, 6]
    assert d.offsets.tolist() == [0, 3, 5, 8, 8] and d.padded_offsets.tolist() == d.offsets.tolist()
    assert (d.sorted_slots[d.inverse.ravel()] == np.arange(8)).all()
    p = reference.permute(experts, 4, block_m=4)
    assert p.padded_offsets.tolist() == [0, 4, 8, 12, 12]
    assert p.sorted_slots.size == 8 + 4 * 3
    assert p.sorted_slots[:12].tolist() == [1, 2, 5, -1, 4, 7, -1, -1, 0, 3, 6, -1]
    assert (p.sorted_slots[12:] == -1).all()
    assert (p.sorted_slots[p.inverse.ravel()] == np.arange(8)).all()


def test_gather_and_combine_references():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    experts = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=np.int32)
    experts[2] = [1, 0]
    d = reference.permute(experts, 2, block_m=2)
    g = reference.gather(x, d.sorted_slots, 2)
    for r, s in enumerate(d.sorted_slots):
        assert (g[r] == (x[s // 2] if s >= 0 else 0)).all()
    w = np.array([[0.75, 0.25]] * 4)
    out = reference.combine(g, d.inverse, w)
    np.testing.assert_allclose(out, x)  # the weights sum to 1 and both rows hold the token's row


# ---------------------------------------------------------------- planners and --plan


PROFILES = device.all_profiles()


# expert counts of real models (60: Qwen1.5-MoE; 160: DeepSeek-V2; 256: DeepSeek-V3) and the edges of every
# experts-per-lane instance, up to configs.MAX_EXPERTS
EXPERT_COUNTS = (1, 8, 32, 33, 60, 64, 128, 160, 256, 257, 300, 384, 512)


@pytest.mark.parametrize("spec", PROFILES, ids=lambda s: s.key)
def test_planners_fit_every_profile(spec):
    for experts, tokens in itertools.product(EXPERT_COUNTS, (1, 4096, 1 << 20)):
        plan = configs.plan_route(configs.RouteProblem(tokens=tokens, experts=experts, top_k=1, dtype="bf16"), spec)
        epl = plan.config.experts_per_lane
        assert 32 * epl >= experts and (epl == 1 or 32 * epl // 2 < experts), f"{experts} experts: {epl} per lane"
        assert plan.smem_bytes <= spec.smem_per_block_optin and plan.config.threads <= spec.max_threads_per_block
    for plan in (configs.plan_finish(spec), configs.plan_scatter(spec)):
        tiling.check_fits(plan.config, spec)


def test_decode_sized_routing_is_one_block_that_finishes():
    spec = PROFILES[0]
    for tokens in (1, 7, 16, configs.FINISH_TOKENS):
        cfg = configs.plan_route(configs.RouteProblem(tokens=tokens, experts=64, top_k=2, dtype="bf16"), spec).config
        assert cfg.finish and cfg.block_tokens >= tokens and "true" in cfg.name_expression(dtype=dtypes.BF16)
    cfg = configs.plan_route(configs.RouteProblem(tokens=configs.FINISH_TOKENS + 1, experts=64, top_k=2,
                                                  dtype="bf16"), spec).config
    assert not cfg.finish


def test_route_takes_up_to_max_experts():
    assert configs.MAX_EXPERTS == 512 and configs.experts_per_lane(512) == 16
    with pytest.raises(ValueError, match="experts = 513: moe_route supports 1..512"):
        configs.experts_per_lane(513)
    # route's argument checks on host arrays: bad arguments raise ValueError; good ones pass every check and
    # meet only the TypeError for data that is not on a GPU
    for experts, top_k in ((512, 8), (300, 6), (3, 3)):
        with pytest.raises(TypeError):
            routing.validate(np.ones((4, experts), np.float32), top_k, "softmax", True)
    with pytest.raises(ValueError, match=r"logits has 513 experts \(shape\[1\]\); 1\.\.512 are supported"):
        routing.validate(np.ones((4, 513), np.float32), 8, "softmax", True)
    with pytest.raises(ValueError, match="top_k=9: must be 1..8"):
        routing.validate(np.ones((4, 512), np.float32), 9, "softmax", True)
    with pytest.raises(ValueError, match="top_k=4: must be 1..3"):
        routing.validate(np.ones((4, 3), np.float32), 4, "softmax", True)


def test_row_planners_choose_the_access_width():
    spec = device.profile("h200")
    plan = configs.plan_combine(configs.RowsProblem(rows=8, hidden=4096, top_k=2, dtype="bf16"), spec)
    assert (plan.config.vec, plan.config.max_k) == (8, 2)
    misaligned = configs.RowsProblem(rows=8, hidden=4096, top_k=5, dtype="bf16", align=2)
    assert (configs.plan_combine(misaligned, spec).config.vec, configs.plan_combine(misaligned, spec).config.max_k) == (1, 8)
    assert configs.plan_gather(configs.RowsProblem(rows=8, hidden=6, top_k=1, dtype="fp16"), spec).config.vec_bytes == 4
    assert configs.plan_gather(configs.RowsProblem(rows=8, hidden=7, top_k=1, dtype="bf16"), spec).config.vec_bytes == 2
    assert configs.plan_gather(configs.RowsProblem(rows=8, hidden=7, top_k=1, dtype="fp32"), spec).config.vec_bytes == 4


def test_suites_name_seed004_shapes():
    seed = {s.name: s for s in suites.suite("seed004")}
    assert [s.tokens for s in seed.values()] == [2048, 32768, 65536]
    assert all((s.hidden, s.intermediate, s.experts, s.top_k) == (4096, 11008, 32, 2) for s in seed.values())
    assert {s.name for s in suites.suite("routing")} == {"route_T32768_E32_top2", "route_T32768_E256_top8"}
    with pytest.raises(ValueError, match="unknown MoE suite"):
        suites.suite("nope")


def test_equal_gemm_offsets_spread_the_remainder():
    assert bench.gemm_offsets(10, 4, "equal").tolist() == [0, 3, 6, 8, 10]  # no row dropped
    assert bench.gemm_offsets(8, 4, "equal").tolist() == [0, 2, 4, 6, 8]
    assert bench.gemm_offsets(3, 4, "equal").tolist() == [0, 1, 2, 3, 3]
    assert bench.gemm_offsets(100, 7, "random", seed=1)[-1] == 100


@pytest.mark.parametrize("name", device.profile_names())
def test_bench_plan_for_every_profile(name):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = bench.main(["--plan", "--profile", name, "--suite", "all", "--verbose"])  # --verbose: the instances
    out = buf.getvalue()
    assert rc == 0, out
    for kernel in ("moe_route<", "moe_route_finish", "moe_permute_scatter<", "moe_gather<", "moe_combine<"):
        assert kernel in out
    assert f"{device.profile(name).smem_per_block_optin:,}" in out


def test_bench_without_gpu_points_to_plan(capsys):
    if device.gpu_available():
        pytest.skip("a GPU is visible")
    assert bench.main([]) == 0
    assert "--plan" in capsys.readouterr().err


# ---------------------------------------------------------------- offline compilation


def _variants(spec) -> dict:
    """(source, name expression) -> plan, for every config the planners can return on ``spec``."""
    out = {}
    for dt, experts in itertools.product(("fp32", "fp16", "bf16"), EXPERT_COUNTS):
        for tokens in (1, 1 << 20):
            p = configs.plan_route(configs.RouteProblem(tokens=tokens, experts=experts, top_k=1, dtype=dt), spec)
            out[(launch.ROUTE_SOURCE, p.config.name_expression(dtype=dtypes.from_name(dt)))] = p
    p = configs.plan_finish(spec)
    out[(launch.ROUTE_SOURCE, p.config.name_expression())] = p
    p = configs.plan_scatter(spec)
    out[(launch.DISPATCH_SOURCE, p.config.name_expression())] = p
    for dt, hidden, align, top_k in itertools.product(("fp32", "fp16", "bf16"), (4096, 6, 7), (16, 2),
                                                      (1, 3, 8)):
        problem = configs.RowsProblem(rows=1000, hidden=hidden, top_k=top_k, dtype=dt, align=align)
        g = configs.plan_gather(problem, spec)
        out[(launch.DISPATCH_SOURCE, g.config.name_expression())] = g
        c = configs.plan_combine(problem, spec)
        out[(launch.DISPATCH_SOURCE, c.config.name_expression(dtype=dtypes.from_name(dt)))] = c
    return out


def _archs():
    by_arch = {}
    for spec in PROFILES:
        by_arch.setdefault(spec.arch, []).append(spec)
    return by_arch


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(_archs()))
def test_every_variant_compiles_offline_without_spills(arch):
    specs = _archs()[arch]
    variants = {}
    for spec in specs:
        for key, plan in _variants(spec).items():
            variants.setdefault(key, []).append((spec, plan))
    assert any("moe_combine" in e for _, e in variants) and any("moe_route<" in e for _, e in variants)
    for source in (launch.ROUTE_SOURCE, launch.DISPATCH_SOURCE):
        exprs = [e for s, e in variants if s == source]
        resources = compile.compile_offline(source, exprs, arch)
        for expr in exprs:
            r = resources[expr]
            assert r.spills == 0 and r.stack_bytes == 0, f"{expr} on {arch}: {r}"
            for spec, plan in variants[(source, expr)]:
                assert r.static_smem_bytes <= spec.smem_per_block_optin
                assert r.static_smem_bytes == plan.config.smem_bytes(), f"{expr}: config's smem_bytes() is off"
                assert r.registers * plan.config.threads <= spec.regs_per_block, f"{expr} on {spec.key}"


def test_layer_ab_parses_variants_and_cases(layer_ab_tool):
    """tools/layer_ab.py: a variant names module attributes and Python-literal values; bad forms are refused."""
    name, sets = layer_ab_tool.parse_variant(
        "cap:moe.gemm_configs.SKINNY_MAX_ITEM_BYTES=1048576,moe.layer.FUSED_DECODE=False")
    assert name == "cap" and sets == [("moe.gemm_configs", "SKINNY_MAX_ITEM_BYTES", 1048576),
                                      ("moe.layer", "FUSED_DECODE", False)]
    assert layer_ab_tool.parse_variant("base") == ("base", [])
    assert layer_ab_tool.parse_variant("nx:-DSKINNY_NEXT_PREFETCH=3,moe.layer.FUSED_DECODE=False") == (
        "nx", [("define", "-DSKINNY_NEXT_PREFETCH=3", None), ("moe.layer", "FUSED_DECODE", False)])
    assert layer_ab_tool.parse_case("seed004:4") == layer_ab_tool.parse_case("decode_seed004_T4") == "decode_seed004_T4"
    for bad in ("x:FLAG=1", "x:moe.layer.FUSED_DECODE"):
        with pytest.raises(SystemExit, match="--variant"):
            layer_ab_tool.parse_variant(bad)
    with pytest.raises(SystemExit, match="--case"):
        layer_ab_tool.parse_case("llama:4")


def test_layer_ab_forces_expert_gemm_tiles(layer_ab_tool):
    """tools/layer_ab.py: ``up=`` / ``down=`` name skinny tiles; ``gemm_configs.expert_gemms_planned_as(up=...)``
    plans them for that expert GEMM only (the down-projection and the router's one-group fp32 GEMM as before)."""
    from cukernels import device
    from moe import gemm_configs

    name, sets = layer_ab_tool.parse_variant("t:up=8/16/2,down=16/32/1")
    assert sets == [("tile", "up", (8, 16, 2)), ("tile", "down", (16, 32, 1))]
    with pytest.raises(SystemExit, match="BLOCK_M/ROWS_PER_WARP/SPLIT_K"):
        layer_ab_tool.parse_variant("t:up=8/16")
    with pytest.raises(SystemExit, match="no skinny tile"):
        layer_ab_tool.skinny_tile((8, 64, 1))
    up = layer_ab_tool.skinny_tile((8, 16, 2))
    assert (up.block_m, up.block_n // up.warps_n, up.split_k) == (8, 16, 2)
    spec = device.profile("h100")
    G = gemm_configs.GemmProblem
    down = G(rows=8, n=2048, k=1408, experts=64, dtype="bf16")
    router = G(rows=1, n=64, k=2048, experts=1, dtype="bf16", out_dtype="fp32")
    real = gemm_configs.plan
    with gemm_configs.expert_gemms_planned_as(up=up):  # what the tool enters for a variant's forced tiles
        plan = gemm_configs.plan
        assert plan(G(rows=8, n=2816, k=2048, experts=64, dtype="bf16", epilogue="swiglu"), spec).config == up
        assert plan(down, spec).config == real(down, spec).config
        assert plan(router, spec).config == real(router, spec).config
    assert gemm_configs.plan is real


def test_gemm_ab_parses_cases_variants_and_forced_tiles(gemm_ab_tool):
    """tools/gemm_ab.py: a case is a gemm suite case (or the part after its shape) or ROWSxNxK/E, with an epilogue;
    a variant may force a tile of moe.gemm_configs by name; bad forms are refused naming the option."""
    from moe import gemm_configs

    tool = gemm_ab_tool
    suite = tool.parse_case("E32_equal")
    assert suite["suite"].name == "gemm_8192x11008x4096_E32_equal" and suite["epilogue"] is None
    assert tool.parse_case("gemm_8192x11008x4096_E32_equal")["suite"] == suite["suite"]
    shape = tool.parse_case("65536x22016x4096/32:swiglu")
    assert (shape["rows"], shape["n"], shape["k"], shape["experts"], shape["epilogue"]) == (65536, 22016, 4096, 32,
                                                                                              "swiglu")
    for bad in ("E8", "100x64x64/3", "E8_equal:relu"):
        with pytest.raises(SystemExit, match="--case"):
            tool.parse_case(bad)
    name, sets = tool.parse_variant("t:config=TMA_PAIR,-DGEMM_EPI_HALF_PASSES=0,moe.gemm_configs.PAIR_MIN_GROUP_ROWS=9")
    assert name == "t" and sets == [("config", "TMA_PAIR", None), ("define", "-DGEMM_EPI_HALF_PASSES=0", None),
                                    ("moe.gemm_configs", "PAIR_MIN_GROUP_ROWS", 9)]
    assert tool.forced_config("TMA_PAIR") == gemm_configs.TMA_PAIR[0]
    for bad in ("NOT_THERE", "PAIR_MIN_GROUP_ROWS"):
        with pytest.raises(SystemExit, match="is not a GemmConfig"):
            tool.forced_config(bad)
    with pytest.raises(SystemExit, match="--variant"):
        tool.parse_variant("t:config=TMA[0]")


def test_decode_timeline_summary_of_stamps(decode_timeline_tool):
    """tools/decode_timeline.py's analysis on made-up stamps: 3 stamped CTAs on 2 SMs (a fourth row never ran),
    each phase's percentiles in us from the first start, the span to the last exit, the items per CTA."""
    tool = decode_timeline_tool
    raw = np.zeros((4, 16), dtype=np.uint64)
    for cta, (t0, sm, ups, downs) in enumerate(((1000, 1, 2, 3), (1000, 2, 3, 4), (2000, 2, 3, 4))):
        raw[cta, :9] = [t0 + 1000 * i for i in range(9)]  # a stamp per us: start, ..., exit
        raw[cta, 12:16] = [t0 + 3500, t0 + 3600, t0 + 3700, t0 + 3800]
        raw[cta, 9:12] = (sm, ups, downs)
    got = tool.summarize(raw)
    assert got["ctas"] == 3 and got["sms"] == 2 and got["span_us"] == 9.0
    assert got["start"]["max"] == 1.0 and got["exit"][50] == 8.0 and got["exit"]["max"] == 9.0
    assert got["counts zeroed"][50] == 3.5 and got["slots sorted"]["max"] == 4.8
    assert got["up items per CTA"] == {"2": 1, "3": 2} and got["down items per CTA"] == {"3": 1, "4": 2}


def test_kernels_built_with_adds_options_to_matching_kernels(monkeypatch):
    """moe.launch.kernels_built_with (cukernels.compile.kernels_built_with): within the block the kernels whose names
    contain the part are built with the extra options (and listed), the others and every kernel after the block as
    the engine builds them; a lookup outside the MoE package (attention's) honours an engine block the same way,
    after the caller's own options, and the innermost matching block wins."""
    from cukernels import compile as _compile
    from moe import launch as ml

    seen = []
    monkeypatch.setattr(_compile, "_build", lambda source, name, options: seen.append((name, tuple(options))) or name)
    monkeypatch.setattr(ml, "device_id", lambda: 0)
    ml._kernel.cache_clear()
    try:
        with ml.kernels_built_with(("-DPROBE=4",), "moe_decode_skinny") as built:
            ml.kernel(ml.KERNELS / "grouped_gemm.cu", "moe_decode_skinny<float>")
            ml.kernel(ml.KERNELS / "grouped_gemm.cu", "moe_ffn_skinny<float>")
        ml.kernel(ml.KERNELS / "grouped_gemm.cu", "moe_decode_skinny<float>")
        with _compile.kernels_built_with(("-DA=1",), "flash") as outer, \
                _compile.kernels_built_with(("-DB=2",), "flash_decode") as inner:
            _compile.kernel("flash_decode.cu", "flash_decode<1>", options=("-DX",))
            _compile.kernel("flash_fwd.cu", "flash_fwd<1>")
            _compile.kernel("copy.cu", "copy_kernel")
    finally:
        ml._kernel.cache_clear()
    assert seen == [("moe_decode_skinny<float>", ("-DPROBE=4",)), ("moe_ffn_skinny<float>", ()),
                    ("moe_decode_skinny<float>", ()), ("flash_decode<1>", ("-DX", "-DB=2")),
                    ("flash_fwd<1>", ("-DA=1",)), ("copy_kernel", ())]
    assert built == ["moe_decode_skinny<float>"] and outer == ["flash_fwd<1>"] and inner == ["flash_decode<1>"]
    assert not _compile._BUILT_WITH
