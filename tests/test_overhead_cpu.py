"""What a user gets, with no GPU: the as-called time and host µs per call (timing.py) on a faked device, their
place in results, tables and JSON, seed 004's launch-overhead line, and the ``overhead`` suites."""
import json
import types

import pytest

from cukernels import bench, checks, cli, compare, device, report, score, timing

HOLD_TIMEOUT_S = timing._HOLD_TIMEOUT_NS / 1e9


@pytest.fixture
def gpu(monkeypatch):
    """A faked device and clock: calls and synchronisations advance the clock, the holding kernel is a flag
    (``held``) and an entry in the log, ``state[1]`` its timed-out flag."""
    import cupy

    fake = types.SimpleNamespace(log=[], now=0.0, state=[0, 0], held=False, sync_s=0.0)

    def synchronize():
        fake.log.append("sync")
        fake.now += fake.sync_s

    def hold(dev_id):
        fake.log.append("hold")
        fake.held = True

        def release():
            fake.log.append("release")
            fake.held = False
        return release

    monkeypatch.setattr(cupy.cuda, "Device", lambda: types.SimpleNamespace(id=0, synchronize=synchronize))
    monkeypatch.setattr(timing, "_hold_state", lambda dev_id: (0, fake.state))
    monkeypatch.setattr(timing, "_hold", hold)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: fake.now))
    return fake


def _call(gpu, host_s, *, syncs=False):
    """A call that costs the host ``host_s``; one that ``syncs`` waits for the device, which behind a hold means
    until the holding kernel times out."""
    def fn():
        gpu.log.append("call")
        gpu.now += host_s
        if syncs and gpu.held:
            gpu.state[1] = 1
            gpu.now += HOLD_TIMEOUT_S
    return fn


def test_host_us_times_the_enqueue_behind_the_hold(gpu):
    us, held = timing.host_us(_call(gpu, 40e-6), per_call_ms=0.05)
    assert held and us == pytest.approx(40.0)
    probe = ["hold", "call", "release", "sync"]
    burst = ["hold"] + ["call"] * timing.HOST_CALLS + ["release", "sync"]
    assert gpu.log == probe + burst * 5  # released and synchronised after each burst, never during it


def test_host_us_shortens_the_burst_of_a_slow_call(gpu):
    timing.host_us(_call(gpu, 1e-3), per_call_ms=1.0, repeats=1)  # 5 ms: a quarter of the hold's timeout
    assert gpu.log.count("call") == 1 + 5  # the probe, then the burst
    gpu.log.clear()
    timing.host_us(_call(gpu, 30e-3), per_call_ms=30.0, repeats=1)
    assert gpu.log.count("call") == 1 + 1


def test_host_us_bursts_a_long_device_call_by_its_host_time(gpu):
    """A call whose device work takes 30 ms (its as-called time) but whose host part takes 40 us is timed in
    bursts of HOST_CALLS like a small call, not one call per burst (the probe call bounds its host time)."""
    us, held = timing.host_us(_call(gpu, 40e-6), per_call_ms=30.0, repeats=1)
    assert held and us == pytest.approx(40.0)
    assert gpu.log.count("call") == 1 + timing.HOST_CALLS


def test_host_us_of_a_call_that_waits_for_the_device_is_taken_unheld_and_says_so(gpu):
    us, held = timing.host_us(_call(gpu, 500e-6, syncs=True), per_call_ms=0.6)
    assert held is False and us == pytest.approx(500.0)  # not the stalled probe behind the hold
    assert gpu.log.count("hold") == 1 and gpu.log.count("sync") == 6  # the probe timed out, five bursts unheld


def test_as_called_is_back_to_back_calls_with_one_synchronisation(gpu):
    gpu.sync_s = 100e-6  # the device finishing after the host's last call
    ms = timing.as_called(_call(gpu, 30e-6))
    # sized by one call (0.13 ms with its sync): 20 calls a repeat; (20 * 30 + 100) us / 20 calls
    assert ms == pytest.approx(0.035)
    assert gpu.log == ["call", "sync"] + (["call"] * 20 + ["sync"]) * 5 and "hold" not in gpu.log
    gpu.log.clear()
    assert timing.as_called(_call(gpu, 4e-3), repeats=1) == pytest.approx((3 * 4 + 0.1) / 3)  # 3 calls >= 10 ms
    assert gpu.log.count("call") == 1 + 3


def _result(**kw):
    base = dict(case="c", impl="ours", params={}, tags=["overhead"], baseline=False, status="ok", median_ms=0.01,
                rel_noise=0.01, samples=10, as_called_ms=0.03, host_us=20.0, host_us_held=True)
    return bench.Result(**{**base, **kw})


def _run_two(monkeypatch, ours_fn, torch_fn, *, benchmark, can_hold):
    """bench.run of one case, ours and a torch baseline, with the given timer and hold probe, on the faked device
    (checks, poisoning and memory stubbed)."""
    monkeypatch.setattr(bench._device, "current", lambda: device.profile("h100_sxm"))
    monkeypatch.setattr(bench._timing, "benchmark", benchmark)
    monkeypatch.setattr(bench._timing, "can_hold", can_hold)
    monkeypatch.setattr(bench._checks, "poison_pool", lambda nbytes: None)
    monkeypatch.setattr(bench._checks, "stop_poisoning", lambda: None)
    monkeypatch.setattr(bench, "peak_memory", lambda fn: 0)
    monkeypatch.setattr(bench, "_free_pool", lambda: None)
    passed = [checks.CheckResult(name="o", max_abs=0.0, max_rel=0.0, mean_abs=0.0, rel_l2=0.0, nonfinite=0,
                                 passed=True, reason="")]
    op = bench.Op(name="t", make_inputs=lambda case, seed: None, reference=lambda case, inputs: None,
                  check=lambda case, out, ref: passed)
    impls = [bench.Impl(name="ours", prepare=lambda case, inputs: ours_fn),
             bench.Impl(name="torch", baseline=True, prepare=lambda case, inputs: torch_fn)]
    return bench.run(op, [bench.Case(name="tiny", params={})], impls, rounds=1, progress=None)


def test_bench_run_records_the_as_called_time_and_host_us_of_every_row(gpu, monkeypatch):
    """bench.run with the timer and checks stubbed and timing's own as_called / host_us on the faked device."""
    results = _run_two(monkeypatch, _call(gpu, 20e-6), _call(gpu, 60e-6, syncs=True),
                       benchmark=lambda fn, **kw: timing.summarize([0.01] * 10, clocks={"held": kw["hold"]}),
                       can_hold=lambda fn: True)

    ours, torch = results
    assert ours.host_us == pytest.approx(20.0) and ours.host_us_held
    assert torch.host_us == pytest.approx(60.0) and torch.host_us_held is False
    assert ours.as_called_ms == pytest.approx(0.02) and torch.as_called_ms == pytest.approx(0.06)
    assert ours.launches == 0  # the faked call launches nothing through the engine
    doc = json.loads(report.to_json(results, {}))
    assert {"as_called_ms", "host_us", "host_us_held", "launches"} <= set(doc["results"][0])
    table = report.table(results)
    assert "as called ms" in table and "host µs" in table and "60.0 syncs" in table


def test_count_launches_counts_one_calls_engine_launches_and_puts_the_methods_back(monkeypatch):
    from cukernels import compile as ccompile
    from cukernels import launch

    made = []
    monkeypatch.setattr(launch.Launcher, "launch", lambda self, stream, ptrs: made.append("launcher"))
    monkeypatch.setattr(ccompile.Kernel, "launch", lambda self, grid, block, args, **kw: made.append("kernel"))
    stubs = launch.Launcher.launch, ccompile.Kernel.launch

    def call():  # two cached launches and a one-off
        launch.Launcher.launch(None, 0, ())
        launch.Launcher.launch(None, 0, ())
        ccompile.Kernel.launch(None, (1,), (1,), ())

    assert launch.count_launches(call) == 3 and made == ["launcher", "launcher", "kernel"]
    assert (launch.Launcher.launch, ccompile.Kernel.launch) == stubs  # unwrapped after the call

    def fails():
        launch.Launcher.launch(None, 0, ())
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        launch.count_launches(fails)
    assert (launch.Launcher.launch, ccompile.Kernel.launch) == stubs  # also after a call that raised


def test_launch_overhead_is_our_passing_rows_host_us_per_kernel_launched():
    h100 = score.select_table(None, "h100_sxm")
    results = [_result(host_us=30.0, launches=1), _result(case="d", host_us=90.0, launches=5),
               _result(impl="torch", baseline=True, host_us=900.0),  # baselines do not count
               _result(case="e", status="failed-check", host_us=900.0, launches=1)]  # nor rows that failed
    lo = score.launch_overhead(results, h100)
    assert lo == {"measured_us": 20.0, "per_call_us": 60.0, "launches": 6, "target_us": 50, "rows": 2,
                  "impls": ["ours"], "uncounted_rows": 0, "unheld_rows": 0, "verdict": "PASS"}
    line = report.launch_overhead_line(lo)
    assert "20.0 µs per kernel launch" in line and "6 kernels" in line and "60.0 µs per call" in line
    assert "target < 50 µs: PASS" in line
    uncounted = score.launch_overhead([_result(host_us=30.0), _result(case="d", host_us=90.0, launches=2)], h100)
    assert uncounted["measured_us"] == 40.0 and uncounted["uncounted_rows"] == 1  # a row without a count: one launch
    assert "1 rows without a launch count" in report.launch_overhead_line(uncounted)
    slow = score.launch_overhead([_result(host_us=80.0, host_us_held=False)], h100)
    assert slow["verdict"] == "FAIL" and "1 rows wait for the device" in report.launch_overhead_line(slow)
    assert score.launch_overhead(results, None)["verdict"] == ""
    assert score.launch_overhead(results[2:], h100) is None and report.launch_overhead_line(None) == ""
    for name in score.table_names():  # every GPU's table carries seed 004's target
        assert score.select_table(None, name).doc["utilisation"]["kernel_launch_overhead_target_us"] == 50


def test_cli_prints_stores_and_reports_the_launch_overhead(monkeypatch, capsys, tmp_path):
    results = [_result(), _result(impl="torch", baseline=True, host_us=45.0, host_us_held=False)]
    monkeypatch.setattr(cli.device, "gpu_available", lambda: True)
    monkeypatch.setattr(cli.device, "current", lambda: device.profile("h100_sxm"))
    monkeypatch.setattr(cli.bench, "run", lambda *a, **kw: results)
    monkeypatch.setattr(cli.environment, "collect", lambda: {})
    ob = cli.OpBench(prog="fake", description="", op=lambda args: None, suites=("overhead",),
                     default_suite="overhead", cases=lambda suite, args: [bench.Case(name="c", params={})],
                     impls=lambda args: [bench.Impl(name="ours", prepare=None)], default_impls=("ours",),
                     plan_rows=lambda cases, spec, compile: [])
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    assert cli.main(ob, ["--json", str(out_json), "--markdown", str(out_md)]) == 0

    printed = capsys.readouterr().out
    assert "kernel launch overhead (seed 004): 20.0 µs" in printed and "PASS" in printed
    assert printed.index("| c ") < printed.index("kernel launch overhead")  # after the table
    doc = json.loads(out_json.read_text())
    assert doc["launch_overhead"]["verdict"] == "PASS" and doc["results"][1]["host_us_held"] is False
    md = out_md.read_text()
    assert "kernel launch overhead" in md and "host µs" in md and "45.0 syncs" in md
    assert compare.main([str(out_json), str(out_json)]) == 0  # the new fields are informative: not judged


def test_overhead_suites_are_tiny():
    from attention import bench as attention_bench
    from attention import suites as attention_suites
    from moe import bench as moe_bench
    from moe import suites as moe_suites

    att = attention_suites.cases("overhead")
    assert "overhead" in attention_bench.SUITES and all(c.batch == 1 and c.seq_q == 128 for c in att)
    assert {(c.head_dim, c.causal) for c in att} == {(64, False), (64, True), (128, False), (128, True)}
    assert any(c.n_kv_heads < c.heads for c in att)
    moe = moe_bench.cases_for(moe_suites.suite("overhead"), "bf16")
    assert [c.params["kind"] for c in moe] == ["route", "route+permute", "gather", "combine", "layer"]
    assert all(c.params["tokens"] == 16 for c in moe) and "overhead" in moe_suites.suite_names()


@pytest.mark.parametrize("module,extra", [("attention", ()), ("attention", ("--backward",)), ("moe", ())])
def test_overhead_suite_plans_with_no_gpu(module, extra, capsys):
    import importlib

    main = importlib.import_module(f"{module}.bench").main
    assert main(["--plan", "--profile", "h100_sxm", "--suite", "overhead", *extra]) == 0
    out = capsys.readouterr().out
    assert "overhead_" in out and "no plan" not in out and "| NO " not in out


def test_a_host_time_case_also_holds_the_rows_that_can_be_held(gpu, monkeypatch):
    """A case with a baseline that synchronises is timed with host time for every row (the common way, which
    ratios use); a row whose own call can be held is also timed held once (``held_ms``), the other is not."""
    ours_fn, torch_fn = _call(gpu, 20e-6), _call(gpu, 60e-6, syncs=True)
    ours, torch = _run_two(monkeypatch, ours_fn, torch_fn, can_hold=lambda fn: fn is ours_fn,
                           benchmark=lambda fn, **kw: timing.summarize([0.01 if kw["hold"] else 0.03] * 10,
                                                                       clocks={"held": kw["hold"]}))
    assert ours.median_ms == torch.median_ms == pytest.approx(0.03)  # both with host time
    assert not ours.clocks["held"] and ours.held_ms == pytest.approx(0.01) and torch.held_ms is None
    assert json.loads(report.to_json([ours, torch], {}))["results"][0]["held_ms"] == pytest.approx(0.01)
