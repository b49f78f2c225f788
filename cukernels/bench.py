"""The bench loop shared by ``attention.bench`` and ``moe.bench``: check, then time, then check again.

An op supplies its cases (from its suites registry), fresh random inputs, an fp32 reference and a check; each
implementation supplies a callable that launches the work and returns the output. For every case the loop
checks every implementation's output against the reference (on poisoned memory), then times the ones that
passed with the one timer, rechecks the output of the timed runs, and records peak device memory. A result
with a failed check is reported as failed, never as fast.

Every row has three times, all of the same callable (the public call, as ``Impl.prepare`` returns it):

- held device time (``median_ms``): the one timer, events around the work, L2 flushed, the stream held while the
  host enqueues (below). It says how good the kernels are.
- time as called (``as_called_ms``): wall time per call of back-to-back calls with one device synchronisation at
  the end, no flush (``timing.as_called``). It is what a user gets: host and device overlapped.
- host µs per call (``host_us``): calls enqueued behind the holding kernel, timed on the host (``timing.host_us``):
  the Python and launch cost alone, which decides the tiny problems of the ``overhead`` suites. A call that waits
  for the device is timed without the hold and says so (``host_us_held`` False).

The last two are taken once, after the first round (after the last one when the case is interleaved, below).

Within a case every implementation is timed the same way: device time with the stream held (timing.py) when
all of them enqueue without waiting for the device, otherwise all of them unheld (host time included), so a
baseline that synchronises is never set against our device time alone. ``Result.clocks["held"]`` records it.
In such a case a row whose own call does not wait for the device is also timed held once (``held_ms``): its device
time, for figures about the device alone (a decode layer's bandwidth); its ratios keep the common way.

Host time drifts over seconds (and a small kernel's time between allocations of its inputs), which one burst of
samples cannot see. So a row timed with host time, and a row whose samples did not reach their noise target, is
timed in ``rounds`` rounds spread over the run: the first where its case comes, the others in sweeps over those
rows after the last case (fresh inputs from the same seed, the same held or unheld timing, checked again after
each round). ``timing.pool`` joins them; the row states the larger of its samples' spread and its round medians'
spread as its noise (``rel_noise``; ``round_medians_ms`` and ``round_noise`` keep the parts), which is what
``cukernels.compare`` sets a rerun against.

A device-time case (the default, ``interleave``) times its implementations in turns instead: ``rounds`` rounds of a
``rounds``-th of the budget each, the order rotated every round, pooled with each round one vote (the median of the
round medians: ``timing.pool(by_round=True)``), and what a user gets is taken after the last round. A long kernel
timed back to back for seconds warms the card and its clock falls, so one block per implementation favours the one
timed first: on a warm H100 (docs/perf/attention.md, stop 50) the blocks put ours at 1.04-1.19x cuDNN on seed004's
causal cases where turns put it at 0.96-1.03x. ``--no-interleave`` (or ``interleave=False``) keeps the blocks: the
first round with the whole budget, more rounds as above only for the rows that need them.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
import traceback
import zlib
from typing import Any, Callable, Mapping, Sequence

from . import checks as _checks
from . import device as _device
from . import launch as _launch
from . import timing as _timing


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    params: Mapping[str, Any]
    tags: tuple[str, ...] = ()
    flops: float = 0.0  # useful floating-point operations of one call
    bytes: float = 0.0  # fewest bytes one call must move through device memory
    dtype: str = "bf16"  # selects the peak FLOP/s the case is judged against


def case_seed(case: Case | str, seed: int = 0) -> int:
    """The seed of a case's inputs in a run with ``seed``: ``seed`` plus a hash of the case's name, so a case gets
    the same inputs whichever other cases run beside it (a ``--case`` filter, a tool timing one case, a table
    computed from the inputs after the run). Below 10^6 plus ``seed``, so derived seeds (``3 * seed + 2``) stay small."""
    name = case if isinstance(case, str) else case.name
    return seed + zlib.crc32(name.encode()) % 1_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Impl:
    name: str
    # (case, inputs) -> a callable that enqueues the work on the current stream and returns its output
    prepare: Callable[[Case, Any], Callable[[], Any]]
    baseline: bool = False  # others are compared against the best baseline
    unavailable: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    supports: Callable[[Case], str | None] = lambda case: None  # why it cannot run this case, or None
    # the plan this implementation runs, where it is not the op's (the bench's plan_of) - a variant planned apart
    plan_of: Callable[[Case], str | None] | None = None


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
    round_medians_ms: list = dataclasses.field(default_factory=list)  # host-time rows: one median per round
    round_noise: float | None = None  # host-time rows: half the range of the round medians over the median
    checks: list = dataclasses.field(default_factory=list)
    clocks: dict = dataclasses.field(default_factory=dict)
    throttled: bool = False
    peak_memory_bytes: int | None = None
    plan: str | None = None
    as_called_ms: float | None = None  # wall time per call, back to back with one synchronisation at the end
    host_us: float | None = None  # host time per call
    host_us_held: bool | None = None  # False: the call waits for the device, and host_us includes the wait
    launches: int | None = None  # kernel launches per call through the engine (launch.count_launches)
    # how many times as_called_ms and host_us were taken together (_take_user_times): over 1 where a held host time
    # per call read over HOST_OVER_CALLED x the wall time per call; host_consistent() says whether the last pair holds
    user_times_takes: int | None = None
    # A row timed with host time because another implementation of its case waits for the device, whose own call
    # does not: its device time, held (median_ms stays the case's common way, which its ratios use)
    held_ms: float | None = None
    # run(sustained_s=...): the call back to back for seconds, in two passes (timing.sustained, merge_sustained):
    # ms, mJ, W and SM clock per call where a card settles at its power limit; with "speedup_vs_best_baseline"
    sustained: dict | None = None

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


@functools.cache
def torch_unavailable() -> str | None:
    """Why torch baselines cannot run here (not installed, or no CUDA device for it), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'cukernels[torch]')"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


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


ROUNDS = 5  # rounds of a row timed with host time, left unsettled by its first round or throttled in it, spread
# over the run
_ROUND_MIN_SAMPLES = 5  # per round, when a row is timed in rounds (10 in one round otherwise)
_HELD_MS_BUDGET = 100.0  # ms: a host-time row's own held device time (Result.held_ms), one timer call


def _free_pool() -> None:
    """The last case's buffers go back to the device (torch needs room too)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


@dataclasses.dataclass(kw_only=True)
class _Timed:
    """A row being timed: the rounds so far, and what the checks after them said."""
    case: Case
    impl: Impl
    base: dict
    checks: list
    plan: str | None
    rounds: list = dataclasses.field(default_factory=list)  # one timing.Timing per round
    interleaved: bool = False  # its rounds were turns of equal budget (pooled by round: timing.pool)
    failed: str = ""  # the first failed check after a round
    peak_memory_bytes: int | None = None
    as_called_ms: float | None = None
    host_us: float | None = None
    host_us_held: bool | None = None
    launches: int | None = None
    user_times_takes: int | None = None
    held_ms: float | None = None
    holdable: bool = False  # its own call enqueues without waiting for the device (timing.can_hold)
    sustained: list = dataclasses.field(default_factory=list)  # timing.sustained passes
    error: Result | None = None

    @property
    def host_time(self) -> bool:
        return self.rounds[0].clocks.get("held") is False

    @property
    def unsettled(self) -> bool:
        """Timed with host time, its first round ended above the noise target, or the clock was pulled down (power
        or thermal cap) during it: it needs more rounds. A capped card's clock depends on what ran just before, so a
        row timed in one block can land 10-20 % off its baseline timed in another (H200, stop 43: the gemm suite's
        `_grouped_mm` ratios moved by up to 20 % between two runs); rounds spread over the run time every
        implementation of a case in each sweep, close together."""
        return self.host_time or not self.rounds[0].converged or bool(self.rounds[0].clocks.get("throttled"))


def run(
    op: Op,
    cases: Sequence[Case],
    impls: Sequence[Impl],
    *,
    seed: int = 0,
    budget_ms: float = 400.0,
    rel_noise_target: float = 0.01,
    rounds: int = ROUNDS,
    plan_of: Callable[[Case], str | None] = lambda case: None,
    progress=sys.stderr,
    interleave: bool = True,
    sustained_s: float = 0.0,
) -> list[Result]:
    """Check and time every implementation on every case; returns one ``Result`` per pair. ``interleave`` (the
    default): a device-time case times its implementations in ``rounds`` rounds taken in turn, the order rotated
    each round (each gets a ``rounds``-th of the budget per round); False: one block each, in ``impls`` order, and
    more rounds later only for rows that need them. ``sustained_s`` > 0: after a case's timing, each of its rows
    is also called back to back for that many seconds in all (``Result.sustained``: two passes of half of it, the
    rows in order and then in reverse, so no row always follows the others' heat)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not (isinstance(sustained_s, (int, float)) and sustained_s >= 0 and math.isfinite(sustained_s)):
        raise ValueError(f"sustained_s must be a number >= 0, got {sustained_s!r}")
    spec = _device.current()
    rows: list[Result | _Timed] = []
    revisit: list[tuple[int, Case, list[_Timed]]] = []  # cases with rows that need more rounds
    total = len(cases) * len(impls)
    t0 = time.perf_counter()
    timer = dict(rel_noise_target=rel_noise_target)

    for ci, case in enumerate(cases):
        inputs = reference = ready = None  # the last case's buffers go before this case's are made
        _free_pool()
        inputs = op.make_inputs(case, case_seed(case, seed))
        reference = op.reference(case, inputs)
        ready = []  # (_Timed, fn) of the implementations whose first output passed
        for ii, impl in enumerate(impls):
            done = ci * len(impls) + ii
            _progress(f"[{done + 1}/{total} {time.perf_counter() - t0:.0f}s] {case.name} / {impl.name}", progress)
            base = dict(case=case.name, impl=impl.name, params=dict(case.params), tags=list(case.tags),
                        baseline=impl.baseline)
            why = impl.unavailable() or impl.supports(case)
            if why:
                rows.append(Result(**base, status="skipped", reason=why))
                continue
            try:
                outcome = _check_first(op, case, impl, inputs, reference, base, plan_of)
            except Exception as exc:  # reported, never hidden: the table shows the error
                outcome = _error(base, exc)
            if isinstance(outcome, Result):
                rows.append(outcome)
            else:
                ready.append(outcome)
        for timed, fn in ready:  # each row's own probe, once: the case's way and a host-time row's held_ms
            timed.holdable = _timing.can_hold(fn)
        hold = all(timed.holdable for timed, _ in ready)
        if interleave and hold and rounds > 1 and len(ready) > 1:
            _time_interleaved(op, case, ready, reference, rounds, dict(timer, hold=True, budget_ms=budget_ms / rounds,
                                                                    min_samples=_ROUND_MIN_SAMPLES), progress, t0)
            rows.extend(timed for timed, _ in ready)
            _take_sustained(case, ready, sustained_s, progress, t0)
            continue
        if hold or rounds == 1:  # the whole budget; more rounds later if the samples do not settle
            first = dict(timer, hold=hold, budget_ms=budget_ms, min_samples=10)
        else:  # a host-time case needs every round: this one gets its share of the budget
            first = dict(timer, hold=False, budget_ms=budget_ms / rounds, min_samples=_ROUND_MIN_SAMPLES)
        for timed, fn in ready:
            _progress(f"[{time.perf_counter() - t0:.0f}s] timing {case.name} / {timed.impl.name}", progress)
            rows.append(timed)
            try:
                _time_round(op, case, timed, fn, reference, rounds, **first)
                _take_user_times(timed, fn, first)
            except Exception as exc:
                timed.error = _error(timed.base, exc)
        _take_sustained(case, ready, sustained_s, progress, t0)
        again = [t for t, _ in ready if t.error is None and t.unsettled]
        if again and rounds > 1:
            revisit.append((ci, case, again))

    later = dict(timer, budget_ms=budget_ms / rounds, min_samples=_ROUND_MIN_SAMPLES)
    for r in range(2, rounds + 1):
        for ci, case, timed_rows in revisit:
            live = [t for t in timed_rows if t.error is None]
            inputs = reference = ready = None  # the last inputs go before the pool is emptied
            try:
                _free_pool()
                inputs = op.make_inputs(case, case_seed(case, seed))
                reference = op.reference(case, inputs)
            except Exception as exc:
                for t in live:
                    t.error = _error(t.base, exc)
                continue
            for t in live:
                _progress(f"[{time.perf_counter() - t0:.0f}s] round {r}/{rounds} {case.name} / {t.impl.name}",
                          progress)
                try:
                    _time_round(op, case, t, t.impl.prepare(case, inputs), reference, rounds, hold=not t.host_time,
                                **later)
                except Exception as exc:
                    t.error = _error(t.base, exc)
    _progress("", progress)
    results = [row if isinstance(row, Result) else _result(row, spec) for row in rows]
    _rank(results)
    return results


def _error(base: dict, exc: Exception) -> Result:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return Result(**base, status="error", reason=last[:300])


def _check_first(op, case, impl, inputs, reference, base, plan_of):
    """The implementation's first output against the reference: a failed-check Result, or (_Timed, fn)."""
    fn = impl.prepare(case, inputs)
    _checks.poison_pool(op.poison_bytes(case))
    try:
        out = fn()
    finally:
        _checks.stop_poisoning()
    first = op.check(case, out, reference)
    checks = [dataclasses.asdict(c) for c in first]
    plan = (impl.plan_of or plan_of)(case) if not impl.baseline else None
    if not all(c.passed for c in first):
        bad = "; ".join(str(c) for c in first if not c.passed)
        return Result(**base, status="failed-check", reason=bad[:300], checks=checks, plan=plan)
    return _Timed(case=case, impl=impl, base=base, checks=checks, plan=plan), fn


def _time_interleaved(op, case, ready, reference, rounds: int, timer: dict, progress, t0: float) -> None:
    """``run(interleave=True)``: every implementation of ``case`` timed in ``rounds`` rounds taken in turn, round r
    starting at the r-th implementation; what a user gets is taken after the last round."""
    for timed, _ in ready:
        timed.interleaved = True
    for r in range(rounds):
        k = r % len(ready)
        for timed, fn in ready[k:] + ready[:k]:
            if timed.error is not None:
                continue
            _progress(f"[{time.perf_counter() - t0:.0f}s] round {r + 1}/{rounds} {case.name} / {timed.impl.name}",
                      progress)
            try:
                _time_round(op, case, timed, fn, reference, rounds, **timer)
            except Exception as exc:
                timed.error = _error(timed.base, exc)
    for timed, fn in ready:
        if timed.error is not None:
            continue
        try:
            _take_user_times(timed, fn, timer)
        except Exception as exc:
            timed.error = _error(timed.base, exc)


# A held burst's host time per call cannot exceed the wall time per call of the same calls back to back, which
# includes it. A row whose host µs read over HOST_OVER_CALLED x its as-called µs caught the host in another state
# than the as-called repeats did (on the lent machines, stretches of milliseconds where every Python call costs
# 1.5-10x its usual host time: docs/perf/engine.md, stop 67): both are taken again, USER_TIMES_TAKES times at most.
HOST_OVER_CALLED = 1.2
USER_TIMES_TAKES = 3


def host_consistent(host_us: float | None, as_called_ms: float | None, held: bool | None) -> bool:
    """Whether a row's held host µs per call is within HOST_OVER_CALLED of its wall µs per call as called (True
    where either is missing or the host time was not held: an unheld burst includes the device's time too)."""
    if host_us is None or as_called_ms is None or not held:
        return True
    return host_us <= HOST_OVER_CALLED * as_called_ms * 1e3


def _take_user_times(timed: _Timed, fn, timer: dict) -> None:
    """What a user gets, taken once per row: the time as called, the host µs per call (the pair taken again where
    they disagree: ``host_consistent``), the peak memory; and a host-time row's own device time where its call can
    be held (``Result.held_ms``)."""
    if timed.host_time and timed.holdable:
        timed.held_ms = _timing.benchmark(fn, **dict(timer, hold=True, budget_ms=_HELD_MS_BUDGET,
                                                     min_samples=10)).median_ms
    for take in range(1, USER_TIMES_TAKES + 1):
        timed.as_called_ms = _timing.as_called(fn)
        timed.host_us, timed.host_us_held = _timing.host_us(fn, per_call_ms=timed.as_called_ms)
        timed.user_times_takes = take
        if host_consistent(timed.host_us, timed.as_called_ms, timed.host_us_held):
            break
    timed.launches = _launch.count_launches(fn)
    timed.peak_memory_bytes = peak_memory(fn)


def _take_sustained(case, ready, seconds: float, progress, t0: float) -> None:
    """``run(sustained_s=...)``: each row of the case back to back for ``seconds`` / 2, in order, then again in
    reverse order (timing.sustained)."""
    if seconds <= 0:
        return
    live = [(t, fn) for t, fn in ready if t.error is None]
    for order in (live, live[::-1]):
        for timed, fn in order:
            _progress(f"[{time.perf_counter() - t0:.0f}s] sustained {case.name} / {timed.impl.name}", progress)
            try:
                timed.sustained.append(_timing.sustained(fn, seconds / 2))
            except Exception as exc:
                timed.error = _error(timed.base, exc)


def _time_round(op, case, timed: _Timed, fn, reference, rounds: int, **timer) -> None:
    """One round of timing, then the check of the timed runs' output (they must still be right)."""
    timed.rounds.append(_timing.benchmark(fn, **timer))
    again = op.check(case, fn(), reference)
    label = " (after timing)" if len(timed.rounds) == 1 else f" (after round {len(timed.rounds)}/{rounds})"
    timed.checks += [dict(dataclasses.asdict(c), name=c.name + label) for c in again]
    if not timed.failed and not all(c.passed for c in again):
        timed.failed = label.strip(" ()") + ": " + "; ".join(str(c) for c in again if not c.passed)


def _result(timed: _Timed, spec) -> Result:
    if timed.error is not None:
        return timed.error
    t = _timing.pool(timed.rounds, by_round=timed.interleaved)
    tflops, gbs, pct = _roofline(timed.case, t.median_ms, spec)
    return Result(**timed.base, status="failed-check" if timed.failed else "ok", reason=timed.failed,
                  median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, rel_noise=t.rel_noise, samples=t.samples,
                  converged=t.converged, tflops=tflops, gbs=gbs, pct_peak=pct,
                  round_medians_ms=list(t.round_medians_ms), round_noise=t.round_noise, checks=timed.checks,
                  clocks=t.clocks, throttled=t.throttled, peak_memory_bytes=timed.peak_memory_bytes,
                  plan=timed.plan, as_called_ms=timed.as_called_ms, host_us=timed.host_us,
                  host_us_held=timed.host_us_held, launches=timed.launches,
                  user_times_takes=timed.user_times_takes, held_ms=timed.held_ms,
                  sustained=_timing.merge_sustained(timed.sustained) if timed.sustained else None)


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
        steady = [r for r in baselines if r.sustained and r.sustained.get("ms_per_call")]
        if steady:  # the same against the fastest baseline back to back (it may be another one)
            fast = min(steady, key=lambda r: r.sustained["ms_per_call"])
            for r in rows:
                if r.ok and r.sustained and r.sustained.get("ms_per_call"):
                    r.sustained["speedup_vs_best_baseline"] = fast.sustained["ms_per_call"] / r.sustained["ms_per_call"]
                    r.sustained["best_baseline"] = fast.impl
