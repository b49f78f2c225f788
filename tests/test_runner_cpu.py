"""Runner pieces with no GPU: expected tables, scoring, grades, plausibility, report rendering."""
import dataclasses

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
