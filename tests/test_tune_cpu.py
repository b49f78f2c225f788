"""The tuned-config cache and the tuning loop without a GPU: keys, invalidation on a new kernel revision, a corrupt
or unreadable file (a warning and a re-tune, never a crash), atomic writes, the planners' lookup (live devices only),
and the candidate lists (the heuristic's choice among them, every one fitting the profile)."""
from __future__ import annotations

import dataclasses
import json
import os
import types

import pytest

from attention import bwd_configs, configs
from cukernels import checks, device, tiling, tune
from moe import gemm_configs

PROFILES = ("h100_sxm", "h200", "a100_80gb", "a10", "gb10", "rtx4090", "l4")


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("CUKERNELS_TUNE_DIR", raising=False)
    monkeypatch.delenv("CUKERNELS_TUNED", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(tune, "driver_version", lambda: "570.86.15")
    tune._LIVE.clear()
    yield
    tune._LIVE.clear()


def _fwd(**kw) -> configs.FwdProblem:
    base = dict(batch=16, seq_q=2048, seq_kv=2048, heads=16, kv_heads=16, head_dim=64)
    return configs.FwdProblem(**{**base, **kw})


def _entry(config, ms=1.0):
    return {"config": tune.encode(config), "tuned": str(config), "ms": ms, "heuristic": "h", "heuristic_ms": 2 * ms,
            "speedup": 2.0, "candidates": 3, "date": "2026-01-01"}


# ---------------------------------------------------------------- keys and files


def test_cache_lives_under_xdg_cache_home_and_is_keyed_by_gpu_and_driver(tmp_path, monkeypatch):
    a = tune.TuneCache("NVIDIA H100 80GB HBM3", "570.86.15")
    assert a.path.parent == tmp_path / "xdg" / "cukernels" / "tune"
    assert tune.TuneCache("NVIDIA H100 80GB HBM3", "575.1").path != a.path
    assert tune.TuneCache("NVIDIA H200", "570.86.15").path != a.path
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tune.cache_dir() == tune.Path.home() / ".cache" / "cukernels" / "tune"


def test_key_is_op_and_every_field_of_the_problem():
    p = _fwd()
    assert tune.TuneCache.key("attention.fwd", p) == tune.TuneCache.key("attention.fwd", _fwd())
    assert tune.TuneCache.key("attention.fwd", p) != tune.TuneCache.key("attention.bwd", p)
    for change in (dict(batch=8), dict(causal=True), dict(dtype="fp16"), dict(window=(128, 0))):
        assert tune.signature(_fwd(**change)) != tune.signature(p), change


def test_revision_hashes_the_kernel_sources_text(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k() {}")
    first = tune.revision([src])
    tune._revision.cache_clear()
    assert tune.revision([src]) == first
    src.write_text("__global__ void k() { /* changed */ }")
    tune._revision.cache_clear()
    assert tune.revision([src]) != first
    for mod in (configs, bwd_configs, gemm_configs):
        files = mod.tune_files()
        assert all(f.exists() for f in files) and any(f.suffix == ".cu" for f in files)
        assert any(f.name.endswith("configs.py") for f in files)


def test_put_then_get_round_trips_and_a_new_revision_invalidates():
    cache = tune.TuneCache("GPU", "1.0")
    cfg = configs.FwdConfig(head_dim=64, block_m=64, block_n=64, warps=4)
    assert cache.status("attention.fwd", _fwd(), "rev1") == "miss"
    assert cache.put("attention.fwd", _fwd(), "rev1", _entry(cfg))
    again = tune.TuneCache("GPU", "1.0")  # a fresh process reads the file
    entry = again.get("attention.fwd", _fwd(), "rev1")
    assert tune.decode(entry["config"], (configs.FwdConfig,)) == cfg
    assert again.status("attention.fwd", _fwd(), "rev2") == "stale"
    assert again.get("attention.fwd", _fwd(), "rev2") is None
    assert again.get("attention.fwd", _fwd(batch=1), "rev1") is None


def test_put_keeps_entries_another_process_wrote():
    a, b = tune.TuneCache("GPU", "1.0"), tune.TuneCache("GPU", "1.0")
    cfg = configs.FwdConfig(head_dim=64, block_m=64, block_n=64, warps=4)
    a.entries, b.entries  # both loaded before either writes
    a.put("attention.fwd", _fwd(batch=1), "r", _entry(cfg))
    b.put("attention.fwd", _fwd(batch=2), "r", _entry(cfg))
    doc = json.loads(a.path.read_text())
    assert len(doc["entries"]) == 2 and doc["gpu"] == "GPU" and doc["driver"] == "1.0"


def test_write_is_atomic_temp_file_then_replace(monkeypatch):
    cache = tune.TuneCache("GPU", "1.0")
    cfg = configs.FwdConfig(head_dim=64, block_m=64, block_n=64, warps=4)
    cache.put("attention.fwd", _fwd(batch=1), "r", _entry(cfg))
    before = cache.path.read_text()
    calls = []
    real = os.replace

    def replace(src, dst):
        calls.append((str(src), str(dst)))
        assert os.path.dirname(src) == os.path.dirname(dst) and json.loads(open(src).read())["entries"]
        raise OSError("disk full")  # the write fails at the last step: the old file must be intact

    monkeypatch.setattr(os, "replace", replace)
    with pytest.warns(tune.TuneCacheWarning, match="could not be written"):
        assert not cache.put("attention.fwd", _fwd(batch=2), "r", _entry(cfg))
    assert calls and calls[0][1] == str(cache.path)
    assert cache.path.read_text() == before  # untouched
    assert not [p for p in cache.path.parent.iterdir() if p.suffix == ".tmp"]  # no temp file left behind
    monkeypatch.setattr(os, "replace", real)
    assert cache.put("attention.fwd", _fwd(batch=2), "r", _entry(cfg))


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 1, "entries": 3}',
                                     '{"format": 99, "gpu": "GPU", "driver": "1.0", "entries": {}}',
                                     '{"format": 1, "gpu": "other", "driver": "1.0", "entries": {}}'])
def test_corrupt_file_warns_and_reads_as_empty(content):
    cache = tune.TuneCache("GPU", "1.0")
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text(content)
    with pytest.warns(tune.TuneCacheWarning, match="corrupt"):
        assert cache.status("attention.fwd", _fwd(), "r") == "miss"


def test_unreadable_file_warns(monkeypatch):
    cache = tune.TuneCache("GPU", "1.0")
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text("{}")
    real = type(cache.path).read_text

    def read_text(self, *a, **kw):
        if self == cache.path:
            raise PermissionError("denied")
        return real(self, *a, **kw)

    monkeypatch.setattr(type(cache.path), "read_text", read_text)
    with pytest.warns(tune.TuneCacheWarning, match="unreadable"):
        assert cache.get("attention.fwd", _fwd(), "r") is None


# ---------------------------------------------------------------- the planners' lookup


def _live(name="h100_sxm"):
    return dataclasses.replace(device.profile(name), source="live")


def test_planner_uses_a_tuned_entry_on_a_live_device_only(monkeypatch):
    spec, problem = _live(), _fwd()
    heuristic = configs.plan_forward(problem, spec)
    other = next(c for c in configs.candidates(problem, spec) if c != heuristic.config)
    tune.live_cache(spec).put(configs.TUNE_OP, problem, tune.revision(configs.tune_files()), _entry(other))
    plan = configs.plan_forward(problem, spec)
    assert plan.config == other and plan.source == tune.SOURCE and "tuned" in plan.reason
    assert configs.plan_forward(problem, device.profile("h100_sxm")).config == heuristic.config  # a profile: never
    assert tune.heuristic(configs.plan_forward, problem, spec).config == heuristic.config
    assert configs.candidates(problem, spec)[0] == heuristic.config
    monkeypatch.setenv("CUKERNELS_TUNED", "0")
    assert configs.plan_forward(problem, spec).config == heuristic.config
    monkeypatch.delenv("CUKERNELS_TUNED")
    assert configs.plan_forward(_fwd(batch=3), spec).source != tune.SOURCE  # another problem: no entry


def test_planner_ignores_a_stale_entry_and_a_bad_one():
    spec, problem = _live(), _fwd()
    heuristic = configs.plan_forward(problem, spec).config
    other = next(c for c in configs.candidates(problem, spec) if c != heuristic)
    cache = tune.live_cache(spec)
    cache.put(configs.TUNE_OP, problem, "an-older-revision", _entry(other))
    assert configs.plan_forward(problem, spec).config == heuristic
    cache.put(configs.TUNE_OP, problem, tune.revision(configs.tune_files()),
              {**_entry(other), "config": {"type": "os.system", "fields": {}}})
    with pytest.warns(tune.TuneCacheWarning, match="unusable"):
        assert configs.plan_forward(problem, spec).config == heuristic


def test_gemm_and_backward_planners_read_the_cache():
    spec = _live()
    g = gemm_configs.GemmProblem(rows=8192, n=11008, k=4096, experts=32, dtype="bf16")
    small = gemm_configs.candidates(g, spec)[-1]
    tune.live_cache(spec).put(gemm_configs.OP, g, tune.revision(gemm_configs.tune_files()), _entry(small))
    assert gemm_configs.plan(g, spec).config == small
    p = _fwd(head_dim=128)
    last = bwd_configs.candidates(p, spec)[-1]
    tune.live_cache(spec).put(bwd_configs.OP, p, tune.revision(bwd_configs.tune_files()), _entry(last))
    assert bwd_configs.plan_backward(p, spec).config == last
    # tuned with dQ atomics: a deterministic backward (its own dQ kernel, never timed) keeps the heuristic's tiles
    plan = bwd_configs.plan_backward(p, spec, deterministic=True)
    assert plan.source != tune.SOURCE and plan.config == tune.heuristic(bwd_configs.plan_backward, p, spec).config


# ---------------------------------------------------------------- candidates


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("head_dim", configs.HEAD_DIMS)
def test_attention_candidates_hold_the_heuristic_and_fit(profile, head_dim):
    spec = device.profile(profile)
    for problem in (_fwd(head_dim=head_dim), _fwd(head_dim=head_dim, batch=1, heads=2, causal=True)):
        for planner, mod in ((configs.plan_forward, configs), (bwd_configs.plan_backward, bwd_configs)):
            cands = mod.candidates(problem, spec)
            assert cands[0] == planner(problem, spec).config
            assert len(set(cands)) == len(cands)
            for c in cands:
                assert tiling.fits(c, spec) is None, (profile, c)
    if spec.arch == "sm_90a":
        assert len(configs.candidates(_fwd(head_dim=head_dim), spec)) > 1


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("shape", [(8192, 11008, 4096, 32, None), (131072, 22016, 4096, 32, "swiglu"),
                                   (4096, 32, 4096, 1, None), (1000, 512, 256, 8, "gelu")])
def test_gemm_candidates_hold_the_heuristic_and_fit(profile, shape):
    spec = device.profile(profile)
    rows, n, k, e, epi = shape
    problem = gemm_configs.GemmProblem(rows=rows, n=n, k=k, experts=e, dtype="bf16", epilogue=epi)
    cands = gemm_configs.candidates(problem, spec)
    assert cands[0] == gemm_configs.plan(problem, spec).config
    assert len(set(cands)) == len(cands)
    for c in cands:
        assert tiling.fits(c, spec) is None and epi in c.epilogues()
        assert n >= 256 or c.block_n < 256


def test_gemm_candidates_offer_tma_splits(monkeypatch):
    from cukernels import tma

    monkeypatch.setattr(tma, "available", lambda: None)
    spec = device.profile("h100_sxm")
    problem = gemm_configs.GemmProblem(rows=128, n=4096, k=11008, experts=1, dtype="bf16")
    cands = gemm_configs.candidates(problem, spec)
    assert cands[0] == gemm_configs.plan(problem, spec).config and len(set(cands)) == len(cands)
    assert sum(c.kind == "tma" and c.split_k > 1 for c in cands) >= 2


def test_pick_keeps_the_heuristic_and_the_preference_order():
    assert tune.pick([1, 2, 3, 4], 3, None) == [3, 1, 2, 4]
    assert tune.pick([1, 2, 3, 4], 3, 2) == [3, 1]
    assert tune.pick([1, 2, 3, 4], 1, 1) == [1]


# ---------------------------------------------------------------- the loop (GPU parts stubbed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Cfg:
    block_m: int
    threads: int = 128

    def smem_bytes(self) -> int:
        return 1024 * self.block_m


@pytest.fixture
def stub_gpu(monkeypatch):
    monkeypatch.setattr(checks, "poison_pool", lambda nbytes: None)
    monkeypatch.setattr(checks, "stop_poisoning", lambda: None)
    timed = []

    def time_one(fn, *, budget_ms):
        out = fn()
        timed.append(out)
        return types.SimpleNamespace(median_ms=float(out["ms"]), rel_noise=0.01, samples=10)

    monkeypatch.setattr(tune, "_time_one", time_one)
    return timed


def _op():
    def check(case, out, ref):
        ok = out["ok"]
        return [checks.CheckResult(name="o", max_abs=0, max_rel=0, mean_abs=0, rel_l2=0, nonfinite=0, passed=ok,
                                   reason="fine" if ok else "wrong")]
    return types.SimpleNamespace(make_inputs=lambda case, seed: {}, reference=lambda case, inputs: None,
                                 check=check, poison_bytes=lambda case: 0)


def _tunable(tmp_path, ms: dict, bad=(), rev_text="v1"):
    src = tmp_path / "kernel.cu"
    src.write_text(rev_text)
    tune._revision.cache_clear()
    cands = [_Cfg(block_m=m) for m in ms]
    heuristic = tiling.Plan(config=cands[0], smem_bytes=0, limit=1, reason="first")
    run = lambda cfg, inputs: (lambda: {"ms": ms[cfg.block_m], "ok": cfg.block_m not in bad})  # noqa: E731
    return tune.Tunable(op="test.op", label="kernel", problem=_fwd(), candidates=cands, heuristic=heuristic,
                        files=[src], run=run)


def test_tune_keeps_the_fastest_passing_then_reads_the_cache(tmp_path, stub_gpu):
    case = types.SimpleNamespace(name="case1")
    cache = tune.TuneCache("GPU", "1.0")
    t = _tunable(tmp_path, {64: 2.0, 128: 0.5, 32: 1.0}, bad={128})  # 128 is fastest but wrong
    [r] = tune.tune_case(_op(), case, [t], cache, progress=None)
    assert r.status == "tuned" and r.tuned == str(_Cfg(block_m=32)) and r.heuristic_ms == 2.0
    assert r.speedup == pytest.approx(2.0) and r.candidates == 3
    assert [tr.status for tr in r.trials] == ["ok", "failed-check", "ok"] and r.trials[2].best
    n = len(stub_gpu)
    [again] = tune.tune_case(_op(), case, [t], tune.TuneCache("GPU", "1.0"), progress=None)
    assert again.status == "cached" and again.tuned == r.tuned and again.speedup == pytest.approx(2.0)
    assert len(stub_gpu) == n  # nothing timed
    assert "cached" in tune.tune_table([again]) and "2.000x" in tune.tune_table([again])
    [swept] = tune.tune_case(_op(), case, [t], cache, sweep=True, progress=None)
    assert swept.status == "swept" and len(stub_gpu) > n
    table = tune.sweep_table([swept])
    assert "auto" in table and "explicit" in table and "✓" in table and "failed-check" in table


def test_new_kernel_revision_re_tunes(tmp_path, stub_gpu):
    case = types.SimpleNamespace(name="case1")
    cache = tune.TuneCache("GPU", "1.0")
    tune.tune_case(_op(), case, [_tunable(tmp_path, {64: 2.0, 32: 1.0})], cache, progress=None)
    [r] = tune.tune_case(_op(), case, [_tunable(tmp_path, {64: 1.0, 32: 2.0}, rev_text="v2")], cache,
                         progress=None)
    assert r.status == "re-tuned (stale)" and r.tuned == str(_Cfg(block_m=64))


def test_corrupt_cache_warns_and_re_tunes_without_crashing(tmp_path, stub_gpu):
    case = types.SimpleNamespace(name="case1")
    cache = tune.TuneCache("GPU", "1.0")
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text('{"format": 1, "entries": {"test.op|trunc')
    with pytest.warns(tune.TuneCacheWarning, match="corrupt"):
        [r] = tune.tune_case(_op(), case, [_tunable(tmp_path, {64: 2.0, 32: 1.0})], cache, progress=None)
    assert r.status == "tuned"
    assert json.loads(cache.path.read_text())["entries"]  # rewritten whole


def test_no_passing_candidate_is_a_failure_and_nothing_is_stored(tmp_path, stub_gpu):
    cache = tune.TuneCache("GPU", "1.0")
    [r] = tune.tune_case(_op(), types.SimpleNamespace(name="c"), [_tunable(tmp_path, {64: 1.0}, bad={64})], cache,
                         progress=None)
    assert r.status == "failed" and not cache.path.exists()
    [n] = tune.tune_case(_op(), types.SimpleNamespace(name="c"), [tune.NotTunable(label="route", reason="why")],
                         cache, progress=None)
    assert n.status == "not tunable" and "why" in tune.tune_table([n])


def test_json_and_plot_views(tmp_path, stub_gpu):
    [r] = tune.tune_case(_op(), types.SimpleNamespace(name="c"), [_tunable(tmp_path, {64: 2.0, 32: 1.0})],
                         tune.TuneCache("GPU", "1.0"), progress=None)
    tune.to_json([r], {"gpu": None}, tmp_path / "out" / "t.json", mode="tune")
    doc = json.loads((tmp_path / "out" / "t.json").read_text())
    assert doc["results"][0]["speedup"] == pytest.approx(2.0) and doc["results"][0]["heuristic_ms"] == 2.0
    pytest.importorskip("matplotlib")
    assert all(p.exists() for p in tune.plots([r], tmp_path / "plots"))


def test_bench_flags_need_a_gpu_and_say_so(capsys):
    from attention import bench as attention_bench
    from moe import bench as moe_bench

    if device.gpu_available():
        pytest.skip("a GPU is visible: the flags would tune")
    for main in (attention_bench.main, moe_bench.main):
        for flag in ("--tune", "--sweep"):
            assert main(["--suite", "seed004", flag]) == 0
            assert "No CUDA GPU" in capsys.readouterr().err


def test_a_repeated_key_in_one_run_is_same_key_not_cached(tmp_path, stub_gpu):
    cache, stored = tune.TuneCache("GPU", "1.0"), {}
    t = _tunable(tmp_path, {64: 2.0, 32: 1.0})
    [first] = tune.tune_case(_op(), types.SimpleNamespace(name="E32_equal"), [t], cache, stored=stored,
                             progress=None)
    n = len(stub_gpu)
    [second] = tune.tune_case(_op(), types.SimpleNamespace(name="E32_random"), [t], cache, stored=stored,
                              progress=None)
    assert first.status == "tuned" and second.status == "same key" and len(stub_gpu) == n
    assert "E32_equal / kernel" in second.reason and second.tuned_ms is None
    assert "same key" in tune.tune_table([first, second])
    [swept] = tune.tune_case(_op(), types.SimpleNamespace(name="E32_random"), [t], cache, sweep=True,
                             stored=stored, progress=None)
    assert swept.status == "swept" and "E32_equal" in swept.reason and len(stub_gpu) > n
    assert list(stored.values()) == ["E32_random / kernel"]  # the entry is now the sweep's
    [cached] = tune.tune_case(_op(), types.SimpleNamespace(name="E32_random"), [t], cache, progress=None)
    assert cached.status == "cached"  # another run: read from the cache


def test_a_config_that_fails_its_check_shows_in_the_table(tmp_path, stub_gpu):
    [r] = tune.tune_case(_op(), types.SimpleNamespace(name="c"), [_tunable(tmp_path, {64: 2.0, 32: 1.0}, bad={32})],
                         tune.TuneCache("GPU", "1.0"), progress=None)
    assert r.status == "tuned" and tune.failed_checks(r) == 1 and "failed the check" in r.reason
    assert "tuned (1 failed check)" in tune.tune_table([r])


def test_run_cli_says_same_key_fails_on_a_failed_check_and_forgets_plans(tmp_path, stub_gpu, monkeypatch, capsys):
    import functools

    from cukernels import cli
    from moe import bench as moe_bench
    from moe import launch

    spec = _live()
    monkeypatch.setattr(tune._device, "gpu_available", lambda: True)
    monkeypatch.setattr(tune._device, "current", lambda: spec)
    memo = functools.lru_cache(maxsize=None)(lambda *a: a)
    monkeypatch.setattr(launch, "_plan", memo)
    ob = dataclasses.replace(moe_bench.OP_BENCH, op=lambda args: _op())
    argv = ["--suite", "gemm", "--case", "E32", "--tune"]
    good = _tunable(tmp_path, {64: 2.0, 32: 1.0})
    memo(1)
    assert tune.run_cli(ob, argv, lambda case, spec, args: [good]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert memo.cache_info().currsize == 0  # moe.launch's memoised plans would keep the old choice
    assert "same key" in out and "gemm_8192x11008x4096_E32_equal / kernel" in out
    bad = _tunable(tmp_path, {64: 2.0, 32: 1.0}, bad={32})
    assert tune.run_cli(ob, [*argv, "--retune"], lambda case, spec, args: [bad]) == cli.EXIT_FAILED
    assert "1 failed check" in capsys.readouterr().out


def test_environment_records_the_tuned_cache_in_use(monkeypatch):
    from cukernels import environment

    spec = _live()
    assert environment.tuning(None) == {"tune_cache": None, "tuned": "1"}
    assert environment.tuning(spec)["tune_cache"] is None  # no file yet
    cache = tune.live_cache(spec)
    cache.put("test.op", _fwd(), "r", {})
    monkeypatch.setenv("CUKERNELS_TUNED", "0")
    assert environment.tuning(spec) == {"tune_cache": str(cache.path), "tuned": "0"}
    monkeypatch.setattr(tune, "driver_version", lambda: 1 / 0)
    assert environment.tuning(spec)["tune_cache"] is None  # never fails
    env = environment.collect()
    assert "tune_cache" in env and env["tuned"] == "0"
    assert env["l2_flush"] == "read of 2 x L2"  # the held timer's flush, recorded with every result
