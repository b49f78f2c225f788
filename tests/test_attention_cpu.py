"""Attention checks that need no GPU: plans on every profile, offline compilation of every variant the planner
can choose (zero spills), input validation, the reference against a direct NumPy formula, the shape registry."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from attention import api, configs, suites
from attention.reference import attention_reference
from cukernels import compile as ccompile
from cukernels import device, dtypes, tiling

PROFILES = device.all_profiles()
PROFILE_IDS = [p.key for p in PROFILES]
SUPPORTED = [p for p in PROFILES if tuple(p.compute_capability) >= configs.MIN_COMPUTE_CAPABILITY]


def test_profiles_exist():
    assert PROFILES, "no GPU profiles found under profiles/"
    assert SUPPORTED, "no profile of compute capability 8.0+"


# ---------------------------------------------------------------- planner


@pytest.mark.parametrize("spec", PROFILES, ids=PROFILE_IDS)
def test_every_suite_case_plans_within_limits(spec):
    for case in suites.all_cases():
        for dtype in ("fp16", "bf16"):
            problem = case.problem(dtype)
            if spec not in SUPPORTED:
                with pytest.raises(tiling.PlanError, match="compute capability 8.0"):
                    configs.plan_forward(problem, spec)
                continue
            plan = configs.plan_forward(problem, spec)
            assert plan.smem_bytes == plan.config.smem_bytes() <= spec.smem_per_block_optin, str(plan)
            assert plan.config.threads <= spec.max_threads_per_block
            assert plan.config.head_dim == case.head_dim
            assert plan.config in configs.plannable(spec, case.head_dim), (case.name, str(plan))
            assert str(plan)  # explainable


def test_planned_configs_are_plannable(monkeypatch):
    """Beyond the suites: a grid of shapes and masks (head dims, causal / window / none, 1k-16k keys, small and large
    grids) on the Hopper profiles with tensor maps available: every plan is among ``plannable`` (what the CPU
    compile tests build), so no planner rule hands out an instance nobody compiled."""
    from cukernels import tma

    monkeypatch.setattr(tma, "available", lambda: None)
    for key in ("h100_sxm", "h200"):
        spec = next(p for p in PROFILES if p.key == key)
        for head_dim in configs.HEAD_DIMS:
            allowed = configs.plannable(spec, head_dim)
            for seq in (1024, 2048, 4096, 16384):
                for batch, heads, kv_heads in ((1, 8, 8), (4, 8, 2), (16, 16, 16)):
                    for kw in ({}, dict(causal=True), dict(window=(256, 0)), dict(causal=True, window=(512, 0))):
                        problem = configs.FwdProblem(batch=batch, seq_q=seq, seq_kv=seq, heads=heads,
                                                     kv_heads=kv_heads, head_dim=head_dim, **kw)
                        plan = configs.plan_forward(problem, spec)
                        assert plan.config in allowed, (key, str(problem), str(plan))
                        assert problem.mask in configs.kernel_masks(plan.config), (key, str(problem), str(plan))


def test_planner_prefers_big_tiles_on_h200_and_shrinks_on_small_smem():
    h200 = device.profile("h200")
    big = suites.get("seed004_b32_s4096_h32_d128").problem()
    assert configs.plan_forward(big, h200).config.block_m == 128
    small_smem = dataclasses.replace(h200, smem_per_block_optin=101_376)
    hd256 = suites.get("hd256").problem()
    assert configs.plan_forward(hd256, h200).config.smem_bytes() > 101_376
    assert configs.plan_forward(hd256, small_smem).config.smem_bytes() <= 101_376
    tiny = dataclasses.replace(h200, smem_per_block_optin=30_000)
    with pytest.raises(tiling.PlanError, match="no tile config fits"):
        configs.plan_forward(hd256, tiny)


def test_profile_override_is_used_and_validated():
    h200 = device.profile("h200")
    tuned = {"head_dim_128": {"block_m": 64, "block_n": 32, "warps": 4, "stages": 3}}
    spec = dataclasses.replace(h200, overrides={"attention.fwd": tuned})
    plan = configs.plan_forward(suites.get("qwen").problem(), spec)
    assert plan.source == "profile override" and plan.config.block_n == 32 and plan.config.stages == 3
    assert configs.plan_forward(suites.get("hd256").problem(), spec).source == "heuristic"
    bad = dataclasses.replace(h200, overrides={"attention.fwd": {"head_dim_128": {"block_m": 64, "warps": 3,
                                                                                  "block_n": 32}}})
    with pytest.raises(tiling.PlanError, match="override"):
        configs.plan_forward(suites.get("qwen").problem(), bad)


def test_config_validation():
    with pytest.raises(ValueError, match="block_m"):
        configs.FwdConfig(head_dim=128, block_m=96, block_n=64, warps=4)
    with pytest.raises(ValueError, match="head_dim"):
        configs.FwdConfig(head_dim=96, block_m=64, block_n=64, warps=4)
    c = configs.FwdConfig(head_dim=128, block_m=128, block_n=64, warps=8)
    assert c.threads == 256 and c.smem_bytes() == 2 * 128 * (128 + 2 * 2 * 64)
    assert c.name_expression(dtype=dtypes.BF16, mask=3) == "flash_fwd<__nv_bfloat16,128,128,64,8,2,3>"


# ---------------------------------------------------------------- offline compilation (no GPU)


def _variants_by_arch() -> dict[tuple[str, str], list[str]]:
    """(arch, kernel file) -> every instance the planner can pick there (the wgmma file on sm_90a only)."""
    by_arch: dict[tuple[str, str], set[str]] = {}
    for spec in SUPPORTED:
        by_arch.setdefault((spec.arch, configs.FwdConfig.source), {"tile_id_range"})
        for head_dim in configs.HEAD_DIMS:
            for cfg in configs.plannable(spec, head_dim):
                exprs = by_arch.setdefault((spec.arch, cfg.source), set())
                for dt in (dtypes.FP16, dtypes.BF16):
                    for mask in configs.kernel_masks(cfg):
                        exprs.add(cfg.name_expression(dtype=dt, mask=mask))
    return {key: sorted(e) for key, e in sorted(by_arch.items())}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted({arch for arch, _ in _variants_by_arch()}))
def test_every_plannable_variant_compiles_without_spills(arch):
    """About 240 instances over 5 archs, one test per arch (compile_offline_all: programs of a few instances,
    compiled in threads on the CPU cores)."""
    jobs = [(api.KERNELS / source, exprs, arch) for (arch_of, source), exprs in _variants_by_arch().items()
            if arch_of == arch]
    results = ccompile.compile_offline_all(jobs)
    bad = []
    for res in results:
        for expr, r in res.items():
            if r.spills or r.stack_bytes or r.static_smem_bytes or r.performance_warnings:
                bad.append(f"{arch} {expr}: {r.registers} regs, spills {r.spills} B, stack {r.stack_bytes} B, "
                           f"static smem {r.static_smem_bytes} B{''.join('; ' + w for w in r.performance_warnings)}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_wgmma_descriptors_stay_in_uniform_registers(sass_tool):
    """docs/perf/attention.md v3.8: the Hopper kernels build their wgmma descriptors in uniform registers (the
    warpgroup index from wgmma::warpgroup(), low-word adds), where per-thread descriptors cost R2UR moves before
    every wgmma (forward +1-7 %, backward +1-3 % on an H100). Where nvdisasm is installed (the [test] and [sass]
    extras), the SASS of a few planned instances keeps R2UR moves per wgmma under a bound between the two builds (per
    instance, now / before: 0.04 / 0.71, 0.66 / 2.3, 0.24 / 2.4, 1.7 / 3.1). Counted after the CTA-wide setup
    barrier (`BAR.SYNC ... 0x0`): the setup's one thread, which issues the first TMA copies (v3.9), moves its tile
    coordinates into uniform registers once per CTA, not per wgmma."""
    import collections

    sass = sass_tool
    tool = sass.nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm here (pip install 'cukernels[sass]'): the SASS is not checked")
    cases = [("flash_fwd_tma.cu", "flash_fwd_tma<__nv_bfloat16,64,128,2,false,0,1>", 0.3),
             ("flash_fwd_tma.cu", "flash_fwd_tma<__nv_bfloat16,128,128,2,true,0,2,true>", 1.0),
             ("flash_fwd_tma.cu", "flash_fwd_tma<__half,256,80,2,true,1,2>", 0.8),
             ("flash_bwd_tma.cu", "flash_bwd_tma<__nv_bfloat16,128,64,2,0,true>", 2.2)]
    bad = []
    for source, expr, per_wgmma in cases:
        text = [i for _, i in sass.disassemble(ccompile.cubin(api.KERNELS / source, expr, "sm_90a"), tool)]
        setup = next(k for k, i in enumerate(text) if i.startswith("BAR.SYNC") and i.rstrip(" ;").endswith("0x0"))
        ops = collections.Counter(sass.opcode(i) for i in text[setup:])
        if not ops["HGMMA"] or ops["R2UR"] > per_wgmma * ops["HGMMA"]:
            bad.append(f"{expr}: {ops['R2UR']} R2UR for {ops['HGMMA']} HGMMA (at most {per_wgmma} per HGMMA)")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_wgmma_is_not_serialised(sass_tool):
    """ptxas may serialise every wgmma of a kernel (a WARPGROUP.DEPBAR after each HGMMA) without any warning: it
    did for the backward when a group was in flight across its loop's back edge, or issued under one condition and
    waited for under another (docs/perf/attention.md v5.4; 10-20 % slower on an H100). Where nvdisasm is installed,
    the SASS of planned instances of the TMA kernels keeps far fewer waits than HGMMA instructions, and the
    forward's K/V loop few register moves."""
    import collections

    sass = sass_tool
    tool = sass.nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm here (pip install 'cukernels[sass]'): the SASS is not checked")
    cases = [("flash_fwd_tma.cu", "flash_fwd_tma<__nv_bfloat16,64,128,2,false,0,1>"),
             ("flash_fwd_tma.cu", "flash_fwd_tma<__nv_bfloat16,128,128,2,true,0,2,true>"),
             ("flash_fwd_tma.cu", "flash_fwd_tma<__nv_bfloat16,64,64,4,true,0,4>"),
             ("flash_bwd_tma.cu", "flash_bwd_tma<__nv_bfloat16,128,64,3,0,true>"),
             ("flash_bwd_tma.cu", "flash_bwd_tma<__half,128,64,3,1,false>"),
             ("flash_bwd_tma.cu", "flash_bwd_tma<__nv_bfloat16,64,128,2,3,true>"),
             ("flash_bwd_tma.cu", "flash_bwd_tma_pair<__nv_bfloat16,256,64,2,1,true>")]
    bad = []
    for source, expr in cases:
        cubin = ccompile.cubin(api.KERNELS / source, expr, "sm_90a")
        text = [i for _, i in sass.disassemble(cubin, tool)]
        ops = collections.Counter(sass.opcode(i) for i in text)
        waits = sum(1 for i in text if i.startswith("WARPGROUP.DEPBAR"))
        if not ops["HGMMA"] or waits * 3 > ops["HGMMA"]:
            bad.append(f"{expr}: {waits} wgmma waits for {ops['HGMMA']} HGMMA")
        if source == "flash_fwd_tma.cu":
            # the forward's K/V loop (the shortest loop holding both Q K^T and P V) without register shuffles: ptxas
            # once zeroed S there with 64 moves per K/V tile (persistent tile, 72 moves in 964 instructions: v3.16)
            kv = min((body for body in sass.loops(cubin, tool)
                      if any("HGMMA" in i and "tnspB" in i for i in body)
                      and any("HGMMA" in i and "tnspB" not in i for i in body)), key=len, default=None)
            if kv is None or sass.register_moves(kv) > 16:
                bad.append(f"{expr}: K/V loop " + ("not found" if kv is None else
                                                   f"with {sass.register_moves(kv)} register moves in {len(kv)}"))
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- validation before any device work


def _arr(shape, dtype=np.float16):
    return np.zeros(shape, dtype=dtype)


Q, KV = (2, 10, 4, 64), (2, 12, 2, 64)


def _err(kind, match, *args, **kw):
    with pytest.raises(kind, match=match):
        api.validate(*args, **kw)


def test_validation_shapes_and_dtypes():
    q, k = _arr(Q), _arr(KV)
    _err(ValueError, "q must be 4-D", _arr((2, 10, 64)), k, k)
    _err(TypeError, "k must be float16 or bfloat16", q, _arr(KV, np.float32), k)
    _err(TypeError, "share one dtype", q, _arr(KV, np.uint16), _arr(KV, np.uint16))
    _err(ValueError, "k and v must have the same shape", q, k, _arr((2, 11, 2, 64)))
    _err(ValueError, "batch", q, _arr((3, 12, 2, 64)), _arr((3, 12, 2, 64)))
    _err(ValueError, "head_dim 128 differs", q, _arr((2, 12, 2, 128)), _arr((2, 12, 2, 128)))
    _err(ValueError, "head_dim must be one of", _arr((2, 10, 4, 96)), _arr((2, 12, 2, 96)), _arr((2, 12, 2, 96)))
    _err(ValueError, r"q heads \(4\) must be a multiple of k/v heads \(3\)", q, _arr((2, 12, 3, 64)),
         _arr((2, 12, 3, 64)))
    _err(ValueError, "q seq must be >= 1", _arr((2, 0, 4, 64)), k, k)
    _err(TypeError, "q must be a cupy.ndarray", [[1.0]], k, k)


def test_validation_strides():
    k = _arr(KV)
    q_t = np.zeros((2, 10, 64, 4), np.float16).transpose(0, 1, 3, 2)
    _err(ValueError, "q must be contiguous along head_dim", q_t, k, k)
    q_odd = np.zeros((2, 10, 4, 68), np.float16)[..., :64]  # seq/heads strides not multiples of 8 elements
    _err(ValueError, "multiples of 8", q_odd, k, k)
    packed = np.zeros((2, 10, 3, 4, 64), np.float16)  # a packed qkv slice is accepted
    _err(TypeError, "host data", packed[:, :, 0], packed[:, :, 1], packed[:, :, 2])


def test_validation_masks_and_scale():
    q, k = _arr(Q), _arr(KV)
    _err(TypeError, "window must be None or a pair", q, k, k, window=5)
    _err(TypeError, "window must be None or a pair", q, k, k, window=(1.5, 2))
    _err(ValueError, "window values must be >= 0, or -1", q, k, k, window=(-2, 3))
    _err(ValueError, "right side is 0", q, k, k, causal=True, window=(8, 4))
    _err(TypeError, "causal must be a bool", q, k, k, causal="yes")
    _err(ValueError, "one segment_ids array needs seq_q == seq_kv", q, k, k, segment_ids=_arr((2, 10), np.int32))
    _err(TypeError, "segment_ids must be int32", _arr((2, 12, 4, 64)), k, k, segment_ids=_arr((2, 12), np.int64))
    _err(ValueError, r"segment_ids\[1\] \(kv ids\) must have shape", q, k, k,
         segment_ids=(_arr((2, 10), np.int32), _arr((2, 10), np.int32)))
    _err(ValueError, "a \\(q_ids, kv_ids\\) pair", q, k, k, segment_ids=(_arr((2, 10), np.int32),))
    _err(ValueError, "softmax_scale must be finite and > 0", q, k, k, softmax_scale=-1.0)
    _err(TypeError, "softmax_scale must be a float", q, k, k, softmax_scale="0.1")
    # everything valid: only the host-data check is left
    _err(TypeError, "host data", q, k, k, causal=True, window=(4, -1), softmax_scale=0.2,
         segment_ids=(_arr((2, 10), np.int32), _arr((2, 12), np.int32)))


def test_flash_attention_rejects_host_arrays_before_launch():
    q = _arr(Q)
    with pytest.raises(TypeError, match="host data"):
        api.flash_attention(q, _arr(KV), _arr(KV))


# ---------------------------------------------------------------- reference


def _direct(q, k, v, *, causal, window, q_ids, kv_ids, scale):
    """Element-by-element attention in float64: the definition, written with loops."""
    B, Sq, H, D = q.shape
    Skv, KVH = k.shape[1], k.shape[2]
    o = np.zeros((B, Sq, H, D))
    lse = np.full((B, H, Sq), -np.inf)
    left, right = window or (-1, -1)
    if causal:
        right = 0
    for b in range(B):
        for h in range(H):
            kh = h // (H // KVH)
            for i in range(Sq):
                at = i + Skv - Sq
                js = [j for j in range(Skv)
                      if (left < 0 or j >= at - left) and (right < 0 or j <= at + right)
                      and (q_ids is None or q_ids[b, i] == kv_ids[b, j])]
                if not js:
                    continue
                s = np.array([scale * float(q[b, i, h] @ k[b, j, kh]) for j in js])
                m = s.max()
                p = np.exp(s - m)
                o[b, i, h] = sum(pj * v[b, j, kh] for pj, j in zip(p, js)) / p.sum()
                lse[b, h, i] = m + math.log(p.sum())
    return o, lse


@pytest.mark.parametrize("opts", [
    {},
    {"causal": True},
    {"window": (2, 1)},
    {"causal": True, "window": (3, -1)},
    {"segments": True},
    {"segments": True, "causal": True},
], ids=lambda o: "_".join(f"{k}{v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("seq_q,seq_kv", [(7, 7), (5, 9), (9, 4)])
def test_reference_matches_direct_formula(opts, seq_q, seq_kv):
    rng = np.random.default_rng(seq_q * 31 + seq_kv)
    q = rng.standard_normal((2, seq_q, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, seq_kv, 2, 8)).astype(np.float32)
    v = rng.standard_normal((2, seq_kv, 2, 8)).astype(np.float32)
    q_ids = kv_ids = seg = None
    if opts.get("segments"):
        q_ids = np.sort(rng.integers(0, 3, (2, seq_q)), axis=1).astype(np.int32)
        kv_ids = np.sort(rng.integers(0, 3, (2, seq_kv)), axis=1).astype(np.int32)
        seg = (q_ids, kv_ids)
    causal, window = opts.get("causal", False), opts.get("window")
    o, lse = attention_reference(q, k, v, causal=causal, window=window, segment_ids=seg, softmax_scale=0.4,
                                 return_lse=True)
    o_ref, lse_ref = _direct(q, k, v, causal=causal, window=window, q_ids=q_ids, kv_ids=kv_ids, scale=0.4)
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-5, atol=1e-5)
    assert np.isfinite(o).all()


def test_reference_bf16_inputs_and_rounding():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 2, 64)).astype(np.float32)
    bf = dtypes.to_bf16(x)
    o = attention_reference(bf, bf, bf)
    o_round = attention_reference(bf, bf, bf, round_to="bf16")
    assert o.dtype == np.float32 and 0 < np.abs(o - o_round).max() < 0.05


# ---------------------------------------------------------------- shape registry


def test_suites():
    names = [c.name for c in suites.all_cases()]
    assert len(names) == len(set(names))
    for tag in ("seed004", "grug", "quick", "ci"):
        assert suites.cases(tag)
    with pytest.raises(ValueError, match="known tags"):
        suites.cases("nope")
    s = suites.get("seed004_b16_s2048_h16_d64")
    assert s.flops() == 4 * 16 * 16 * 2048 * 2048 * 64
    assert suites.get("llama8b").flops() == 4 * 32 * 4096 * 4096 * 128 / 2
    ids = suites.get("swa_seg").segment_ids()
    assert ids.shape == (4, 4096) and ids.dtype == np.int32 and (np.diff(ids, axis=1) >= 0).all()


def test_tma_tile_only_where_tensor_maps_can_serve(monkeypatch):
    """On sm_90a the warp-specialised TMA tile comes first; a stride-0 axis or no cuda-bindings takes the next tile
    and says why in the plan."""
    from cukernels import tma

    h100 = next(p for p in PROFILES if p.key == "h100_sxm")
    base = dict(batch=2, seq_q=4096, seq_kv=4096, heads=16, kv_heads=16, head_dim=128)
    monkeypatch.setattr(tma, "available", lambda: None)
    assert isinstance(configs.plan_forward(configs.FwdProblem(**base), h100).config, configs.FwdTmaConfig)
    plan = configs.plan_forward(configs.FwdProblem(**base, tma_layout=False), h100)
    assert not isinstance(plan.config, configs.FwdTmaConfig) and "stride of 0" in plan.reason
    monkeypatch.setattr(tma, "available", lambda: "no cuda-bindings here")
    plan = configs.plan_forward(configs.FwdProblem(**base), h100)
    assert not isinstance(plan.config, configs.FwdTmaConfig) and "no cuda-bindings here" in plan.reason
    assert configs.tma_tiles(h100, 256) and not configs.tma_tiles(next(p for p in PROFILES if p.key == "a100_80gb"), 128)


def test_head_dim_256_80_key_stages_and_one_wave_head_dim_128(monkeypatch):
    """Head dim 256 plans the 80-key TMA tile where 227 KB of shared memory fit (H100, H200), and the 64-key one
    where they do not; head dim 128 without a mask keeps one tile per CTA on a grid of one wave or less (the
    persistent tile past it; docs/perf/attention.md v3.7)."""
    from cukernels import tma

    monkeypatch.setattr(tma, "available", lambda: None)
    for key in ("h100_sxm", "h200"):
        spec = next(p for p in PROFILES if p.key == key)
        problem = configs.FwdProblem(batch=8, seq_q=2048, seq_kv=2048, heads=4, kv_heads=4, head_dim=256)
        for kw in ({}, dict(causal=True)):
            cfg = configs.plan_forward(dataclasses.replace(problem, **kw), spec).config
            assert isinstance(cfg, configs.FwdTmaConfig) and cfg.block_n == 80 and cfg.pingpong, (key, kw, cfg)
        small = dataclasses.replace(spec, smem_per_block_optin=229_376)  # 224 KB: the 80-key tile does not fit
        cfg = configs.plan_forward(problem, small).config
        assert isinstance(cfg, configs.FwdTmaConfig) and cfg.block_n == 64, cfg
        one_wave = configs.FwdProblem(batch=2, seq_q=1024, seq_kv=1024, heads=8, kv_heads=8, head_dim=128)  # 128
        assert not configs.plan_forward(one_wave, spec).config.persistent
        # without a mask: one tile per CTA up to 2 waves (256 tiles) or past 1,024 keys; persistent on more waves
        assert not configs.plan_forward(dataclasses.replace(one_wave, batch=4), spec).config.persistent
        assert configs.plan_forward(dataclasses.replace(one_wave, batch=8), spec).config.persistent  # 512 tiles
        long_rows = dataclasses.replace(one_wave, batch=8, seq_q=2048, seq_kv=2048)
        assert not configs.plan_forward(long_rows, spec).config.persistent
        assert configs.plan_forward(dataclasses.replace(long_rows, causal=True), spec).config.persistent


def test_persistent_tile_where_measured_faster(monkeypatch):
    """On sm_90a the persistent TMA tile is planned under a causal/window mask and at head dim 128 (without a mask
    only on many waves of short rows), never for a packed batch; head dim 64 without a mask keeps the
    one-tile-per-CTA tiles and head dim 256 has none. A plan
    handed in for a mask its config has no kernel for is refused by name (``kernel_masks``)."""
    from cukernels import tma

    h100 = next(p for p in PROFILES if p.key == "h100_sxm")
    monkeypatch.setattr(tma, "available", lambda: None)

    def planned(head_dim, **kw):
        problem = configs.FwdProblem(batch=4, seq_q=1024, seq_kv=1024, heads=8, kv_heads=8, head_dim=head_dim, **kw)
        return configs.plan_forward(problem, h100)

    for head_dim, kw, persistent in ((64, dict(causal=True), False), (64, {}, False), (128, {}, False),
                                     (128, dict(causal=True), True), (128, dict(window=(100, 0)), True),
                                     (256, dict(causal=True), False)):
        plan = planned(head_dim, **kw)
        assert isinstance(plan.config, configs.FwdTmaConfig), (head_dim, kw)
        assert plan.config.persistent == persistent, (head_dim, kw, str(plan))
        if persistent:
            assert "persistent" in plan.reason and plan.config.consumers == 2
    # head dim 64 under a causal mask: one tile per CTA, 64 rows of one consumer below 4,096 keys and 192 rows of
    # three from there, launched heaviest first across heads (tile_order) while the K/V fit L2, head by head past
    # that; under a window no 192-row tile
    for seq, rows in ((1024, 64), (2048, 64), (4096, 192), (16384, 192)):
        problem = configs.FwdProblem(batch=2, seq_q=seq, seq_kv=seq, heads=8, kv_heads=8, head_dim=64, causal=True)
        plan = configs.plan_forward(problem, h100)
        cfg = plan.config
        assert not cfg.persistent and cfg.block_m == rows and f"one {rows}-row" in plan.reason, (seq, cfg)
        assert configs.tile_order(problem, cfg, h100, 512) == (seq <= 4096), seq
        assert not configs.tile_order(dataclasses.replace(problem, causal=False), cfg, h100, 512)
        for kw in (dict(window=(1000, 0)), dict(causal=False, window=(1000, 1000))):
            assert configs.plan_forward(dataclasses.replace(problem, **kw), h100).config.consumers != 3, (seq, kw)
    for seq, rows in ((1024, 64), (4096, 192)):  # 67-134 MB of K/V: head by head
        big = configs.FwdProblem(batch=16, seq_q=seq, seq_kv=seq, heads=16, kv_heads=16, head_dim=64, causal=True)
        cfg = configs.plan_forward(big, h100).config
        assert not cfg.persistent and cfg.block_m == rows, (seq, cfg)
        assert not configs.tile_order(big, cfg, h100, 512)
    packed = configs.FwdProblem(batch=4, seq_q=4096, seq_kv=4096, heads=8, kv_heads=8, head_dim=128, causal=True,
                                varlen=True)
    assert not configs.tile_order(packed, dataclasses.replace(cfg, persistent=False), h100, 512)
    assert not configs.plan_forward(packed, h100).config.persistent
    persistent = next(c for c in configs.tma_tiles(h100, 128) if c.persistent)
    assert configs.MASK_VARLEN not in configs.kernel_masks(persistent)
    with pytest.raises(ValueError, match="no kernel for mask kind"):
        configs.check_servable(persistent, packed)
    # head dim 64 without a mask, by rounds of CTAs on the busiest SM (v3.14, v3.15). Where the one-consumer tile's
    # bounds hold (at most two waves of 128-row tiles, or four of short rows), with n 64-row CTAs on the busiest SM:
    # two per SM for n <= 2; the 192-row tile where its CTAs fit one wave and n > 2; the 256-row tile where it takes
    # fewer rounds than three per SM (n = 4, 7, 8); three per SM where that takes fewer rounds than two (n = 3, 5, 6).
    # Beyond those bounds the 128-, 192- or 256-row tile by rounds x each one's time (_ROWS_LONGER)
    def plain64(batch, seq, heads):
        return configs.plan_forward(configs.FwdProblem(batch=batch, seq_q=seq, seq_kv=seq, heads=heads,
                                                       kv_heads=heads, head_dim=64), h100)
    for batch, seq, heads in ((2, 1024, 8), (1, 1024, 8)):
        small = plain64(batch, seq, heads)
        assert (small.config.consumers == 1 and small.config.block_m == 64 and small.config.ctas_per_sm == 0
                and "two CTAs per SM" in small.reason), (batch, seq, heads)
    for batch, seq, heads in ((3, 1024, 8), (1, 1024, 24), (5, 1024, 8), (6, 1024, 8)):
        small = plain64(batch, seq, heads)
        assert small.config.ctas_per_sm == 3 and "three CTAs per SM" in small.reason, (batch, seq, heads)
    for batch, seq, heads in ((1, 1024, 18), (5, 512, 8), (1, 2048, 10), (1, 4096, 6)):
        one_wave = plain64(batch, seq, heads)
        assert one_wave.config.consumers == 3 and "one wave" in one_wave.reason, (batch, seq, heads)
    for batch, seq, heads in ((4, 1024, 8), (1, 4096, 8), (8, 1024, 8), (16, 1024, 16), (4, 4096, 8), (3, 1024, 32)):
        rows256 = plain64(batch, seq, heads)
        assert (rows256.config.consumers == 4 and rows256.config.block_m == 256 and rows256.config.block_n == 64
                and "256 rows" in rows256.reason), (batch, seq, heads)
    for batch, seq, heads in ((16, 2048, 16), (8, 2048, 16), (4, 4096, 16)):
        assert plain64(batch, seq, heads).config.consumers == 3, (batch, seq, heads)
    segments = configs.FwdProblem(batch=4, seq_q=1024, seq_kv=1024, heads=8, kv_heads=8, head_dim=64, segments=True)
    assert configs.plan_forward(segments, h100).config.consumers != 4  # measured without a mask only
    for bad in (dict(block_n=128), dict(head_dim=128, block_n=64)):
        with pytest.raises(ValueError, match="consumers"):
            configs.FwdTmaConfig(**{"head_dim": 64, "consumers": 4, **bad})
    for kw in (dict(batch=16, seq_q=2048, seq_kv=2048), dict(batch=1, seq_q=4096, seq_kv=4096),
               dict(batch=2, seq_q=2048, seq_kv=2048), dict(batch=4, seq_q=1024, seq_kv=1024, window=(64, 64))):
        problem = configs.FwdProblem(heads=16, kv_heads=16, head_dim=64, **kw)
        assert configs.plan_forward(problem, h100).config.consumers != 1, kw
    with pytest.raises(ValueError, match="neither pingpong nor persistent"):
        configs.FwdTmaConfig(head_dim=64, block_n=128, consumers=1, pingpong=True)
    # head dim 64 under a plain causal mask below 4,096 keys: the one-consumer tile at three CTAs per SM (64-key
    # stages) where heads x 64-row tiles fill the SMs three times over, two per SM on smaller grids, neither with a
    # window or segment ids (v3.13); the three-per-SM tile is a one-consumer, head-dim-64, 64-key-stage tile only
    def causal64(batch, seq, heads, **kw):
        return configs.plan_forward(configs.FwdProblem(batch=batch, seq_q=seq, seq_kv=seq, heads=heads,
                                                       kv_heads=heads, head_dim=64, causal=True, **kw), h100)
    for batch, seq, heads in ((4, 1024, 8), (8, 1024, 8), (16, 2048, 16), (2, 2048, 16)):
        plan = causal64(batch, seq, heads)
        assert plan.config.ctas_per_sm == 3 and plan.config.block_n == 64 and "three CTAs per SM" in plan.reason
    for batch, seq, heads, kw in ((2, 1024, 8, {}), (3, 1024, 8, {}), (16, 2048, 16, dict(window=(256, 0))),
                                  (16, 2048, 16, dict(segments=True))):
        plan = causal64(batch, seq, heads, **kw)
        assert plan.config.ctas_per_sm == 0 and plan.config.consumers == 1, (batch, seq, kw)
    assert causal64(1, 4096, 16).config.consumers == 3
    assert configs.plan_forward(configs.FwdProblem(batch=16, seq_q=2048, seq_kv=2048, heads=16, kv_heads=16,
                                                   head_dim=64), h100).config.ctas_per_sm == 0
    for bad in (dict(consumers=2, block_n=64, ctas_per_sm=3), dict(consumers=1, block_n=128, ctas_per_sm=3),
                dict(consumers=1, block_n=64, ctas_per_sm=3, head_dim=128), dict(consumers=1, block_n=64, ctas_per_sm=2)):
        with pytest.raises(ValueError, match="ctas_per_sm"):
            configs.FwdTmaConfig(**{"head_dim": 64, "pingpong": False, **bad})
    # the persistent tiles' order under a causal mask: by weight where the K/V fit L2, head by head else, and one
    # tile per CTA where head by head would leave a CTA far over the mean (configs.persistent_order)
    def order(batch, seq, heads, kv_heads, head_dim):
        problem = configs.FwdProblem(batch=batch, seq_q=seq, seq_kv=seq, heads=heads, kv_heads=kv_heads,
                                     head_dim=head_dim, causal=True)
        tile = next(c for c in configs.tma_tiles(h100, head_dim) if c.persistent)
        return configs.persistent_order(problem, tile, h100), configs.plan_forward(problem, h100)

    (by_weight, balance), plan = order(2, 4096, 8, 8, 128)  # 33.5 MB of K/V
    assert by_weight and balance < 1.01 and plan.config.persistent
    (by_weight, balance), plan = order(1, 16384, 8, 8, 128)  # 134 MB: head by head, 1.8x the mean
    assert not by_weight and balance > 1.7 and not plan.config.persistent and "one tile per CTA" in plan.reason
    (by_weight, balance), plan = order(16, 2048, 16, 16, 64)  # 67 MB, balanced head by head
    assert not by_weight and balance < 1.05  # (head dim 64 under a causal mask plans one tile per CTA: above)
    assert not plan.config.persistent and plan.config.block_m == 64
    rows_192 = next(c for c in configs.tma_tiles(h100, 64) if c.consumers == 3)
    assert set(configs.kernel_masks(rows_192)) == set(configs.MASK_KINDS)  # since v3.11 (planned: above)
    assert not any(c.persistent for c in configs.tma_tiles(h100, 256))


def test_fwd_timeline_summary_of_stamps(fwd_timeline_tool):
    """tools/fwd_timeline.py's analysis on made-up stamps: two waves of 4 CTAs on 4 SMs, each CTA 1 us to its Q,
    2 us to its first K, 5 us of loop and 0.5 us of store (stamps in ns, slot 5 the SM + 1); unstamped rows ignored."""
    tool = fwd_timeline_tool
    raw = np.zeros((10, 8), dtype=np.uint64)
    for c in range(8):
        start = 1_000_000 + (c // 4) * 9_000 + c * 10
        raw[c, :6] = (start, start + 1000, start + 2000, start + 7000, start + 7500, c % 4 + 1)
    out = tool.summarize(raw)
    assert out["ctas"] == 8 and out["sms"] == 4 and len(out["waves"]) == 2
    assert abs(out["waves"][1] - 9.04) < 1e-6 and abs(out["kernel_us"] - (9.07 + 7.5)) < 1e-6
    ph = out["phases"]
    assert abs(ph["q (start -> Q landed)"][50] - 1.0) < 1e-9 and abs(ph["loop (first K -> last P V)"][90] - 5.0) < 1e-9
    assert abs(ph["cta (start -> stored)"][10] - 7.5) < 1e-9
    # each SM runs CTA c then c + 4: 15 us with one resident, the 1.54 us between them with none
    assert abs(out["resident_us"][1] - 15.0) < 1e-6 and out["resident_us"][2] == out["resident_us"][3] == 0
    assert abs(sum(out["resident_us"]) - out["kernel_us"]) < 1e-6
    assert abs(out["turnaround"][50] - 1.54) < 1e-6 and abs(out["turnaround"][90] - 1.54) < 1e-6


@pytest.mark.slow
def test_fwd_timeline_probe_compiles_without_spills():
    """The FWD_TIMELINE probe of flash_fwd_tma.cu (off in the engine's builds) compiles on sm_90a with no spills for
    the one-consumer, pingpong persistent and 192-row instances."""
    exprs = ["flash_fwd_tma<__nv_bfloat16,64,128,2,false,0,1>", "flash_fwd_tma<__nv_bfloat16,128,128,2,true,1,2,true>",
             "flash_fwd_tma<__half,64,128,3,true,0,3>"]
    res = ccompile.compile_offline(api.KERNELS / "flash_fwd_tma.cu", exprs, "sm_90a",
                                   options=("-DFWD_TIMELINE=4096",))
    for expr, r in res.items():
        assert r.spills == 0 and r.stack_bytes == 0, (expr, r)
