"""The environment a result was measured in: GPU, driver, CUDA/NVRTC, CuPy, git revision, clocks."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

from . import __version__
from . import device as _device
from . import timing as _timing


def git_revision() -> str | None:
    """The checkout's commit (``-dirty`` with local changes); ``CUKERNELS_REVISION`` stands in where the tree was
    copied without its .git (a remote GPU machine)."""
    if os.environ.get("CUKERNELS_REVISION"):
        return os.environ["CUKERNELS_REVISION"]
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict:
    out = {"python": platform.python_version(), "cukernels": __version__}
    try:
        import numpy

        out["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        import cupy

        out["cupy"] = cupy.__version__
        from cupy_backends.cuda.libs import nvrtc

        out["nvrtc"] = "%d.%d" % nvrtc.getVersion()
    except Exception:
        pass
    try:
        import cupy

        rt = cupy.cuda.runtime.runtimeGetVersion()
        out["cuda_runtime"] = f"{rt // 1000}.{rt % 1000 // 10}"
        drv = cupy.cuda.runtime.driverGetVersion()
        out["cuda_driver_api"] = f"{drv // 1000}.{drv % 1000 // 10}"
    except Exception:
        pass
    import sys

    if "torch" in sys.modules:
        out["torch"] = sys.modules["torch"].__version__
    return out


def tuning(spec: _device.DeviceSpec | None) -> dict:
    """Whether the planners could have used tuned configs (``cukernels/tune.py``): the live GPU's tuned-config cache
    file where one exists (None otherwise, or when it cannot be told) and ``CUKERNELS_TUNED`` ("0": not used)."""
    path = None
    try:
        if spec is not None:
            from . import tune

            cache = tune.TuneCache.for_device(spec)
            path = str(cache.path) if cache.path.is_file() else None
    except Exception:  # provenance never fails a run
        path = None
    return {"tune_cache": path, "tuned": os.environ.get("CUKERNELS_TUNED", "1")}


def collect() -> dict:
    """Everything that identifies where and with what a measurement was taken."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "git_revision": git_revision(),
        "versions": _versions(),
    }
    spec = None
    if _device.gpu_available():
        spec = _device.current()
        env["gpu"] = {"name": spec.name, "profile": spec.key, "compute_capability": list(spec.compute_capability),
                      "arch": spec.arch, **spec.limits()}
        env["nvml"] = {**_device.nvml_info(), **_device.nvml_sample()}
    else:
        env["gpu"] = None
    env.update(tuning(spec))
    # how the held timer empties L2 between samples: results before stop 58 (a memset) carry the flush's write-back
    env["l2_flush"] = _timing.L2_FLUSH
    return env
