"""The package's compiled kernels and plans, looked up once per device (the MoE ops' launches themselves go through
``cukernels.launch``).

``cukernels.compile.kernel`` caches by (device, source, options, name expression) but builds its key from the
current device on every call, and the planners walk their candidates: the ops' cache misses ask here instead, keyed
by the device id, so building a call's launchers stays a few dictionary lookups.
"""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from cukernels import compile as _compile
from cukernels import device as _device

KERNELS = Path(__file__).parent / "kernels"
ROUTE_SOURCE = KERNELS / "route.cu"
DISPATCH_SOURCE = KERNELS / "dispatch.cu"


def device_id() -> int:
    import cupy

    return cupy.cuda.Device().id


@functools.lru_cache(maxsize=None)
def _kernel(dev: int, source: Path, name_expression: str) -> _compile.Kernel:
    return _compile.kernel(source, name_expression)


def kernel(source: Path, name_expression: str) -> _compile.Kernel:
    if _compile._BUILT_WITH:  # a kernels_built_with block is open: the engine's lookup applies its options
        return _compile.kernel(source, name_expression)
    return _kernel(device_id(), source, name_expression)


@contextlib.contextmanager
def kernels_built_with(options: tuple[str, ...], name_part: str = ""):
    """``cukernels.compile.kernels_built_with`` (the kernels whose name expression contains ``name_part`` built
    with the extra compile ``options``; tools/layer_ab.py, tools/decode_timeline.py), with the package's plan cache
    cleared on entry and exit; yields the list of the kernels so built. Calls an op cached meanwhile keep the
    kernels they were made with (the caller clears the op caches). The op caches are keyed by the arrays' shapes,
    not their pointers: a ``grouped_gemm`` call cached before the block serves same-shaped arrays inside it, and one
    built inside serves them after it. An A/B clears ``moe.grouped_gemm._GEMM`` (or ``moe.layer._LAYER``) before
    each variant's block and keeps the call object built there (docs/results/h100/stop66/zero_rows/zero_ab2.py)."""
    _plan.cache_clear()
    try:
        with _compile.kernels_built_with(options, name_part) as built:
            yield built
    finally:
        _plan.cache_clear()


@functools.lru_cache(maxsize=None)
def _spec(dev: int) -> _device.DeviceSpec:
    return _device.current()


def spec() -> _device.DeviceSpec:
    return _spec(device_id())


@functools.lru_cache(maxsize=4096)
def _plan(dev: int, planner, problem):
    return planner(problem, _spec(dev)) if problem is not None else planner(_spec(dev))


def plan(planner, problem=None):
    """``planner(problem, spec)`` (or ``planner(spec)``) for the current device, cached."""
    return _plan(device_id(), planner, problem)
