"""Flash attention backward without a GPU: plans fit every profile for every suite case, every backward
variant the planner can choose compiles offline for every profile's arch without spills, validation errors name
the argument before any launch, and the NumPy analytic backward reference matches finite differences."""
from __future__ import annotations

import os

import numpy as np
import pytest

from attention import suites
from attention.backward import KERNEL_SOURCE, validate_backward
from attention.backward_reference import attention_backward_reference, attention_forward_reference
from attention.bwd_configs import BwdConfig, plan_backward, search_space
from attention.configs import MASK_KINDS, FwdProblem
from cukernels import compile, device, dtypes, tiling

PROFILES = device.all_profiles()
HEAD_DIMS = (64, 128, 256)


def _problems():
    """Every suite case, plus each case at every head dim (so head dim 256 is planned on every profile)."""
    out = []
    for c in suites.all_cases():
        for d in HEAD_DIMS:
            for dt in ("fp16", "bf16"):
                p = c.problem(dt)
                out.append((c.name, FwdProblem(**{**p.__dict__, "head_dim": d})))
    return out


@pytest.mark.parametrize("spec", PROFILES, ids=[s.key for s in PROFILES])
def test_backward_plans_fit_every_profile(spec):
    for name, problem in _problems():
        if spec.compute_capability < (8, 0):
            # T4 (sm_75): no cp.async / bf16 mma.sync; "fits T4" means a clear PlanError, never a launch
            with pytest.raises(tiling.PlanError, match="compute capability 8.0"):
                plan_backward(problem, spec)
            continue
        plan = plan_backward(problem, spec)
        cfg = plan.config
        assert isinstance(cfg, BwdConfig) and cfg.head_dim == problem.head_dim
        assert cfg.dkdv_smem_bytes() <= spec.smem_per_block_optin, (name, str(plan))
        assert cfg.dq_smem_bytes() <= spec.smem_per_block_optin, (name, str(plan))
        assert plan.smem_bytes == cfg.smem_bytes() and plan.limit == spec.smem_per_block_optin
        assert cfg.threads <= spec.max_threads_per_block


def test_seed000_cases_plan_on_gb10():
    """Seed 000's failures: head dim 256 backward on GB10 (smem 167,936 > 101,376) and SWA + segment ids."""
    gb10 = device.profile("gb10")
    for name in ("hd256", "swa_seg"):
        plan = plan_backward(suites.get(name).problem(), gb10)
        assert plan.smem_bytes <= 101_376, str(plan)


def test_some_plans_use_different_q_and_kv_tiles():
    """The planner does choose block_m != block_n (and the dQ kernel's own tiles), so the GPU segment test
    with such a plan exercises seed 000's mask-shape case."""
    diff = {str(c) for d in HEAD_DIMS for c in search_space(d)
            if c.block_m != c.block_n or c.dq_block_m != c.dq_block_n}
    assert diff
    for key in ("h200", "a100_80gb"):  # the wgmma tiles (Hopper) and the mma.sync ones
        spec = device.profile(key)
        assert any(plan_backward(suites.get(n).problem(), spec).config.block_m
                   != plan_backward(suites.get(n).problem(), spec).config.block_n
                   for n in ("hd256", "quick_d64", "qwen")), key


def test_config_rejects_bad_tiles():
    with pytest.raises(ValueError, match="block_m"):
        BwdConfig(head_dim=128, block_m=48, block_n=64, warps=8)
    with pytest.raises(ValueError, match="block_n"):
        BwdConfig(head_dim=128, block_m=64, block_n=40, warps=8)
    with pytest.raises(ValueError, match="head_dim"):
        BwdConfig(head_dim=96, block_m=64, block_n=64, warps=8)


def test_profile_override_is_validated():
    import dataclasses

    spec = device.profile("gb10")
    bad = dataclasses.replace(spec, overrides={"attention.bwd": {"head_dim_128": {
        "block_m": 64, "block_n": 128, "warps": 8, "stages": 2}}})
    with pytest.raises(tiling.PlanError, match="does not fit"):
        plan_backward(suites.get("qwen").problem(), bad)


# ---------------------------------------------------------------- offline compilation


def _variants():
    """{arch: set of configs} the planner can choose on the profiles with that arch."""
    by_arch: dict[str, set] = {}
    for spec in PROFILES:
        if spec.compute_capability < (8, 0):
            continue
        for _, problem in _problems():
            by_arch.setdefault(spec.arch, set()).add(plan_backward(problem, spec).config)
    return by_arch


# ptxas' register allocation has been identical for fp16 and bf16 in every instance checked; CI compiles the bf16
# instances of every planned variant (about 2 minutes on 2 cores), CUKERNELS_FULL_COMPILE=1 adds fp16 (twice that).
_COMPILE_DTYPES = (dtypes.BF16, dtypes.FP16) if os.environ.get("CUKERNELS_FULL_COMPILE") else (dtypes.BF16,)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted({s.arch for s in PROFILES if s.compute_capability >= (8, 0)}))
def test_every_planned_variant_compiles_without_spills(arch):
    common = [f"flash_bwd_preprocess<{dtypes.ctype(dt)},{d},{packed}>" for dt in (dtypes.FP16, dtypes.BF16)
              for d in HEAD_DIMS for packed in ("false", "true")] + [f"flash_bwd_dq_convert<{dtypes.ctype(dt)}>" for dt in (dtypes.FP16, dtypes.BF16)]
    jobs = [(KERNEL_SOURCE, common, arch)]
    for cfg in sorted(_variants()[arch], key=str):
        for dt in _COMPILE_DTYPES:
            for mask in MASK_KINDS:
                for source, exprs in cfg.name_expressions(dtype=dt, mask=mask).items():
                    jobs.append((KERNEL_SOURCE.parent / source, exprs, arch))
    results = compile.compile_offline_all(jobs)  # programs of a few instances, compiled in threads
    problems = []
    for res in results:
        for expr, r in res.items():
            if r.spills or r.stack_bytes or r.performance_warnings:
                problems.append(f"{r.arch} {expr}: {r.registers} regs, {r.spills} B spilled, {r.stack_bytes} B stack"
                                f"{''.join('; ' + w for w in r.performance_warnings)}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- validation (no GPU needed)


class _FakeCupy:
    """Just the attributes validation reads, typed as a CuPy array on device 0."""

    __module__ = "cupy._fake"

    def __init__(self, shape, dtype, device_id=0, strides=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        c = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            c[i] = c[i + 1] * shape[i + 1]
        self.strides = tuple(s * self.dtype.itemsize for s in (strides or c))
        self.device = type("Dev", (), {"id": device_id})()


def _args(**over):
    q = _FakeCupy((2, 100, 8, 128), np.float16)
    kv = _FakeCupy((2, 120, 2, 128), np.float16)
    a = dict(do=_FakeCupy((2, 100, 8, 128), np.float16), q=q, k=kv, v=kv, o=_FakeCupy((2, 100, 8, 128), np.float16),
             lse=_FakeCupy((2, 8, 100), np.float32))
    a.update(over)
    return a


def test_validation_accepts_good_inputs():
    a = _args()
    p = validate_backward(a["do"], a["q"], a["k"], a["v"], a["o"], a["lse"], causal=True)
    assert (p.heads, p.kv_heads, p.head_dim, p.dtype) == (8, 2, 128, "fp16")


@pytest.mark.parametrize("over, err, match", [
    ({"do": _FakeCupy((2, 100, 8, 64), np.float16)}, ValueError, "do must have q's shape"),
    ({"o": _FakeCupy((2, 100, 8, 128), np.uint16)}, TypeError, "o must have q's dtype"),
    ({"lse": _FakeCupy((2, 100, 8), np.float32)}, ValueError, "lse must have shape"),
    ({"lse": _FakeCupy((2, 8, 100), np.float16)}, TypeError, "lse must be float32"),
    ({"lse": np.zeros((2, 8, 100), np.float32)}, ValueError, "lse is on device None"),
    ({"do": _FakeCupy((2, 100, 8, 128), np.float16, device_id=1)}, ValueError, "do is on device 1"),
    ({"o": _FakeCupy((2, 100, 8, 128), np.float16, strides=(100 * 8 * 128, 8 * 128, 128, 2))}, ValueError,
     "o must be contiguous along head_dim"),
    ({"k": _FakeCupy((2, 120, 3, 128), np.float16), "v": _FakeCupy((2, 120, 3, 128), np.float16)}, ValueError,
     "multiple of k/v heads"),
    ({"lse": None}, TypeError, "lse must be a float32"),
])
def test_validation_errors_name_the_argument(over, err, match):
    a = _args(**over)
    with pytest.raises(err, match=match):
        validate_backward(a["do"], a["q"], a["k"], a["v"], a["o"], a["lse"])


def test_validation_deterministic_must_be_bool():
    a = _args()
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        validate_backward(a["do"], a["q"], a["k"], a["v"], a["o"], a["lse"], deterministic="yes")


# ---------------------------------------------------------------- the analytic reference


def _finite_difference(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = fn()
        x[i] = old - eps
        lo = fn()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


FD_CASES = [
    (1, 5, 5, 2, 2, {}),
    (2, 4, 6, 4, 2, {"causal": True}),
    (1, 6, 3, 2, 1, {"causal": True}),  # seq_q > seq_kv: the first rows see no key
    (1, 7, 7, 2, 1, {"window": (2, 1)}),
    (1, 6, 6, 2, 2, {"causal": True, "window": (1, 0), "softmax_scale": 0.7}),
    (2, 6, 6, 2, 1, {"segments": True}),
    (1, 5, 7, 2, 1, {"segment_pair": True}),
]


@pytest.mark.parametrize("case", FD_CASES, ids=[str(i) for i in range(len(FD_CASES))])
def test_reference_backward_matches_finite_differences(case):
    batch, sq, skv, heads, kvh, opts = case
    opts = dict(opts)
    rng = np.random.default_rng(sq * 7 + skv)
    dim = 4
    q = rng.standard_normal((batch, sq, heads, dim))
    k = rng.standard_normal((batch, skv, kvh, dim))
    v = rng.standard_normal((batch, skv, kvh, dim))
    do = rng.standard_normal((batch, sq, heads, dim))
    if opts.pop("segments", False):
        opts["segment_ids"] = np.array([[0, 0, 1, 1, 1, 2]] * batch, dtype=np.int32)
    if opts.pop("segment_pair", False):
        opts["segment_ids"] = (np.array([[0, 1, 1, 5, 0]], dtype=np.int32),
                               np.array([[0, 0, 1, 1, 1, 2, 2]], dtype=np.int32))

    def loss():
        o, _ = attention_forward_reference(q, k, v, precision="fp64", **opts)
        return float((o * do).sum())

    dq, dk, dv = attention_backward_reference(do, q, k, v, precision="fp64", **opts)
    for name, x, g in (("dq", q, dq), ("dk", k, dk), ("dv", v, dv)):
        fd = _finite_difference(loss, x)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8, err_msg=name)
        assert np.isfinite(g).all()


def test_reference_empty_rows_give_zero_gradient():
    rng = np.random.default_rng(0)
    q, do = rng.standard_normal((1, 6, 2, 4)), rng.standard_normal((1, 6, 2, 4))
    k, v = rng.standard_normal((1, 3, 1, 4)), rng.standard_normal((1, 3, 1, 4))
    dq, dk, dv = attention_backward_reference(do, q, k, v, causal=True, precision="fp64")
    assert (dq[:, :3] == 0).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


def test_reference_forward_matches_forward_engineers_reference():
    from attention import attention_reference

    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 9, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 11, 2, 8)).astype(np.float32)
    v = rng.standard_normal((2, 11, 2, 8)).astype(np.float32)
    o, lse = attention_forward_reference(q, k, v, causal=True, window=(3, 0))
    ro, rlse = attention_reference(q, k, v, causal=True, window=(3, 0), return_lse=True)
    np.testing.assert_allclose(o, ro, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, rlse, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the warp-specialised TMA backward (sm_90a)


def test_tma_backward_only_where_tensor_maps_can_serve(monkeypatch):
    """On sm_90a the TMA dK/dV kernels come first at every head dim (the pair kernel at 256); a stride-0 axis (a
    broadcast dO) or no cuda-bindings takes the cp.async wgmma kernel and says why; other GPUs never get them."""
    from attention.bwd_configs import BwdTmaConfig, BwdWgmmaConfig
    from cukernels import tma

    h100, a100 = device.profile("h100_sxm"), device.profile("a100_80gb")
    base = dict(batch=2, seq_q=4096, seq_kv=4096, heads=16, kv_heads=8, causal=True)
    monkeypatch.setattr(tma, "available", lambda: None)
    for d in (64, 128, 256):
        cfg = plan_backward(FwdProblem(**base, head_dim=d), h100).config
        assert isinstance(cfg, BwdTmaConfig) and cfg.pair == (d == 256)
        plan = plan_backward(FwdProblem(**base, head_dim=d, tma_layout=False), h100)
        assert isinstance(plan.config, BwdWgmmaConfig) and "stride of 0" in plan.reason
        assert not isinstance(plan_backward(FwdProblem(**base, head_dim=d), a100).config, BwdTmaConfig)
    monkeypatch.setattr(tma, "available", lambda: "no cuda-bindings here")
    plan = plan_backward(FwdProblem(**base, head_dim=128), h100)
    assert not isinstance(plan.config, BwdTmaConfig) and "no cuda-bindings here" in plan.reason


def test_every_tma_backward_tile_fits_hopper():
    """The TMA tiles of the search space (shared memory from dkdv_smem_bytes, as the kernel lays it out) fit H100
    and H200; a bad tile is refused by name."""
    from attention.bwd_configs import BwdTmaConfig

    for key in ("h100_sxm", "h200"):
        spec = device.profile(key)
        for d in (64, 128, 256):
            tiles = [c for c in search_space(d) if isinstance(c, BwdTmaConfig)]
            assert tiles and all(tiling.fits(c, spec) is None for c in tiles), [str(c) for c in tiles]
    pair = BwdTmaConfig(head_dim=256, block_m=64, dq_block_n=32)
    assert (pair.block_n, pair.warps, pair.threads) == (64, 12, 384)  # two consumer warpgroups and the producer
    with pytest.raises(ValueError, match="stages"):
        BwdTmaConfig(head_dim=256, block_m=64, stages=3)  # 3 stages of 64 x 256 Q and dO do not fit
    with pytest.raises(ValueError, match="block_m"):
        BwdTmaConfig(head_dim=256, block_m=128)
    with pytest.raises(ValueError, match="block_m"):
        BwdTmaConfig(head_dim=128, block_m=128)


def test_head_chunk_is_about_one_wave():
    """backward.head_chunk: kv heads per chunk of the TMA kernel's CTA order = SMs // KV tiles, within
    [1, kv_heads] (docs/perf/attention.md, backward v3)."""
    from attention.backward import head_chunk
    from attention.bwd_configs import BwdTmaConfig

    cfg = BwdTmaConfig(head_dim=128, block_m=64)
    p = lambda s, kvh: FwdProblem(batch=1, seq_q=s, seq_kv=s, heads=4 * kvh, kv_heads=kvh, head_dim=128)  # noqa: E731
    assert head_chunk(p(4096, 8), cfg, 132) == 4      # 32 KV tiles per head
    assert head_chunk(p(8192, 8), cfg, 132) == 2      # 64
    assert head_chunk(p(65536, 8), cfg, 132) == 1     # 512: never 0
    assert head_chunk(p(1024, 2), cfg, 132) == 2      # 8 tiles: all (2) heads


def test_dq_staging_stores_are_conflict_free_and_complete():
    """The address rule of stage_dq (kernels/flash_bwd_tma.cu), modelled: a warpgroup's 64 x 32 fp32 slice goes into
    the 128-byte-swizzled box once per element at the element's own place, and each half-warp of a store touches
    32 distinct banks (the plain rule, every lane on group i at store i, took two passes per half-warp)."""
    def place(r, col):  # the box layout: 16-byte chunk k of row r at k ^ (r % 8)
        return r * 128 + ((((col % 32) // 4) ^ (r & 7)) << 4) + (col % 4) * 4

    def stores(gray):
        for warp in range(4):
            for i in range(4):
                for hh in range(2):
                    lanes = []
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        r = 16 * warp + g
                        v = ((r & 3) ^ ((r >> 1) & 1)) if gray else 0
                        jn = i ^ v  # the register group the two conditional swaps bring to slot i
                        col = 8 * jn + 2 * t
                        lanes.append([(place(r + 8 * hh, col + e), (r + 8 * hh, col + e)) for e in (0, 1)])
                    yield lanes

    for gray, passes in ((False, 2), (True, 1)):
        seen = {}
        for lanes in stores(gray):
            for half in (lanes[:16], lanes[16:]):
                banks = {}
                for words in half:
                    for addr, _ in words:
                        banks.setdefault(addr // 4 % 32, set()).add(addr)
                assert max(len(a) for a in banks.values()) == passes
            for words in lanes:
                for addr, elem in words:
                    assert seen.setdefault(addr, elem) == elem
        assert sorted(seen.values()) == [(r, c) for r in range(64) for c in range(32)]
