"""The bench loop shared by ``attention.bench`` and ``moe.bench``: check, then time, then check again.

An op supplies its cases (from its suites registry), fresh random inputs, an fp32 reference and a check; each
implementation supplies a callable that launches the work and returns the output. For every case the loop
checks every implementation's output against the reference (on poisoned memory), then times the ones that
passed with the one timer, rechecks the output of the timed runs, and records peak device memory. A result
with a failed check is reported as failed, never as fast.

Within a case every implementation is timed the same way: device time with the stream held (timing.py) when
all of them enqueue without waiting for the device, otherwise all of them unheld (host time included), so a
baseline that synchronises is never set against our device time alone. ``Result.clocks["held"]`` records it.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

from . import checks as _checks
from . import device as _device
from . import timing as _timing


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    params: Mapping[str, Any]
    tags: tuple[str, ...] = ()
    flops: float = 0.0  # useful floating-point operations of one call
    bytes: float = 0.0  # fewest bytes one call must move through device memory
    dtype: str = "bf16"  # selects the peak FLOP/s the case is judged against


@dataclasses.dataclass(frozen=True, kw_only=True)
class Impl:
    name: str
    # (case, inputs) -> a callable that enqueues the work on the current stream and returns its output
    prepare: Callable[[Case, Any], Callable[[], Any]]
    baseline: bool = False  # others are compared against the best baseline
    unavailable: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    supports: Callable[[Case], str | None] = lambda case: None  # why it cannot run this case, or None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Op:
    name: str
    make_inputs: Callable[[Case, int], Any]  # fresh random inputs for a seed
    reference: Callable[[Case, Any], Any]  # higher-precision reference output
    check: Callable[[Case, Any, Any], Sequence[_checks.CheckResult]]  # (case, output, reference)
    poison_bytes: Callable[[Case], int] = lambda case: 0  # how much pool memory to poison before the check call


@dataclasses.dataclass(kw_only=True)
class Result:
    case: str
    impl: str
    params: dict
    tags: list
    baseline: bool
    status: str  # ok | failed-check | error | skipped
    reason: str = ""
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    rel_noise: float | None = None
    samples: int = 0
    converged: bool = False
    tflops: float | None = None
    gbs: float | None = None
    pct_peak: float | None = None  # of the roof that bounds this case (FLOP/s or bandwidth)
    speedup_vs_best_baseline: float | None = None
    best_baseline: str | None = None
    checks: list = dataclasses.field(default_factory=list)
    clocks: dict = dataclasses.field(default_factory=dict)
    throttled: bool = False
    peak_memory_bytes: int | None = None
    plan: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_MEASURING_POOLS: list = []  # kept alive: arrays a call caches (workspaces) may live on in them


def peak_memory(fn: Callable[[], Any]) -> int:
    """Peak device memory one call allocates, through CuPy and (when imported) torch. The call runs with a fresh
    CuPy memory pool, which keeps freed blocks cached, so its size afterwards is the most the call held at once;
    torch's allocator reports its own peak. Blocks the call freed go back to the device afterwards."""
    import cupy

    torch = sys.modules.get("torch")
    pool = cupy.cuda.MemoryPool()
    cupy.cuda.get_current_stream().synchronize()
    if torch is not None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch_base = torch.cuda.memory_allocated()
    with cupy.cuda.using_allocator(pool.malloc):
        out = fn()
        cupy.cuda.get_current_stream().synchronize()
    torch_peak = 0
    if torch is not None:
        torch.cuda.synchronize()
        torch_peak = torch.cuda.max_memory_allocated() - torch_base
    del out
    peak = pool.total_bytes()
    pool.free_all_blocks()
    if pool.used_bytes():  # something the call cached lives in this pool: keep the pool alive
        _MEASURING_POOLS.append(pool)
    return int(peak + torch_peak)


def torch_on_cupy_stream():
    """Context that makes torch enqueue on CuPy's current stream, so that the timer's events (recorded by CuPy)
    bracket torch's kernels. On the legacy default stream both libraries already share stream 0."""
    import contextlib

    import cupy
    import torch

    ptr = cupy.cuda.get_current_stream().ptr
    if ptr == 0 or torch.cuda.current_stream().cuda_stream == ptr:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr))


def _roofline(case: Case, median_ms: float, spec: _device.DeviceSpec | None):
    seconds = median_ms * 1e-3
    tflops = case.flops / seconds / 1e12 if case.flops else None
    gbs = case.bytes / seconds / 1e9 if case.bytes else None
    pct = None
    if spec is not None and spec.peaks is not None:
        shares = []
        if tflops is not None and spec.peaks.tflops(case.dtype) > 0:
            shares.append(tflops / spec.peaks.tflops(case.dtype))
        if gbs is not None and spec.peaks.mem_bandwidth_gbs > 0:
            shares.append(gbs / spec.peaks.mem_bandwidth_gbs)
        pct = 100 * max(shares) if shares else None
    return tflops, gbs, pct


def _progress(msg: str, stream) -> None:
    if stream is not None:
        print(f"\r\033[K{msg}", end="", file=stream, flush=True)


def run(
    op: Op,
    cases: Sequence[Case],
    impls: Sequence[Impl],
    *,
    seed: int = 0,
    budget_ms: float = 400.0,
    rel_noise_target: float = 0.01,
    plan_of: Callable[[Case], str | None] = lambda case: None,
    progress=sys.stderr,
) -> list[Result]:
    """Check and time every implementation on every case; returns one ``Result`` per pair."""
    spec = _device.current()
    results: list[Result] = []
    total = len(cases) * len(impls)
    t0 = time.perf_counter()
    import cupy

    for ci, case in enumerate(cases):
        cupy.get_default_memory_pool().free_all_blocks()  # the last case's buffers go back (torch needs room too)
        inputs = op.make_inputs(case, seed + ci)
        reference = op.reference(case, inputs)
        ready = []  # (base, impl, fn, checks, plan) of the implementations whose first output passed
        for ii, impl in enumerate(impls):
            done = ci * len(impls) + ii
            _progress(f"[{done + 1}/{total} {time.perf_counter() - t0:.0f}s] {case.name} / {impl.name}", progress)
            base = dict(case=case.name, impl=impl.name, params=dict(case.params), tags=list(case.tags),
                        baseline=impl.baseline)
            why = impl.unavailable() or impl.supports(case)
            if why:
                results.append(Result(**base, status="skipped", reason=why))
                continue
            try:
                outcome = _check_first(op, case, impl, inputs, reference, base, plan_of)
            except Exception as exc:  # reported, never hidden: the table shows the error
                outcome = _error(base, exc)
            if isinstance(outcome, Result):
                results.append(outcome)
            else:
                ready.append(outcome)
        hold = all(_timing.can_hold(fn) for _, _, fn, _, _ in ready)
        for base, impl, fn, checks, plan in ready:
            _progress(f"[{time.perf_counter() - t0:.0f}s] timing {case.name} / {impl.name}", progress)
            try:
                results.append(_time(op, case, fn, reference, base, checks, plan, spec, budget_ms,
                                     rel_noise_target, hold))
            except Exception as exc:
                results.append(_error(base, exc))
    _progress("", progress)
    _rank(results)
    return results


def _error(base: dict, exc: Exception) -> Result:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return Result(**base, status="error", reason=last[:300])


def _check_first(op, case, impl, inputs, reference, base, plan_of):
    """The implementation's first output against the reference: a failed-check Result, or what timing needs."""
    fn = impl.prepare(case, inputs)
    _checks.poison_pool(op.poison_bytes(case))
    first = op.check(case, fn(), reference)
    checks = [dataclasses.asdict(c) for c in first]
    plan = plan_of(case) if not impl.baseline else None
    if not all(c.passed for c in first):
        bad = "; ".join(str(c) for c in first if not c.passed)
        return Result(**base, status="failed-check", reason=bad[:300], checks=checks, plan=plan)
    return base, impl, fn, checks, plan


def _time(op, case, fn, reference, base, checks, plan, spec, budget_ms, rel_noise_target, hold) -> Result:
    t = _timing.benchmark(fn, budget_ms=budget_ms, rel_noise_target=rel_noise_target, hold=hold)
    again = op.check(case, fn(), reference)  # the timed runs must still be right
    checks = checks + [dict(dataclasses.asdict(c), name=c.name + " (after timing)") for c in again]
    status, reason = "ok", ""
    if not all(c.passed for c in again):
        status, reason = "failed-check", "after timing: " + "; ".join(str(c) for c in again if not c.passed)
    tflops, gbs, pct = _roofline(case, t.median_ms, spec)
    mem = peak_memory(fn)
    return Result(**base, status=status, reason=reason, median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms,
                  rel_noise=t.rel_noise, samples=t.samples, converged=t.converged, tflops=tflops, gbs=gbs,
                  pct_peak=pct, checks=checks, clocks=t.clocks, throttled=t.throttled, peak_memory_bytes=mem,
                  plan=plan)


def _rank(results: list[Result]) -> None:
    """Speedup of every result over the fastest passing baseline of its case (baseline ms / this ms)."""
    by_case: dict[str, list[Result]] = {}
    for r in results:
        by_case.setdefault(r.case, []).append(r)
    for rows in by_case.values():
        baselines = [r for r in rows if r.baseline and r.ok]
        if not baselines:
            continue
        best = min(baselines, key=lambda r: r.median_ms)
        for r in rows:
            if r.ok and r.median_ms and not math.isnan(r.median_ms):
                r.speedup_vs_best_baseline = best.median_ms / r.median_ms
                r.best_baseline = best.impl
