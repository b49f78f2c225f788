"""Engine checks that need no GPU: profiles, planner, offline compilation, checks, timing statistics, reports."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cukernels import bench, checks, compile, device, dtypes, report, tiling, timing

AXPY = Path(__file__).parent / "kernels" / "axpy.cu"
REQUIRED_PROFILES = {"h200", "h100_sxm", "a100_80gb", "a100_40gb", "a10", "l4", "rtx4090", "gb10", "t4"}
OPTIN = {"h200": 232448, "h100_sxm": 232448, "a100_80gb": 166912, "a100_40gb": 166912, "a10": 101376,
         "l4": 101376, "rtx4090": 101376, "gb10": 101376, "t4": 65536}


# ---------------------------------------------------------------- profiles


def test_required_profiles_exist():
    assert REQUIRED_PROFILES <= set(device.profile_names())


@pytest.mark.parametrize("name", sorted(REQUIRED_PROFILES))
def test_profile_limits_and_sources(name):
    spec = device.profile(name)
    assert spec.smem_per_block_optin == OPTIN[name]
    assert spec.smem_per_block <= spec.smem_per_block_optin <= spec.smem_per_sm
    assert spec.sm_count > 0 and spec.l2_bytes > 0 and spec.regs_per_sm >= spec.regs_per_block > 0
    assert spec.max_threads_per_block <= spec.max_threads_per_sm
    assert spec.peaks is not None and spec.peaks.mem_bandwidth_gbs > 0 and spec.peaks.fp16_tflops > 0
    for key in list(spec.limits()) + [f.name for f in dataclasses.fields(spec.peaks)]:
        assert spec.sources.get(key), f"profile {name}: {key} has no source"


def test_hopper_compiles_for_sm90a():
    assert device.profile("h200").arch == "sm_90a"
    assert device.profile("a100_80gb").arch == "sm_80"
    assert device.arch_for((8, 9)) == "sm_89"


@pytest.mark.parametrize("nvml_name,key", [("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100_80gb"),
                                           ("NVIDIA A100-SXM4-40GB", "a100_40gb"), ("Tesla T4", "t4"),
                                           ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L4", "l4"),
                                           ("NVIDIA A10", "a10"), ("NVIDIA H100 80GB HBM3", "h100_sxm"),
                                           ("NVIDIA GB10", "gb10")])
def test_nvml_names_match_profiles(nvml_name, key):
    assert device.match_profile(nvml_name) == key


def test_unknown_profile_lists_known_ones():
    with pytest.raises(device.UnknownProfileError, match="h200"):
        device.profile("h300")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cukernels", *args], capture_output=True, text=True, timeout=60)


def test_cli_profile_prints_limits():
    out = _cli("--profile", "h200")
    assert out.returncode == 0, out.stderr
    assert "232,448" in out.stdout and "sm_90a" in out.stdout


def test_cli_unknown_profile_is_a_clear_error():
    out = _cli("--profile", "nope")
    assert out.returncode == 2 and "known profiles" in out.stderr and "gb10" in out.stderr


# ---------------------------------------------------------------- planner


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Tile:
    rows: int
    cols: int
    threads: int = 128

    def smem_bytes(self) -> int:
        return self.rows * self.cols * 2 * 2

    def name_expression(self, **kw) -> str:
        return f"k<{self.rows},{self.cols}>"


CANDIDATES = [_Tile(rows=r, cols=c) for r in (256, 128, 64, 32, 16) for c in (256, 128, 64)]


@pytest.mark.parametrize("spec", device.all_profiles(), ids=lambda s: s.key)
def test_planner_never_exceeds_the_limit(spec):
    plan = tiling.choose(CANDIDATES, spec, reason="largest tile that fits")
    assert plan.smem_bytes <= spec.smem_per_block_optin == plan.limit
    assert isinstance(plan.config, tiling.TileConfig)
    # the first that fits: every earlier candidate was too big
    for earlier in CANDIDATES[: CANDIDATES.index(plan.config)]:
        assert tiling.fits(earlier, spec) is not None
    assert "smem" in str(plan)


def test_planner_raises_when_nothing_fits():
    with pytest.raises(tiling.PlanError, match="no tile config fits"):
        tiling.choose([_Tile(rows=1024, cols=1024)], device.profile("t4"), reason="x")


def test_profile_override_is_validated():
    spec = dataclasses.replace(device.profile("gb10"), overrides={"op": {"rows": 256, "cols": 256}})
    with pytest.raises(tiling.PlanError, match="does not fit"):
        tiling.override(spec, "op", lambda d: _Tile(**d))
    ok = dataclasses.replace(spec, overrides={"op": {"rows": 64, "cols": 64}})
    plan = tiling.override(ok, "op", lambda d: _Tile(**d))
    assert plan.source == "profile override" and plan.config == _Tile(rows=64, cols=64)
    assert tiling.override(spec, "other", lambda d: _Tile(**d)) is None
    bad = dataclasses.replace(spec, overrides={"op": {"rows": 64, "colz": 64}})
    with pytest.raises(tiling.PlanError, match="invalid"):
        tiling.override(bad, "op", lambda d: _Tile(**d))


# ---------------------------------------------------------------- offline compilation


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90a"])
def test_offline_compile_reports_resources(arch):
    exprs = ["axpy<__nv_bfloat16, 4>", "axpy<__half, 8>"]
    res = compile.compile_offline(AXPY, exprs, arch)
    assert set(res) == set(exprs)
    for r in res.values():
        assert r.arch == arch and 0 < r.registers <= 255
        assert r.spills == 0 and r.stack_bytes == 0 and r.static_smem_bytes == 0


def test_offline_compile_in_threads_reports_what_one_program_does(monkeypatch):
    """compile_offline puts the expressions in programs of at most OFFLINE_CHUNK compiled `jobs` at a time in threads
    (NVRTC releases the GIL): the same resources, in the callers' order, as one program with them all; a bad
    program's error comes through."""
    exprs = ["axpy<__nv_bfloat16, 4>", "axpy<__half, 8>", "axpy<float, 4>", "axpy<__half, 4>", "axpy<float, 1>"]
    one = compile.compile_offline(AXPY, exprs, "sm_90a")
    monkeypatch.setattr(compile, "OFFLINE_CHUNK", 2)  # three programs
    for jobs in (1, 3):
        split = compile.compile_offline(AXPY, exprs, "sm_90a", jobs=jobs)
        assert list(split) == list(one) == exprs and split == one
    assert compile.OFFLINE_JOBS >= 1
    with pytest.raises(compile.CompileError):
        compile.compile_offline(AXPY, exprs + ["axpy<no_such_type, 3>"], "sm_90a", jobs=2)


def test_resident_grid_is_what_the_gpu_holds_at_once():
    """A persistent grid: at most the work, at most blocks_per_sm on every SM, at least one CTA."""
    k = object.__new__(compile.Kernel)  # no GPU: the occupancy query is stood in for
    k.spec = device.profile("h100")
    k.blocks_per_sm = lambda threads, smem: 2
    assert k.resident_grid(10_000, 256, 20_000) == 2 * 132
    assert k.resident_grid(100, 256, 20_000) == 100
    assert k.resident_grid(0, 256, 20_000) == 1


def test_offline_compile_reports_serialised_wgmma():
    """ptxas' C7515 note (wgmma serialised, each waiting for the last) reaches Resources, per kernel."""
    res = compile.compile_offline(AXPY.parent / "wgmma_pipeline.cu", ["pipeline<true>", "pipeline<false>"], "sm_90a")
    (note,) = res["pipeline<true>"].performance_warnings
    assert note.startswith("C7515: wgmma.mma_async instructions are serialized")
    assert res["pipeline<false>"].performance_warnings == ()


@pytest.mark.parametrize("spec", device.all_profiles(), ids=lambda s: s.key)
def test_engine_kernels_compile_for_every_profile(spec):
    from cukernels import bandwidth

    res = compile.compile_offline(bandwidth._SOURCE, [f"copy_vec16<{bandwidth._UNROLL}>"], spec.arch)
    res.update(compile.compile_offline(timing._SOURCE, ["block_stream"], spec.arch))
    assert len(res) == 2 and all(r.spills == 0 for r in res.values())


def test_offline_compile_reports_a_repeated_program():
    """The same program compiled twice for one architecture in a process has its ptxas report both times: NVRTC
    12.9+ with a driver present answers a repeat from the driver's cache without running ptxas (an empty log on the
    GPU machines' NVRTC 13.0) unless asked not to."""
    first = compile.compile_offline(timing._SOURCE, ["block_stream"], "sm_90a")
    again = compile.compile_offline(timing._SOURCE, ["block_stream"], "sm_90a")
    assert first == again and first["block_stream"].registers > 0


def test_instruction_counts_tell_refactors_from_changes(tmp_path):
    """PTX instruction counts per kernel: a source rewritten without changing what it computes compiles to the
    same counts (tools/ptx_diff.py's check), one that computes more does not; counts are per kernel instance."""
    same = tmp_path / "same.cu"
    same.write_text(AXPY.read_text().replace("const int j = base + i;", "const int j = i + base;"))
    more = tmp_path / "more.cu"
    more.write_text(AXPY.read_text().replace("* to_f(x[j])", "* to_f(x[j]) * a"))
    exprs = ["axpy<__nv_bfloat16, 4>", "axpy<__half, 8>"]
    base = compile.instruction_counts(AXPY, exprs, "sm_90a")
    assert base["axpy<__half, 8>"] != base["axpy<__nv_bfloat16, 4>"]
    assert all(c["ret"] == 1 and sum(c.values()) > 10 for c in base.values())
    assert compile.instruction_counts(same, exprs, "sm_90a") == base
    grown = compile.instruction_counts(more, exprs, "sm_90a")
    assert all(sum(grown[e].values()) > sum(base[e].values()) for e in exprs)


def test_sass_tool_builds_the_engines_cubin_and_maps_offsets(tmp_path, sass_tool):
    """compile.cubin: the cubin of one instance as the engine builds it (an ELF, per instance); tools/sass.py: with
    nvdisasm there (PATH, $NVDISASM or the nvidia-cuda-nvdisasm wheel) its listing has one instruction per 16-byte
    offset, the kernel's stores among them, and --at prints the instruction at a sanitizer-style offset."""
    sass = sass_tool
    a = compile.cubin(AXPY, "axpy<__half, 8>", "sm_90a")
    b = compile.cubin(AXPY, "axpy<__nv_bfloat16, 4>", "sm_90a")
    assert a[:4] == b[:4] == b"\x7fELF" and a != b
    assert sass.opcode("@!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR5], RZ") == "SYNCS"
    tool = sass.nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm here (pip install nvidia-cuda-nvdisasm): the listing is not checked")
    listing = sass.disassemble(a, tool)
    offsets = [off for off, _ in listing]
    assert offsets == list(range(0, 16 * len(listing), 16)) and len(listing) > 10
    assert any(sass.opcode(i).startswith("ST") for _, i in listing)
    assert sass.opcode(listing[-1][1]) in ("BRA", "EXIT", "NOP")
    saved = tmp_path / "k.cubin"
    saved.write_bytes(a)
    assert sass.main(["--cubin", str(saved), "--at", "0x0010"]) == 0


def test_offline_compile_error_carries_log_and_options(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("template <int N> __global__ void k(float* p) { p[0] = undeclared_name; }\n")
    with pytest.raises(compile.CompileError) as err:
        compile.compile_offline(bad, ["k<1>"], "sm_80")
    msg = str(err.value)
    assert "undeclared_name" in msg and "-arch=sm_80" in msg and "k<1>" in msg


def test_ptxas_parser():
    log = """ptxas info    : Compiling entry function '_Z1kv' for 'sm_90a'
ptxas info    : Function properties for _Z1kv
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 2048 bytes smem"""
    assert compile._parse_ptxas(log)["_Z1kv"] == {"stack": 8, "spill_st": 4, "spill_ld": 12, "regs": 96, "smem": 2048}


# ---------------------------------------------------------------- dtypes and checks


def test_bf16_round_trip_and_rounding():
    x = np.array([1.0, -2.5, 3.14159, 1e-3, np.inf, 65504.0], dtype=np.float32)
    bits = dtypes.to_bf16(x)
    assert bits.dtype == np.uint16
    back = dtypes.bf16_to_float32(bits)
    assert np.all(np.abs(back[np.isfinite(x)] - x[np.isfinite(x)]) <= np.abs(x[np.isfinite(x)]) * 2**-8)
    assert np.isinf(back[4])
    # round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7
    assert dtypes.bf16_to_float32(dtypes.to_bf16(np.float32([1 + 2**-8])))[0] == 1.0
    assert np.isnan(dtypes.bf16_to_float32(dtypes.to_bf16(np.float32([np.nan])))[0])


def test_dtype_names():
    assert dtypes.ctype(np.uint16) == "__nv_bfloat16" and dtypes.ctype(np.float16) == "__half"
    assert dtypes.from_name("bf16") == np.uint16
    with pytest.raises(TypeError, match="unsupported"):
        dtypes.ctype(np.int8)


def test_poison_marks_every_element():
    a = np.zeros(5, np.float32)
    b = np.zeros(5, np.uint16)
    c = np.zeros(5, np.int32)
    checks.poison(a), checks.poison(b), checks.poison(c)
    assert np.isnan(a).all() and np.isnan(dtypes.bf16_to_float32(b)).all() and checks.count_poison(c) == 5


def test_compare_detects_unwritten_and_wrong_values():
    ref = np.linspace(-1, 1, 100)
    tol = checks.TOLERANCES["fp16"]
    assert checks.compare(ref.astype(np.float16), ref, tol=tol).passed
    unwritten = ref.astype(np.float32)
    unwritten[7] = np.nan
    r = checks.compare(unwritten, ref, tol=tol)
    assert not r.passed and r.nonfinite == 1
    wrong = ref.copy()
    wrong[3] += 0.1
    r = checks.compare(wrong, ref, tol=tol)
    assert not r.passed and "(3,)" in r.reason
    with pytest.raises(AssertionError):
        r.raise_if_failed()


def test_compare_against_naive_low_precision():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000)
    naive = dtypes.bf16_to_float32(dtypes.to_bf16(ref))  # rounding alone
    tol = checks.TOLERANCES["bf16"]
    assert checks.compare(naive, ref, tol=tol, naive=naive).passed
    assert not checks.compare(naive + 0.2, ref, tol=tol, naive=naive).passed


def test_compare_treats_equal_infinities_as_exact():
    ref = np.array([-np.inf, 0.5])
    assert checks.compare(np.array([-np.inf, 0.5], np.float32), ref, tol=checks.TOLERANCES["fp32"]).passed
    assert not checks.compare(np.array([0.0, 0.5], np.float32), ref, tol=checks.TOLERANCES["fp32"]).passed


# ---------------------------------------------------------------- timing statistics and reports


def test_timing_summary_statistics():
    samples = [1.0] * 18 + [1.1, 5.0]  # outliers move neither the median nor the p20-p80 spread
    t = timing.summarize(samples)
    assert t.median_ms == 1.0 and t.min_ms == 1.0 and t.samples == 20
    assert t.p20_ms == 1.0 and t.p80_ms == pytest.approx(1.0)
    assert t.rel_noise < 0.01
    noisy = timing.summarize(np.linspace(1.0, 2.0, 11))
    assert noisy.rel_noise == pytest.approx((noisy.p80_ms - noisy.p20_ms) / (2 * noisy.median_ms))
    with pytest.raises(ValueError):
        timing.summarize([])


def test_pooled_rounds_state_the_spread_between_rounds():
    steady = [timing.summarize([1.0, 1.0, 1.01, 0.99, 1.0], clocks={"held": False, "sm_clock_min_mhz": 1900,
                                                                     "sm_clock_max_mhz": 1980,
                                                                     "throttle_reasons": []})]
    assert timing.pool(steady) is steady[0]  # one round: as it was
    shifted = steady + [timing.summarize([1.3, 1.3, 1.31, 1.29, 1.3],
                                         clocks={"held": False, "sm_clock_min_mhz": 1700, "sm_clock_max_mhz": 1980,
                                                 "throttle_reasons": ["sw_power_cap"], "throttled": True}),
                        timing.summarize([1.0, 1.01, 1.0, 1.0, 0.99], clocks={"held": False})]
    t = timing.pool(shifted)
    assert t.samples == 15 and t.median_ms == 1.0 and t.round_medians_ms == (1.0, 1.3, 1.0)
    assert t.round_noise == pytest.approx(0.15)  # half the range of the round medians over the median
    assert t.rel_noise == pytest.approx(0.15) and t.rel_noise > (t.p80_ms - t.p20_ms) / (2 * t.median_ms) - 1e-12
    assert t.clocks["held"] is False and t.throttled and t.clocks["throttle_reasons"] == ["sw_power_cap"]
    assert (t.clocks["sm_clock_min_mhz"], t.clocks["sm_clock_max_mhz"]) == (1700, 1980)
    # rounds that agree: the samples' own spread is the larger and stays the stated noise
    wide = [timing.summarize(np.linspace(1.0, 2.0, 11)), timing.summarize(np.linspace(1.0, 2.0, 11) + 0.01)]
    assert timing.pool(wide).rel_noise > timing.pool(wide).round_noise
    with pytest.raises(ValueError):
        timing.pool([])
    # turns of equal budget (by_round): each round one vote, however many samples it took before settling; a noisy
    # slow round that ran its whole budget no longer sets the median
    turns = [timing.summarize([1.0] * 5), timing.summarize([1.1] * 40), timing.summarize([1.0] * 5),
             timing.summarize([1.02] * 5), timing.summarize([0.99] * 5)]
    assert timing.pool(turns).median_ms == pytest.approx(1.1)
    by_round = timing.pool(turns, by_round=True)
    assert by_round.median_ms == pytest.approx(1.0) and by_round.samples == 60
    assert by_round.round_noise == pytest.approx(0.055)
    assert by_round.p20_ms <= by_round.median_ms <= by_round.p80_ms
    # the quantiles vote by round as well: pooled by sample, one long round's 100 samples at 2.0 would put p20 above
    # the by-round median of 1.1
    skewed = [timing.summarize([1.0]), timing.summarize([2.0] * 100), timing.summarize([1.1])]
    assert timing.pool(skewed).p20_ms == pytest.approx(2.0)
    v = timing.pool(skewed, by_round=True)
    assert v.median_ms == pytest.approx(1.1) and (v.p20_ms, v.p80_ms) == (pytest.approx(1.0), pytest.approx(2.0))


def _result(**kw):
    base = dict(case="c", impl="ours", params={}, tags=[], baseline=False, status="ok", median_ms=1.0, p20_ms=0.99,
                p80_ms=1.01, rel_noise=0.01, samples=10, tflops=300.0, gbs=None, pct_peak=30.0,
                checks=[{"max_abs": 1e-3, "max_rel": 1e-2, "passed": True}], peak_memory_bytes=2**20)
    base.update(kw)
    return bench.Result(**base)


def test_rank_and_table():
    rows = [_result(), _result(impl="torch-flash", baseline=True, median_ms=1.5),
            _result(impl="naive", baseline=True, median_ms=4.0),
            _result(impl="broken", status="failed-check", reason="out: FAIL", median_ms=None)]
    bench._rank(rows)
    assert rows[0].speedup_vs_best_baseline == pytest.approx(1.5) and rows[0].best_baseline == "torch-flash"
    assert rows[3].speedup_vs_best_baseline is None
    text = report.table(rows)
    assert "| c " in text and "1.50 (torch-flash)" in text and "failed-check" in text
    doc = report.to_json(rows, {"gpu": None})
    assert '"torch-flash"' in doc


@dataclasses.dataclass(frozen=True, kw_only=True)
class _HopperTile(_Tile):
    needs_arch: str = "sm_90a"


def test_arch_specific_configs_fit_their_arch_only():
    tile = _HopperTile(rows=64, cols=64)
    assert tiling.fits(tile, device.profile("h200")) is None
    assert "needs sm_90a" in tiling.fits(tile, device.profile("a100_80gb"))
    plan = tiling.choose([tile, _Tile(rows=64, cols=64)], device.profile("gb10"), reason="r")
    assert plan.config == _Tile(rows=64, cols=64) and "needs sm_90a" in plan.reason


class _FakeFrame:
    """A frame's workspace and capture status, for launch.KeptWorkspace without a GPU."""

    def __init__(self):
        self.allocated = 0
        self.capturing_streams = set()

    def workspace(self, stream, nbytes):
        self.allocated += 1
        owner = object()
        return owner, 0x1000 * self.allocated

    def capturing(self, stream):
        return stream in self.capturing_streams


def test_kept_workspace_reused_only_on_its_stream_and_thread_and_never_under_capture():
    import threading

    from cukernels import launch

    f, ws = _FakeFrame(), launch.KeptWorkspace(4096)
    first = ws.take(f, 7)
    assert ws.take(f, 7) == first and f.allocated == 1  # same stream, same thread: kept
    other = ws.take(f, 8)  # another stream: fresh, and kept for that stream from now on
    assert other != first and f.allocated == 2 and ws.take(f, 8) == other
    got = []
    t = threading.Thread(target=lambda: got.append(ws.take(f, 8)))
    t.start()
    t.join()
    assert got[0] != other and f.allocated == 3  # another thread on the same stream: fresh
    f.capturing_streams.add(9)
    ws.take(f, 9)
    kept = ws.kept
    captured = ws.take(f, 9)
    assert f.allocated == 5 and ws.kept == kept and captured[1] != kept[2]  # under capture: fresh, never kept
    assert ws.take_new(f, 9)[2:] == (True, True) and ws.take_new(f, 10)[2:] == (True, False)  # (new, captured)
    assert ws.take_new(f, 10)[2:] == (False, False)  # kept
    big, fb = launch.KeptWorkspace(launch.KeptWorkspace.KEEP_BYTES + 1), _FakeFrame()
    big.take(fb, 7)
    big.take(fb, 7)
    assert fb.allocated == 2 and big.kept is None  # too large to keep


def test_timer_refuses_an_unknown_sample_order(monkeypatch):
    """The sample-order knob is checked before anything touches a device: a typo is an error naming it."""
    monkeypatch.setattr(timing, "SAMPLE_ORDER", "hold-then-flush")
    with pytest.raises(ValueError, match="SAMPLE_ORDER = 'hold-then-flush'.*flush-sync, flush-hold, hold-flush"):
        timing.benchmark(lambda: None)
