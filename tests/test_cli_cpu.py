"""The command lines with no GPU: --list, errors that name what would be accepted, one exit status for "no GPU",
plan tables that fit a terminal, profile names as people type them, provenance that resolves in the repository."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from attention import bench as attention_bench
from cukernels import cli, device
from moe import bench as moe_bench
from moe import suites as moe_suites

ROOT = Path(__file__).resolve().parent.parent
BENCHES = {"attention": (attention_bench.main, attention_bench.OP), "moe": (moe_bench.main, moe_bench.OP_BENCH)}
TABLE_WIDTH = 160  # the default --plan table keeps within this many characters


def _run(main, argv, capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("name", BENCHES)
def test_list_says_what_every_suite_is_and_names_its_cases(name, capsys):
    main, ob = BENCHES[name]
    rc, out, _ = _run(main, ["--list"], capsys)
    assert rc == cli.EXIT_OK
    for suite, what in ob.suites.items():
        assert what and re.search(rf"^  {re.escape(suite)} +\d+ cases  ", out, re.M), suite
        for case in ob.cases(suite, cli.parser_for(ob).parse_args([])):
            assert f"| {case.name} " in out


def test_every_suite_offered_has_cases():
    args = cli.parser_for(attention_bench.OP).parse_args([])
    for suite in attention_bench.SUITES:
        assert attention_bench.OP.cases(suite, args), suite
    assert set(moe_bench.SUITES) == set(moe_suites.suite_names())


def test_a_bad_case_names_the_cases_and_the_suite_that_has_it(capsys):
    rc, _, err = _run(attention_bench.main, ["--suite", "seed004", "--case", "llama8b", "--plan", "--profile", "h200"],
                      capsys)
    assert rc == cli.EXIT_USAGE
    assert "--case llama8b" in err and "seed004_a, seed004_b" in err and "add --suite grug" in err
    rc, _, err = _run(moe_bench.main, ["--case", "llama70b"], capsys)
    assert rc == cli.EXIT_USAGE and "no other suite has it" in err and "--list" in err


@pytest.mark.parametrize("argv, names", [
    (["--plan", "--profile", "h200", "--impl", "bogus"], "known: ours, naive"),
    (["--plan", "--profile", "a100"], "a100_40gb, a100_80gb"),
    (["--plan", "--profile", "h300"], "known profiles: a10"),
    (["--expected", "h300"], "known: a10, a100_80gb"),
    (["--compile"], "go with --plan"),
    (["--sustained", "-1"], "--sustained -1.0: needs a number of seconds >= 0"),
    (["--sustained", "nan"], "--sustained nan: needs"),
    (["--plan", "--profile", "h200", "--sustained", "2"], "does not go with --plan"),
])
def test_usage_errors_exit_2_and_name_what_is_accepted(argv, names, capsys):
    rc, out, err = _run(attention_bench.main, argv, capsys)
    assert rc == cli.EXIT_USAGE and names in err and err.startswith("python -m attention.bench: error: ")
    assert not out


@pytest.mark.parametrize("name, argv, profile", [
    *((name, argv, profile) for profile in ("h200", "gb10", "t4") for name, argv in (
        ("attention", ["--suite", "grug", "--backward"]), ("attention", ["--suite", "ci"]),
        ("moe", ["--suite", "all"]))),
    ("attention", ["--suite", "overhead", "--case", "overhead_d128_gqa", "--compile"], "h200"),
    ("moe", ["--suite", "overhead", "--case", "layer", "--compile"], "h200"),
])
def test_default_plan_table_fits_and_verbose_adds_the_reasons(name, argv, profile, capsys):
    main, _ = BENCHES[name]
    rc, out, _ = _run(main, ["--plan", "--profile", profile, *argv], capsys)
    assert rc == cli.EXIT_OK
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table and max(map(len, table)) <= TABLE_WIDTH, max(table, key=len)
    assert "why" not in table[0]
    if profile == "t4":  # the reason of a refused plan is said once, under the table
        assert "\nno plan: " in out and "compute capability 8.0" in out
    if "--compile" in argv:
        assert "regs" in table[0] and "spill B" in table[0]
    rc, out, _ = _run(main, ["--plan", "--profile", profile, "--verbose", *(a for a in argv if a != "--compile")],
                      capsys)
    assert rc == cli.EXIT_OK and "why" in out.splitlines()[1]


def test_plan_json_holds_every_column(tmp_path, capsys):
    path = tmp_path / "plan.json"
    rc, _, _ = _run(moe_bench.main, ["--plan", "--profile", "H100", "--suite", "quick", "--json", str(path)], capsys)
    doc = json.loads(path.read_text())
    assert rc == cli.EXIT_OK and doc["profile"] == "h100_sxm" and doc["limits"]["smem_per_block_optin"] == 232448
    assert all(row["why"] for row in doc["rows"]) and any("<" in row.get("instance", "") for row in doc["rows"])


@pytest.mark.parametrize("typed, key", [("h100", "h100_sxm"), ("H200", "h200"), ("h100-SXM", "h100_sxm"),
                                        ("a10", "a10"), ("GB", "gb10"), ("NVIDIA H100 80GB HBM3", "h100_sxm")])
def test_profile_names_as_people_type_them(typed, key):
    assert device.profile_key(typed) == key and device.profile(typed).key == key


def test_an_ambiguous_profile_prefix_names_the_candidates():
    with pytest.raises(device.UnknownProfileError, match="ambiguous: it could be a100_40gb, a100_80gb"):
        device.profile("a100")


@pytest.mark.skipif(device.gpu_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("command", [["-m", "cukernels"], ["-m", "attention.bench"], ["-m", "moe.bench"],
                                     ["tools/sanitize.py"]])
def test_no_gpu_is_the_same_exit_status_and_message_everywhere(command):
    out = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == cli.EXIT_NO_GPU == 0, out.stderr
    assert "No CUDA GPU is visible to CuPy" in out.stderr and "Traceback" not in out.stderr


def _provenance_files() -> list[Path]:
    return sorted([*(ROOT / "profiles").glob("*.toml"), *(ROOT / "expected_results").glob("*.toml")])


@pytest.mark.parametrize("path", _provenance_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_provenance_paths_resolve_in_the_repository(path):
    text = path.read_text()
    assert "shared/" not in text, "a source outside the repository"
    for m in re.finditer(r"(?<![\w/])(?:docs|profiles|expected_results|cukernels|attention|moe|tools)/[\w./-]*\w", text):
        if "/" in (text[: m.start()].split() or [""])[-1]:
            continue  # a path in another repository, cited as "owner/name path"
        assert (ROOT / m[0]).exists(), m[0]


def test_the_h200_profile_agrees_with_the_measured_figures_it_cites():
    figures = json.loads((ROOT / "docs/results/h200/anchors-2026-11-21.json").read_text())["figures"]
    limits = tomllib.loads((ROOT / "profiles/h200.toml").read_text())["limits"]
    for attr, key in (("MultiProcessorCount", "sm_count"), ("MaxSharedMemoryPerBlockOptin", "smem_per_block_optin"),
                      ("MaxSharedMemoryPerMultiprocessor", "smem_per_sm"), ("MaxSharedMemoryPerBlock", "smem_per_block"),
                      ("L2CacheSize", "l2_bytes"), ("MaxRegistersPerBlock", "regs_per_block"),
                      ("MaxRegistersPerMultiprocessor", "regs_per_sm")):
        assert figures[f"attr.{attr}"] == limits[key], key
