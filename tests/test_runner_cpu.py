"""Runner pieces with no GPU: expected tables, scoring, grades, plausibility, report rendering."""
import dataclasses
import time

import pytest

from cukernels import bench, device, report, score

MOE_FLOPS_16x2048 = 2 * (16 * 2048) * 2 * (4096 * 2 * 11008 + 11008 * 4096)  # SwiGLU experts, top-2


def test_grade_boundaries_follow_seed_004():
    assert score.grade(0.81) == "A" and score.grade(0.80) == "B"
    assert score.grade(0.71) == "B" and score.grade(0.61) == "C" and score.grade(0.41) == "D"
    assert score.grade(0.40) == "F" and score.grade(None) == ""
    assert score.grade(1.5) == "A"


def test_verdict_uses_the_measured_noise():
    assert score.verdict(10.0, 0.05, 10.4) == "SAME"
    assert score.verdict(10.0, 0.01, 10.4) == "FASTER"
    assert score.verdict(10.0, 0.01, 9.5) == "SLOWER"


def test_moe_16x2048_on_h100_is_doubtful_with_its_arithmetic():
    spec = device.profile("h100_sxm")
    pl = score.plausibility(22.0, flops=MOE_FLOPS_16x2048, bytes_moved=0, spec=spec)
    assert pl.level == "doubtful" and "806 TFLOP/s" in pl.arithmetic
    impossible = score.plausibility(10.0, flops=MOE_FLOPS_16x2048, bytes_moved=0, spec=spec)
    assert impossible.level == "implausible" and not impossible.plausible


def test_tables_have_provenance():
    assert {"h100_sxm", "a100_80gb", "a10", "h200"} <= set(score.table_names())
    for name in score.table_names():
        t = score.select_table(None, name)
        assert t.doc.get("provenance")
        for kind in ("attention", "moe", "gemm"):
            for row in t.rows(kind):
                assert row.get("provenance") or t.doc.get("provenance"), (name, kind, row)


def test_table_selection_and_fallback():
    h200 = device.profile("h200")
    assert score.select_table(h200, "auto").key == "h200"
    no_own = dataclasses.replace(device.profile("h100_sxm"), key="h100_pcie_like", expected_fallback="h100_sxm")
    chosen = score.select_table(no_own, "auto")
    assert chosen.key == "h100_sxm" and "fallback" in chosen.note
    assert score.select_table(h200, "none") is None
    with pytest.raises(ValueError, match="known"):
        score.select_table(h200, "nope")


def test_seed004_h100_attention_rows():
    t = score.select_table(None, "h100_sxm")
    row = t.find("attention", "seed004_a")
    assert row["reference_ms"] == 3.2 and row["target_ms"] == 4.5
    assert t.grades["A"] == 0.8


def _r(**kw):
    base = dict(case="seed004_a", impl="ours", params={"seq": 2048}, tags=[], baseline=False, status="ok",
                median_ms=1.0, p20_ms=0.99, p80_ms=1.01, rel_noise=0.01, samples=10, tflops=300.0, pct_peak=30.0,
                checks=[{"max_abs": 1e-3, "max_rel": 1e-2, "passed": True}], peak_memory_bytes=2**20,
                clocks={"sm_clock_min_mhz": 1900, "sm_clock_max_mhz": 1980, "throttle_reasons": []})
    base.update(kw)
    return bench.Result(**base)


def test_markdown_report_renders(tmp_path):
    results = [_r(), _r(impl="torch-flash", baseline=True, median_ms=1.2)]
    bench._rank(results)
    env = {"gpu": {"name": "NVIDIA H200", "profile": "h200", "compute_capability": [9, 0], "sm_count": 132,
                   "smem_per_block_optin": 232448, "l2_bytes": 62914560},
           "nvml": {"driver": "580"}, "versions": {"cupy": "14.2.0"}, "git_revision": "abc", "date": "2026-11-22"}
    out = tmp_path / "r.md"
    report.markdown(results, [{}, {}], env, out, title="t", command="python -m attention.bench",
                    expected_note="table h200")
    text = out.read_text()
    assert "NVIDIA H200" in text and "1.20 (torch-flash)" in text and "Throttle reasons seen: none" in text


def _stub_gpu(monkeypatch, benchmark, as_called=lambda fn: 2.0):
    """bench.run's GPU parts stubbed (tests/test_overhead_cpu.py has the real as_called and host_us): the given
    timer, an H200 profile, holds for every fn that does not sync, no poisoning, no memory pool."""
    monkeypatch.setattr(bench._device, "current", lambda: device.profile("h200"))
    monkeypatch.setattr(bench._timing, "benchmark", benchmark)
    monkeypatch.setattr(bench._timing, "can_hold", lambda fn: not fn.syncs)
    monkeypatch.setattr(bench._timing, "as_called", as_called)
    monkeypatch.setattr(bench._timing, "host_us", lambda fn, per_call_ms: (per_call_ms * 10, not fn.syncs))
    monkeypatch.setattr(bench._checks, "poison_pool", lambda nbytes: None)
    monkeypatch.setattr(bench._checks, "stop_poisoning", lambda: None)
    monkeypatch.setattr(bench, "peak_memory", lambda fn: 0)
    monkeypatch.setattr(bench, "_free_pool", lambda: None)


def _op_checking_ok():
    """An op whose check passes where the output is "ok" (and names the output otherwise)."""
    from cukernels import checks

    def check(case, out, ref):
        return [checks.CheckResult(name="out", max_abs=0.0, max_rel=0.0, mean_abs=0.0, rel_l2=0.0, nonfinite=0,
                                   passed=out == "ok", reason=out)]
    return bench.Op(name="t", make_inputs=lambda case, seed: seed, reference=lambda case, inputs: None, check=check)


def test_unsettled_rows_are_timed_in_rounds_spread_over_the_run(monkeypatch):
    """bench.run(interleave=False) with the GPU parts stubbed: a settled device-time row is timed once; a host-time
    row, a device-time row whose first round did not reach the noise target and one whose first round ran throttled
    are timed where their case comes and again in sweeps after the last case, re-prepared from the case's seed and
    checked after every round."""
    from cukernels import timing

    calls, held = [], []

    def benchmark(fn, *, hold, budget_ms, min_samples, rel_noise_target):
        if hold and fn.case != "dev":  # a host-time row's own device time, held once (Result.held_ms)
            held.append((fn.case, fn.impl, budget_ms))
            return timing.summarize([0.5] * min_samples, clocks={"held": True})
        calls.append((fn.case, fn.impl, hold, budget_ms, min_samples))
        nth = sum(c[:2] == (fn.case, fn.impl) for c in calls)
        ms = 1.0 if hold else 0.1 * (1.2 if nth == 2 else 1.0)  # the host drifts in round 2
        settled = not (fn.impl == "jittery" and nth == 1)
        throttled = fn.impl == "capped" and nth == 1  # a clock pulled down in the first round: rounds as well
        return timing.summarize([ms] * min_samples, converged=settled, clocks={"held": hold, "throttled": throttled})

    _stub_gpu(monkeypatch, benchmark)

    prepared = []

    def impl(name, *, syncs=False, bad_from=None):
        def prepare(case, inputs):
            prepared.append((case.name, name, inputs))
            out = "bad" if bad_from and sum(p[:2] == (case.name, name) for p in prepared) >= bad_from else "ok"

            def fn():
                return out
            fn.case, fn.impl, fn.syncs = case.name, name, syncs and case.params["host"]
            return fn
        return bench.Impl(name=name, prepare=prepare, baseline=name != "ours")

    op = _op_checking_ok()
    cases = [bench.Case(name=n, params={"host": host}) for n, host in (("dev", False), ("h1", True), ("h2", True))]
    impls = [impl("ours"), impl("torch", syncs=True), impl("flaky", bad_from=3), impl("jittery"), impl("capped")]
    results = bench.run(op, cases, impls, budget_ms=300, rounds=3, progress=None, interleave=False)

    assert [(r.case, r.impl) for r in results] == [(c.name, i.name) for c in cases for i in impls]
    names = [i.name for i in impls]
    sweep = [("dev", "jittery"), ("dev", "capped")] + [(c, i) for c in ("h1", "h2") for i in names]
    assert [c[:2] for c in calls] == [("dev", i) for i in names] + [(c, i) for c in ("h1", "h2") for i in names] \
        + sweep * 2
    # device time: one round with the whole budget; later rounds of an unsettled one stay held, with a share
    assert {c[2:] for c in calls if c[0] == "dev"} == {(True, 300, 10), (True, 100, 5)}
    assert {c[2:] for c in calls if c[0] != "dev"} == {(False, 100, 5)}  # host time: a third per round
    # a host-time row whose own call can be held is also timed held, once; the synchronising baseline is not
    assert held == [(c, i, bench._HELD_MS_BUDGET) for c in ("h1", "h2") for i in names if i != "torch"]
    assert all((r.held_ms == 0.5) == (r.case != "dev" and r.impl != "torch") for r in results)
    assert {p[2] for p in prepared if p[0] == "h2"} == {bench.case_seed("h2")}  # later rounds: the case's own seed

    by = {(r.case, r.impl): r for r in results}
    dev, host, jittery = by["dev", "ours"], by["h1", "ours"], by["dev", "jittery"]
    assert dev.round_medians_ms == [] and dev.round_noise is None and dev.rel_noise == 0.0
    assert jittery.round_medians_ms == [1.0, 1.0, 1.0] and jittery.clocks["held"] and jittery.samples == 20
    assert by["dev", "capped"].round_medians_ms == [1.0, 1.0, 1.0]  # converged, but throttled in its first round
    assert host.round_medians_ms == pytest.approx([0.1, 0.12, 0.1]) and host.samples == 15
    assert host.round_noise == pytest.approx(0.1) and host.rel_noise == pytest.approx(0.1)
    assert host.clocks["held"] is False and len(host.checks) == 4  # before timing, after each of 3 rounds
    flaky = by["h1", "flaky"]  # its third preparation (round 3) returns a wrong answer: failed, never fast
    assert flaky.status == "failed-check" and flaky.reason.startswith("after round 3/3")
    assert by["dev", "flaky"].status == "ok"
    assert host.best_baseline == "torch" and host.speedup_vs_best_baseline == pytest.approx(1)  # not the failed one
    # what a user gets is taken once per row, after its first round
    assert (dev.as_called_ms, dev.host_us, dev.host_us_held) == (2.0, 20.0, True)
    assert by["h1", "torch"].host_us_held is False and flaky.as_called_ms == 2.0


def test_a_host_time_over_the_wall_time_as_called_is_taken_again(monkeypatch):
    """A held burst's host µs per call cannot exceed the wall µs per call as called (which includes it): where it
    reads over bench.HOST_OVER_CALLED x that, the row's as-called time and host µs are taken again together, at most
    bench.USER_TIMES_TAKES times; a row still over is marked in the table. An unheld (synchronising) row is not
    retaken: its host time includes the device's."""
    from cukernels import report, timing

    _stub_gpu(monkeypatch, lambda fn, *, hold, budget_ms, min_samples, rel_noise_target: timing.summarize(
        [0.01] * min_samples, converged=True, clocks={"held": hold}))
    host_reads = {"ours": [145.0, 13.0], "bad": [150.0, 140.0, 130.0, 120.0], "torch": [90.0, 20.0]}
    taken = []

    def host_us(fn, per_call_ms):
        taken.append(fn.impl)
        return host_reads[fn.impl].pop(0), not fn.syncs

    monkeypatch.setattr(bench._timing, "as_called", lambda fn: 0.0145)
    monkeypatch.setattr(bench._timing, "host_us", host_us)

    def impl(name, syncs=False):
        def prepare(case, inputs):
            def fn():
                return "ok"
            fn.case, fn.impl, fn.syncs = case.name, name, syncs
            return fn
        return bench.Impl(name=name, prepare=prepare, baseline=name == "torch")

    results = bench.run(_op_checking_ok(), [bench.Case(name="c", params={})],
                        [impl("ours"), impl("bad"), impl("torch", syncs=True)], budget_ms=30, rounds=1, progress=None)
    by = {r.impl: r for r in results}
    assert (by["ours"].host_us, by["ours"].user_times_takes) == (13.0, 2)  # the second pair holds
    assert (by["bad"].host_us, by["bad"].user_times_takes) == (130.0, bench.USER_TIMES_TAKES)
    assert (by["torch"].host_us, by["torch"].user_times_takes, by["torch"].host_us_held) == (90.0, 1, False)
    assert taken.count("bad") == bench.USER_TIMES_TAKES
    cells = {row["impl"]: row["host µs"] for row in report.rows(results)}
    assert cells == {"ours": "13.0", "bad": "130.0 > called", "torch": "90.0 syncs"}
    assert bench.host_consistent(17.3, 0.0145, True) and not bench.host_consistent(17.5, 0.0145, True)


def test_a_case_gets_the_same_inputs_alone_or_among_others(monkeypatch):
    """bench.run seeds a case's inputs from its name (bench.case_seed), not from its place in the run, so a `--case`
    filter, a tool timing one case and a table made from the inputs after the run all see the suite's inputs."""
    from cukernels import timing

    _stub_gpu(monkeypatch, lambda fn, *, hold, budget_ms, min_samples, rel_noise_target: timing.summarize(
        [1.0] * min_samples, converged=True, clocks={"held": hold}))
    seen = []

    def prepare(case, inputs):
        seen.append((case.name, inputs))

        def fn():
            return "ok"
        fn.case, fn.impl, fn.syncs = case.name, "ours", False
        return fn

    impls = [bench.Impl(name="ours", prepare=prepare)]
    cases = [bench.Case(name=n, params={}) for n in ("decode_a", "decode_b", "decode_c")]
    bench.run(_op_checking_ok(), cases, impls, budget_ms=30, rounds=1, progress=None, seed=7)
    together = dict(seen)
    seen.clear()
    bench.run(_op_checking_ok(), cases[2:], impls, budget_ms=30, rounds=1, progress=None, seed=7)
    assert dict(seen)["decode_c"] == together["decode_c"] == bench.case_seed(cases[2], 7)
    assert len(set(together.values())) == 3  # different cases, different inputs
    assert bench.case_seed("decode_c", 7) == bench.case_seed(cases[2]) + 7 and 7 <= together["decode_c"] < 10**6 + 7


def test_interleave_times_a_device_time_case_in_rotated_turns(monkeypatch):
    """bench.run(interleave=True) with the GPU parts stubbed: a device-time case's implementations take turns in
    `rounds` rounds, round r starting at the r-th of them, each with a share of the budget, checked after every
    round; what a user gets is taken after the last round; a host-time case is timed as without it."""
    from cukernels import timing

    calls, taken = [], []

    def benchmark(fn, *, hold, budget_ms, min_samples, rel_noise_target):
        calls.append((fn.case, fn.impl, hold, budget_ms, min_samples))
        nth = sum(c[:2] == (fn.case, fn.impl) for c in calls)
        return timing.summarize([1.0 + 0.1 * nth] * min_samples, converged=True, clocks={"held": hold})

    def as_called(fn):
        taken.append((fn.case, fn.impl, len(calls)))
        return 2.0

    _stub_gpu(monkeypatch, benchmark, as_called)

    def impl(name, *, syncs=False):
        def prepare(case, inputs):
            def fn():
                return "ok"
            fn.case, fn.impl, fn.syncs = case.name, name, syncs and case.params["host"]
            return fn
        return bench.Impl(name=name, prepare=prepare, baseline=name != "ours")

    op = _op_checking_ok()
    cases = [bench.Case(name=n, params={"host": host}) for n, host in (("dev", False), ("host", True))]
    impls = [impl("ours"), impl("cudnn"), impl("flash", syncs=True)]
    results = bench.run(op, cases, impls, budget_ms=300, rounds=3, progress=None, interleave=True)

    assert [(r.case, r.impl) for r in results] == [(c.name, i.name) for c in cases for i in impls]
    dev = [c for c in calls if c[0] == "dev"]
    assert [c[1] for c in dev] == ["ours", "cudnn", "flash", "cudnn", "flash", "ours", "flash", "ours", "cudnn"]
    assert {c[2:] for c in dev} == {(True, 100, 5)}
    assert [t[:2] for t in taken[:3]] == [("dev", "ours"), ("dev", "cudnn"), ("dev", "flash")]
    assert all(t[2] == len(dev) for t in taken[:3])  # after every round of the case
    by = {(r.case, r.impl): r for r in results}
    assert by["dev", "ours"].round_medians_ms == pytest.approx([1.1, 1.2, 1.3]) and by["dev", "ours"].samples == 15
    assert by["dev", "ours"].median_ms == pytest.approx(1.2)  # the median of the turns' medians
    assert len(by["dev", "cudnn"].checks) == 4  # before timing and after each of 3 rounds
    assert by["dev", "ours"].as_called_ms == 2.0 and by["dev", "ours"].host_us_held is True
    # the host-time case (one implementation syncs): a third of the budget per round, as without interleave
    assert {c[2:] for c in calls if c[0] == "host" and not c[2]} == {(False, 100, 5)}
    # and the two that can be held are timed held once more, for their device time (Result.held_ms)
    assert [c[1:] for c in calls if c[0] == "host" and c[2]] == [("ours", True, bench._HELD_MS_BUDGET, 10),
                                                                  ("cudnn", True, bench._HELD_MS_BUDGET, 10)]
    assert [c[1] for c in calls if c[0] == "host" and not c[2]][:3] == ["ours", "cudnn", "flash"]


def test_sustained_rows_take_two_passes_in_opposite_orders_and_are_ranked(monkeypatch):
    """bench.run(sustained_s=S): after a case's timing each row is called back to back in two passes of S / 2 s,
    the rows in order and then reversed; Result.sustained merges them (means per call, every reason seen) and
    sets each row against the fastest baseline back to back; the table gains its columns."""
    from cukernels import timing

    _stub_gpu(monkeypatch, lambda fn, *, hold, budget_ms, min_samples, rel_noise_target: timing.summarize(
        [1.0] * min_samples, clocks={"held": hold}))
    passes = []
    ms = {"ours": 1.0, "cublas": 1.25, "grouped": 1.1}

    def sustained(fn, seconds):
        passes.append((fn.case, fn.impl, seconds))
        k = sum(p[:2] == (fn.case, fn.impl) for p in passes)  # the second pass: 10 % slower, hotter
        return {"seconds": seconds, "calls": 100, "ms_per_call": ms[fn.impl] * (1.1 if k == 2 else 1.0),
                "mj_per_call": 700.0 * ms[fn.impl], "power_w": 700.0, "sm_clock_mean_mhz": 1300.0 + k,
                "sm_clock_min_mhz": 1250 + k, "sm_clock_max_mhz": 1400 + k,
                "throttle_reasons": ["sw_power_cap"] if k == 2 else [], "throttled": k == 2}

    monkeypatch.setattr(bench._timing, "sustained", sustained)

    def impl(name):
        def prepare(case, inputs):
            def fn():
                return "ok"
            fn.case, fn.impl, fn.syncs = case.name, name, False
            return fn
        return bench.Impl(name=name, prepare=prepare, baseline=name != "ours")

    cases = [bench.Case(name=n, params={}) for n in ("a", "b")]
    impls = [impl("ours"), impl("cublas"), impl("grouped")]
    with pytest.raises(ValueError, match="sustained_s must be a number >= 0"):
        bench.run(_op_checking_ok(), cases, impls, progress=None, sustained_s=-1.0)
    assert not passes
    results = bench.run(_op_checking_ok(), cases, impls, budget_ms=300, rounds=3, progress=None, sustained_s=4.0)
    order = ["ours", "cublas", "grouped"]
    assert passes == [(c, i, 2.0) for c in ("a", "b") for i in order + order[::-1]]
    by = {(r.case, r.impl): r for r in results}
    st = by["a", "ours"].sustained
    assert st["ms_per_call"] == pytest.approx(1.05) and st["mj_per_call"] == pytest.approx(700.0)
    assert (st["sm_clock_min_mhz"], st["sm_clock_max_mhz"], st["calls"], len(st["passes"])) == (1251, 1402, 200, 2)
    assert st["throttle_reasons"] == ["sw_power_cap"] and st["throttled"]
    assert st["best_baseline"] == "grouped" and st["speedup_vs_best_baseline"] == pytest.approx(1.1)
    assert by["a", "cublas"].sustained["speedup_vs_best_baseline"] == pytest.approx(1.1 / 1.25)
    text = report.table(results)
    assert "sustained µs/call" in text and "1,050.0 THROTTLED" in text and "1.10 (grouped)" in text
    assert "mJ/call" not in report.table([_r()])  # no sustained passes: no such columns


def test_sustained_measures_the_second_half_with_the_energy_counter(monkeypatch):
    """timing.sustained: the first half settles, the second is measured in batches; energy per call is the
    counter's difference over the measured calls; the clock and reasons come from readings taken in the batches."""
    import cupy

    from cukernels import timing

    state = {"mj": 1000.0, "calls": 0, "syncs": 0}

    class FakeDevice:
        id = 0

        def synchronize(self):
            state["syncs"] += 1

    def fn():
        state["calls"] += 1
        state["mj"] += 5.0
        time.sleep(0.0005)

    monkeypatch.setattr(cupy.cuda, "Device", FakeDevice)
    monkeypatch.setattr(timing._device, "nvml_energy_mj", lambda dev: state["mj"])
    monkeypatch.setattr(timing._device, "nvml_sample", lambda dev: {
        "sm_clock_mhz": 1300 + state["calls"] % 2, "throttle_reasons": ["sw_power_cap"]})
    with pytest.raises(ValueError, match="seconds must be a positive number"):
        timing.sustained(fn, 0)
    out = timing.sustained(fn, 0.2, batch_ms=10.0)
    assert out["mj_per_call"] == pytest.approx(5.0)  # the measured half's calls only
    assert 0 < out["calls"] < state["calls"] and out["seconds"] >= 0.1
    assert out["ms_per_call"] == pytest.approx(1e3 * out["seconds"] / out["calls"])
    assert out["power_w"] == pytest.approx(5.0 * out["calls"] / 1e3 / out["seconds"])
    assert 1300 <= out["sm_clock_min_mhz"] <= out["sm_clock_mean_mhz"] <= out["sm_clock_max_mhz"] <= 1301
    assert out["throttled"] and out["throttle_reasons"] == ["sw_power_cap"]
    monkeypatch.setattr(timing._device, "nvml_energy_mj", lambda dev: None)  # no counter: no energy, still time
    out = timing.sustained(fn, 0.05, batch_ms=10.0)
    assert out["mj_per_call"] is None and out["power_w"] is None and out["ms_per_call"] > 0


def _rerun_doc(**rows):
    """A minimal ``--json`` document: rows keyed "case/impl" -> (median_ms, rel_noise[, held])."""
    out = []
    for key, (median, noise, *held) in rows.items():
        case, impl = key.split("/")
        out.append({"case": case, "impl": impl, "status": "ok", "median_ms": median, "rel_noise": noise,
                    "clocks": {"held": held[0] if held else True}, "round_medians_ms": []})
    return {"results": out}


def test_compare_sets_each_pair_against_both_runs_noise_with_a_floor(tmp_path):
    import json

    from cukernels import compare

    a = _rerun_doc(**{"c/dev": (1.000, 0.002), "c/host": (0.100, 0.10, False), "c/drift": (1.0, 0.001),
                      "c/gone": (1.0, 0.01)})
    b = _rerun_doc(**{"c/dev": (1.015, 0.002), "c/host": (0.088, 0.05, False), "c/drift": (1.03, 0.001)})
    rows = {r["impl"]: r for r in compare.compare(a, b)}
    assert set(rows) == {"dev", "host", "drift"}  # a row missing from one run is not compared
    assert rows["dev"]["agree"] == "yes" and rows["dev"]["band"] == "±2.0%"  # +1.5 %: inside the 2 % floor
    assert rows["host"]["agree"] == "yes" and rows["host"]["band"] == "±15.0%"  # -12 %: inside 10 % + 5 %
    assert rows["drift"]["agree"] == "NO" and rows["drift"]["diff"] == "+3.0%"  # outside the floor
    assert rows["host"]["timed"] == "host-incl" and rows["dev"]["timed"] == "device"
    assert compare.compare(a, b, floor=0.05)[2]["agree"] == "yes"

    files = {}
    for name, doc in (("a", a), ("b", b), ("a_again", a)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    assert compare.main([str(files["a"]), str(files["b"])]) == 1  # one row disagrees
    assert compare.main([str(files["a"]), str(files["a_again"])]) == 0


def _bench_cli(module, *args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(device.gpu_available(), reason="checks the no-GPU message")
def test_attention_bench_without_gpu_points_to_plan():
    out = _bench_cli("attention.bench")
    assert out.returncode == 0 and "No CUDA GPU" in out.stderr and "--plan" in out.stderr


@pytest.mark.parametrize("profile", device.profile_names())
def test_attention_bench_plan_for_every_profile(profile):
    out = _bench_cli("attention.bench", "--plan", "--profile", profile, "--suite", "default")
    assert out.returncode == 0, out.stderr
    assert "shared memory limit" in out.stdout and "seed004_a" in out.stdout
    if device.profile(profile).compute_capability >= (8, 0):
        assert "| NO " not in out.stdout and "no plan" not in out.stdout
    else:
        assert "no plan" in out.stdout  # T4: a clear reason instead of a config that cannot run


def test_bench_cli_rejects_unknown_profile_and_impl():
    out = _bench_cli("attention.bench", "--plan", "--profile", "h300")
    assert out.returncode == 2 and "known profiles" in out.stderr
    out = _bench_cli("attention.bench", "--plan", "--suite", "nope")
    assert out.returncode == 2 and "invalid choice" in out.stderr
