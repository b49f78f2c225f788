"""``--ncu`` without a GPU or Nsight Compute: parsing ncu's CSV (as ncu prints it, interleaved with the profiled
bench's own output), the five figures, scoring against seed 004's targets, and the message when ncu is missing."""
from __future__ import annotations

import json
import subprocess

import pytest

from cukernels import cli, ncu

# The shape of `ncu --csv` output (details page: one row per metric), after the profiled program's own lines; the
# values are illustrative, the thousands separator and "n/a" are as ncu writes them.
SAMPLE_DETAILS = """\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
python -m attention.bench: suite seed004, bf16, NVIDIA H100 80GB HBM3
| case | impl | median ms |
==PROF== Profiling "flash_fwd_wgmma" - 0: 0%....50%....100% - 9 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","void flash_fwd_wgmma<__nv_bfloat16, 64, 128, 2, 2, 0>(const T1 *, int)","1","7","(256, 1, 1)","(16, 16, 16)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","31.52"
"0","4242","python3.12","127.0.0.1","void flash_fwd_wgmma<__nv_bfloat16, 64, 128, 2, 2, 0>(const T1 *, int)","1","7","(256, 1, 1)","(16, 16, 16)","0","9.0","Command line profiler metrics","lts__t_sector_hit_rate.pct","%","88.10"
"0","4242","python3.12","127.0.0.1","void flash_fwd_wgmma<__nv_bfloat16, 64, 128, 2, 2, 0>(const T1 *, int)","1","7","(256, 1, 1)","(16, 16, 16)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","%","74.20"
"0","4242","python3.12","127.0.0.1","void flash_fwd_wgmma<__nv_bfloat16, 64, 128, 2, 2, 0>(const T1 *, int)","1","7","(256, 1, 1)","(16, 16, 16)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","%","0"
"0","4242","python3.12","127.0.0.1","void flash_fwd_wgmma<__nv_bfloat16, 64, 128, 2, 2, 0>(const T1 *, int)","1","7","(256, 1, 1)","(16, 16, 16)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","65.03"
"0","4242","python3.12","127.0.0.1","void flash_fwd_wgmma<__nv_bfloat16, 64, 128, 2, 2, 0>(const T1 *, int)","1","7","(256, 1, 1)","(16, 16, 16)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","24.87"
"1","4242","python3.12","127.0.0.1","moe_route_finish","1","7","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","n/a"
"1","4242","python3.12","127.0.0.1","moe_route_finish","1","7","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","1,234.5"
python -m attention.bench: done
"""

SAMPLE_RAW = """\
==PROF== Connected to process 77
"ID","Process ID","Process Name","Host Name","Kernel Name","Device","CC","gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
"","","","","","","","%","%","%"
"0","77","python","host","moe_grouped_gemm<__nv_bfloat16, 128, 256>","0","8.0","12.5","83.2","88.0"
"""


def test_details_page_parses_per_launch_skipping_program_output():
    launches = ncu.parse_csv(SAMPLE_DETAILS)
    assert [l["id"] for l in launches] == ["0", "1"]
    fwd, finish = launches
    assert fwd["kernel"].startswith("void flash_fwd_wgmma<")
    assert fwd["metrics"]["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(65.03)
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed" not in finish["metrics"]  # n/a left out
    assert finish["metrics"]["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(1234.5)


def test_raw_page_parses_with_its_units_row():
    [launch] = ncu.parse_csv(SAMPLE_RAW)
    assert launch["kernel"].startswith("moe_grouped_gemm")
    figures = ncu.summarize(launch["metrics"])
    assert figures["dram"] == pytest.approx(12.5)  # the gpu__ name stands in for dram__
    assert figures["sm"] == pytest.approx(83.2) and figures["tensor"] == pytest.approx(88.0)
    assert figures["occupancy"] is None and figures["l2_hit"] is None


def test_no_csv_at_all_gives_no_launches():
    assert ncu.parse_csv("==ERROR== something went wrong\n") == []
    assert ncu.parse_csv("") == []


def test_tensor_pipe_takes_the_larger_of_hmma_and_gmma():
    fwd = ncu.parse_csv(SAMPLE_DETAILS)[0]
    f = ncu.summarize(fwd["metrics"])
    assert f["tensor"] == pytest.approx(74.2)  # wgmma kernel: gmma pipe, hmma 0
    assert f["occupancy"] == pytest.approx(24.87) and f["l2_hit"] == pytest.approx(88.1)


def test_scoring_against_seed004_targets():
    fwd = ncu.summarize(ncu.parse_csv(SAMPLE_DETAILS)[0]["metrics"])
    s = ncu.score("void flash_fwd_wgmma<__nv_bfloat16, 64>", fwd)
    assert s["operation"] == "Flash Attention"
    assert s["targets"] == {"sm": 60.0, "tensor": 70.0, "dram": 70.0}
    assert s["verdicts"] == {"sm": "meets", "tensor": "meets", "dram": "below"}
    gemm = ncu.score("moe_grouped_gemm_wgmma<bf16>", {"sm": 79.9, "tensor": 90.0, "dram": None})
    assert gemm["role"] == "moe_gemm" and gemm["verdicts"] == {"sm": "below", "tensor": "meets", "dram": ""}
    router = ncu.score("moe_route<float, 1, 8>", {"sm": 45.0, "tensor": 0.0, "dram": 50.0})
    assert router["operation"] == "Router" and router["verdicts"] == {"sm": "meets", "tensor": "", "dram": ""}
    assert ncu.role("flash_bwd_dq_convert<bf16>") == "elementwise"
    assert ncu.role("flash_bwd_dkdv_wgmma<bf16>") == "attention"
    assert ncu.role("moe_permute_scatter<8>") == "router"
    assert ncu.role("some_other_kernel") is None
    assert "seed 004" in ncu.PROVENANCE


def test_table_and_rows():
    profiled = [{"target": "attention forward", "launches": ncu.parse_csv(SAMPLE_DETAILS), "error": ""},
                {"target": "router", "launches": [], "error": "ncu profiled no kernel"}]
    rows = ncu.rows_of(profiled)
    text = ncu.table(rows)
    assert "65.0 (meets >60)" in text and "31.5 (below >70)" in text and "ERROR: ncu profiled no kernel" in text
    json.dumps(rows)  # data first


def test_command_line_names_every_metric_and_the_launch_window():
    t = ncu.Target(name="fwd", bench_args=["--suite", "seed004"], kernel_regex="flash_fwd", launch_skip=2,
                   launch_count=1)
    cmd = ncu.ncu_command("ncu", "attention.bench", t, ncu.all_metric_names())
    assert cmd[:3] == ["ncu", "--target-processes", "all"]
    assert "regex:flash_fwd" in cmd and "--csv" in cmd
    assert cmd[cmd.index("--launch-skip") + 1] == "2" and cmd[cmd.index("--launch-count") + 1] == "1"
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    for name in ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
                 "lts__t_sector_hit_rate.pct", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"):
        assert name in metrics


def test_unknown_metrics_are_dropped_and_the_run_repeated(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        metrics = cmd[cmd.index("--metrics") + 1]
        calls.append(metrics)
        if "gmma" in metrics:
            return subprocess.CompletedProcess(cmd, 1, "", "==ERROR== Failed to find metric "
                                               "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active\n")
        return subprocess.CompletedProcess(cmd, 0, SAMPLE_RAW, "")

    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    out = ncu.profile("ncu", "moe.bench", ncu.Target(name="gemm", bench_args=[], kernel_regex="moe_grouped_gemm"))
    assert len(calls) == 2 and "gmma" not in calls[1]
    assert out["error"] == "" and out["launches"][0]["kernel"].startswith("moe_grouped_gemm")


def test_counter_permission_error_is_said(monkeypatch):
    monkeypatch.setattr(ncu.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"))
    out = ncu.profile("ncu", "moe.bench", ncu.Target(name="gemm", bench_args=[], kernel_regex="x"))
    assert "performance counters" in out["error"]


def test_a_timeout_is_an_error_not_a_traceback(monkeypatch):
    def fake_run(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    out = ncu.profile("ncu", "moe.bench", ncu.Target(name="gemm", bench_args=[], kernel_regex="x"), timeout=5)
    assert "5 s timeout" in out["error"] and out["launches"] == [] and out["returncode"] is None
    assert "ERROR" in ncu.table(ncu.rows_of([out]))


def test_a_failing_profiled_run_is_reported_beside_its_figures(monkeypatch):
    monkeypatch.setattr(ncu.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, SAMPLE_RAW, "FAILED check: rel_l2 0.5"))
    out = ncu.profile("ncu", "moe.bench", ncu.Target(name="gemm", bench_args=[], kernel_regex="moe_grouped_gemm"))
    assert out["launches"] and "exited 1" in out["error"] and "FAILED check" in out["error"]


@pytest.mark.parametrize("bench", ["attention", "moe"])
def test_no_ncu_or_nsys_on_path_is_a_clear_message_and_exit_0(bench, monkeypatch, capsys):
    from attention import bench as attention_bench
    from moe import bench as moe_bench

    main = {"attention": attention_bench.main, "moe": moe_bench.main}[bench]
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    assert main(["--ncu"]) == cli.EXIT_OK
    assert "ncu (Nsight Compute) is not on PATH" in capsys.readouterr().err
    assert main(["--nsys", "out/timeline"]) == cli.EXIT_OK
    assert "nsys (Nsight Systems) is not on PATH" in capsys.readouterr().err


def test_targets_cover_attention_forward_backward_gemm_and_router():
    from attention import bench as attention_bench
    from moe import bench as moe_bench

    a_args = cli.parser_for(attention_bench.OP).parse_args(["--suite", "seed004"])
    a = attention_bench._ncu_targets(attention_bench.OP.cases("seed004", a_args), a_args)
    assert [t.kernel_regex for t in a] == ["flash_fwd", "flash_bwd"] and "--backward" in a[1].bench_args
    m_args = cli.parser_for(moe_bench.OP_BENCH).parse_args([])
    m = moe_bench._ncu_targets([], m_args)
    assert [t.kernel_regex for t in m] == ["moe_grouped_gemm", "moe_route|moe_permute"]
    # every case the targets name exists in the suite they name
    for ob, targets in ((attention_bench.OP, a), (moe_bench.OP_BENCH, m)):
        for t in targets:
            args = cli.parser_for(ob).parse_args(list(t.bench_args))
            assert cli._check_options(ob, args)[1], t


def test_nsys_argv_drops_only_its_own_flag():
    assert ncu._without_nsys(["--suite", "seed004", "--nsys", "out/t", "--backward"]) == ["--suite", "seed004",
                                                                                         "--backward"]
    assert ncu._without_nsys(["--nsys", "--case", "a"]) == ["--case", "a"]
    assert ncu._without_nsys(["--nsys=x", "--case", "a"]) == ["--case", "a"]
    # argparse's abbreviations of --nsys: the child must not run nsys inside nsys
    assert ncu._without_nsys(["--nsy", "out/t", "--case", "a"]) == ["--case", "a"]
    assert ncu._without_nsys(["--ns=x", "--case", "a"]) == ["--case", "a"]
    assert ncu._without_nsys(["--nsy", "--case", "a"]) == ["--case", "a"]
    assert ncu._without_nsys(["--ncu", "--no-causal", "-n"]) == ["--ncu", "--no-causal", "-n"]
