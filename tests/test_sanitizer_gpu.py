"""compute-sanitizer on the small launches of tools/sanitize.py: memcheck (out-of-bounds and misaligned accesses)
and racecheck (shared-memory hazards) must report nothing for any kernel family. Each case runs the tool over a
child process (`compute-sanitizer --tool T python tools/sanitize.py FAMILY`); skipped without a GPU or without
compute-sanitizer on PATH. The cases that encode tensor maps load cuda-bindings, whose driver probes the tool would
count as host API errors (tools/sanitize.py's docstring): `--report-api-errors no` keeps the device findings."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("attention", "tma", "backward", "tma-backward", "decode", "gemm", "skinny", "moe")
# the tool's last line: "ERROR SUMMARY: 0 errors" (memcheck), "RACECHECK SUMMARY: 0 hazards displayed (0 errors,
# 0 warnings)" (racecheck)
_CLEAN = {"memcheck": re.compile(r"ERROR SUMMARY: 0 errors"),
          "racecheck": re.compile(r"RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)")}


@pytest.mark.parametrize("tool", sorted(_CLEAN))
@pytest.mark.parametrize("family", FAMILIES)
def test_sanitizer_reports_nothing(tool, family):
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on PATH")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [exe, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", "99", sys.executable,
           "tools/sanitize.py", family]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert f"sanitize: {family} ran" in out, f"{' '.join(cmd[1:])} did not finish (rc {run.returncode}):\n{out[-4000:]}"
    assert run.returncode == 0 and _CLEAN[tool].search(out), f"{tool} on {family}:\n{out[-6000:]}"
