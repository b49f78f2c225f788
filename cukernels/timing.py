"""The one timer.

CUDA events around the work only; a warm-up first (module load, compilation, allocator warm-up stay out);
the L2 cache flushed between samples by a read of twice the device's L2 size, outside the timed region (a read,
not a memset: see ``flush_l2``);
the median with its p20–p80 spread; stop when the relative noise is under target or the time budget is spent.

Device time, not host time: before each sample a tiny kernel holds the stream until the host has enqueued
the work and both events (kernels/block_stream.cu), so a call whose host side (Python, allocations, launches)
is slower than its kernels is measured by its kernels, the same in every run, instead of by a race between the
host and the end of the L2 flush. Work that synchronises the host itself cannot be held back that way; the
timer notices (the holding kernel times out), drops those samples and times without holding
(``clocks["held"]`` says which). A sample is nvbench's cold measurement: the flush, the host waits for it, the
hold, the events around the work (``SAMPLE_ORDER`` = "flush-sync"). Until stop 63 the host did not wait for the
flush, so a call shorter than the flush was timed in one of two regimes by the host's speed: its launch queued
behind the running flush (a fast host), or reaching the device after it; a kernel that follows the flush at once
reads 0.4-1.5 us slower on an H100 / H200 (ours, a plain CuPy kernel, triton's, torch's own sum; not cuDNN's:
docs/perf/engine.md, stops 62-63). ``SAMPLE_ORDER`` keeps the other orders for probes.
NVML clock and throttle-reason samples taken during the run are attached to the result, so a throttled
measurement is visible as such.

Relative noise is half the p20–p80 spread over the median (for a normal distribution about 0.84 sigma/median).

Host time also moves on a scale of seconds (the interpreter, the allocators, the CPU's clock and the core the
process runs on), which one burst of samples cannot see: its p20–p80 band may sit wholly above or below the band
of the same call timed a few seconds later or in another process. ``pool`` joins rounds of the same work timed
at different moments of a run (``bench.run`` spreads them over the run) into one figure whose noise is the
larger of the two spreads: of all the samples, and of the round medians (half their range over the median).

What a user gets is timed apart from ``benchmark``: ``as_called`` is the wall time per call of back-to-back calls
with one device synchronisation at the end (host and device overlap, no hold, no flush), ``host_us`` the host's
own time per call, taken while the holding kernel keeps the device from stalling the host. ``sustained`` keeps
a card busy with the call for seconds, as a training loop does, and reads time, energy and clock per call there:
at a power limit the clock, and so the time, follow the energy a call spends.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import device as _device


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    rel_noise: float
    samples: int
    converged: bool
    clocks: dict
    times_ms: tuple[float, ...] = dataclasses.field(default=(), repr=False)  # every sample, in order
    round_medians_ms: tuple[float, ...] = ()  # with several rounds (``pool``): the median of each
    round_noise: float | None = None  # with several rounds: half the range of the round medians over the median

    @property
    def throttled(self) -> bool:
        return bool(self.clocks.get("throttled", False))

    def __str__(self) -> str:
        return f"{self.median_ms:.4f} ms ±{100 * self.rel_noise:.1f}% (n={self.samples})"


def summarize(samples_ms, *, converged: bool = True, clocks: dict | None = None) -> Timing:
    """Statistics of a list of per-sample times (ms)."""
    arr = np.asarray(samples_ms, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("summarize needs at least one sample")
    med = float(np.median(arr))
    p20, p80 = (float(v) for v in np.percentile(arr, [20, 80]))
    noise = (p80 - p20) / (2 * med) if med > 0 else 0.0
    return Timing(
        median_ms=med,
        p20_ms=p20,
        p80_ms=p80,
        min_ms=float(arr.min()),
        rel_noise=noise,
        samples=int(arr.size),
        converged=converged,
        clocks=clocks or {},
        times_ms=tuple(arr.tolist()),
    )


def pool(rounds: Sequence[Timing], *, by_round: bool = False) -> Timing:
    """One figure from rounds of the same work timed at different moments: median and p20/p80 of all their
    samples; relative noise the larger of the samples' spread and the round medians' (half their range over the
    median, the variation between moments that a single round cannot see). ``by_round``: the median is the median
    of the round medians, each round one vote (rounds of equal budget taken in turns: a round that stops early on
    settled samples would otherwise weigh less than a noisy one that ran its whole budget), and p20 / p80 weigh
    each round alike too (and hold the median between them). One round is returned as it is."""
    if not rounds:
        raise ValueError("pool needs at least one round")
    if len(rounds) == 1:
        return rounds[0]
    medians = tuple(r.median_ms for r in rounds)
    clocks = _merge_clocks([r.clocks for r in rounds])
    joined = summarize([t for r in rounds for t in r.times_ms], converged=all(r.converged for r in rounds),
                       clocks=clocks)
    if by_round:  # each round one vote for the quantiles too (its samples weigh 1 / its count), around that median
        med = float(np.median(medians))
        p20, p80 = _vote_quantiles([r.times_ms for r in rounds], (0.2, 0.8)) or (joined.p20_ms, joined.p80_ms)
        joined = dataclasses.replace(joined, median_ms=med, p20_ms=min(p20, med), p80_ms=max(p80, med))
    between = (max(medians) - min(medians)) / (2 * joined.median_ms) if joined.median_ms > 0 else 0.0
    return dataclasses.replace(joined, rel_noise=max(joined.rel_noise, between), round_medians_ms=medians,
                               round_noise=between)


def _vote_quantiles(rounds_ms: Sequence[Sequence[float]], qs: Sequence[float]) -> tuple[float, ...] | None:
    """Quantiles of the rounds' samples pooled with each round weighing the same (a sample 1 / its round's
    count): the lowest sample whose cumulative weight reaches q. None where a round kept no samples."""
    if not rounds_ms or any(len(r) == 0 for r in rounds_ms):
        return None
    vals = np.concatenate([np.asarray(r, dtype=np.float64) for r in rounds_ms])
    weights = np.concatenate([np.full(len(r), 1.0 / len(r)) for r in rounds_ms])
    order = np.argsort(vals, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    return tuple(float(vals[order][min(int(np.searchsorted(cum, q - 1e-12)), len(vals) - 1)]) for q in qs)


def _merge_clocks(all_clocks: Sequence[dict]) -> dict:
    """Clock summaries (of readings, or of rounds) as one: extremes, every throttle reason seen, throttled if any
    was, held only if every one was."""
    reasons = sorted({x for c in all_clocks for x in c.get("throttle_reasons", [])})
    out: dict = {"throttle_reasons": reasons, "throttled": any(c.get("throttled", False) for c in all_clocks)}
    for key, pick in (("sm_clock_min_mhz", min), ("sm_clock_max_mhz", max), ("temperature_max_c", max),
                      ("power_max_w", max)):
        values = [c[key] for c in all_clocks if key in c]
        if values:
            out[key] = pick(values)
    if any("held" in c for c in all_clocks):
        out["held"] = all(c.get("held", False) for c in all_clocks)
    return out


@functools.cache
def _flush_buffer(device_id: int, nbytes: int):
    """(buffer of ``nbytes``, a 4-byte sink) on ``device_id``, made once: the read flush's."""
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.zeros(nbytes // 16 * 4, dtype=cupy.uint32), cupy.zeros(1, dtype=cupy.uint32)


_FLUSH_SOURCE = Path(__file__).parent / "kernels" / "l2_flush.cu"
L2_FLUSH = "read of 2 x L2"  # what flush_l2 does (cukernels.environment records it with every result)


@functools.cache
def _flush_launch(device_id: int):
    """The read flush of ``device_id`` as a call (kernel, grid and arguments fixed once)."""
    from . import compile as _compile

    spec = _device.current()
    buf, sink = _flush_buffer(device_id, 2 * spec.l2_bytes)
    kern = _compile.kernel(_FLUSH_SOURCE, "l2_flush_read")
    grid, args = (8 * spec.sm_count,), (buf, np.uint64(buf.size // 4), sink)
    return lambda: kern.launch(grid, (256,), args)


def flush_l2() -> None:
    """Evict the L2 cache: read a buffer twice its size (sized from the live device), so L2 is left holding clean
    lines. A write (a memset, this timer's flush until stop 58) evicts as well but leaves L2 full of dirty lines,
    and their write-back then runs inside the next timed kernel: on an H100 it added 4-11 us to every kernel
    streaming 50 MB or more (a 92 MB read 43.3 against 33.9 us, the 1 GiB copy 714.5 against 708.6;
    docs/perf/engine.md). triton's ``do_bench`` flushes with a write, so on such kernels it reads higher than
    this timer by about that much."""
    import cupy

    _flush_launch(cupy.cuda.Device().id)()


_SOURCE = Path(__file__).parent / "kernels" / "block_stream.cu"
_HOLD_TIMEOUT_NS = 20_000_000  # 20 ms: far longer than any host enqueue, short enough to give up quickly
HOLD_SETTLE_NS = 0  # the least time a hold lasts from its start (block_stream.cu), so after the flush's end
# A sample's order (docs/perf/engine.md, stops 62-63): "flush-sync" (the default since stop 63, nvbench's cold
# measurement) the host waits for the flush, then holds and enqueues, so every launch reaches a held device whose
# flush is over; for probes, "flush-hold" (stops 58-62) the flush, then the hold, then the work is enqueued (a host
# faster than the flush queues its launch behind the running flush: a race with the host), "hold-flush" the hold
# first (every launch queued before the flush runs: the work follows the flush at once).
SAMPLE_ORDERS = ("flush-sync", "flush-hold", "hold-flush")
SAMPLE_ORDER = "flush-sync"


_tickets = itertools.count(1)


@functools.cache
def _hold_state(device_id: int):
    """Two ints of mapped, pinned host memory: [last ticket released, timed out]; the same address works on the
    device (unified addressing)."""
    import ctypes

    import cupy

    ptr = cupy.cuda.runtime.hostAlloc(8, cupy.cuda.runtime.hostAllocMapped)
    state = (ctypes.c_int * 2).from_address(ptr)
    state[0] = state[1] = 0
    return ptr, state


def _hold(device_id: int):
    """Enqueue a holding kernel with a fresh ticket; returns the function that releases it."""
    from . import compile as _compile

    ptr, state = _hold_state(device_id)
    ticket = next(_tickets) % (2**31 - 1) or 1
    if ticket == 1:
        state[0] = 0  # wrapped (after 2^31 samples): every earlier holding kernel has long been released
    kern = _compile.kernel(_SOURCE, "block_stream")
    kern.launch((1,), (1,), (np.uintp(ptr), np.int32(ticket), np.uint64(_HOLD_TIMEOUT_NS), np.uint64(HOLD_SETTLE_NS)))

    def release():
        state[0] = ticket

    return release


def can_hold(fn: Callable[[], object]) -> bool:
    """Can ``fn`` be timed with the stream held, i.e. does it enqueue its work without waiting for the device?
    One probe call: a call that synchronises makes the holding kernel time out."""
    import cupy

    dev_id = cupy.cuda.Device().id
    _, state = _hold_state(dev_id)
    state[1] = 0
    release = _hold(dev_id)
    fn()
    release()
    cupy.cuda.get_current_stream().synchronize()
    return state[1] == 0


HOST_CALLS = 20  # calls enqueued behind one hold by host_us: a burst that never fills the launch queue
_HOLD_SHARE = 4  # host_us keeps its burst under a quarter of the hold's timeout, so a slow host never trips it


def as_called(fn: Callable[[], object], *, min_calls: int = 20, min_ms: float = 10.0, repeats: int = 5) -> float:
    """Wall time per call (ms) of back-to-back calls of a warm ``fn`` with one device synchronisation at the end,
    the way a training step sees it: no hold, no L2 flush between calls. A repeat is ``min_calls`` calls, or fewer
    when they last ``min_ms`` anyway; the median of ``repeats`` repeats."""
    import cupy

    def per_call(calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        cupy.cuda.Device().synchronize()  # the device, not a stream: torch may enqueue on its own
        return (time.perf_counter() - t0) * 1e3 / calls

    one = per_call(1)  # with a synchronisation's latency: an over-estimate, which sizes the repeats
    calls = min(min_calls, max(1, math.ceil(min_ms / one)))
    return float(np.median([per_call(calls) for _ in range(repeats)]))


def host_us(fn: Callable[[], object], *, per_call_ms: float, calls: int = HOST_CALLS,
            repeats: int = 5) -> tuple[float, bool]:
    """Host time per call (µs) of a warm ``fn`` and whether it was taken held. The calls are enqueued while the
    holding kernel keeps the stream, timed from before the first to after the last, then released: the device
    never stalls the host, so this is the Python and launch cost alone. The burst is ``calls`` long, shortened to
    stay well inside the hold's timeout by a bound on one call's host time: the smaller of ``per_call_ms`` (the
    as-called time, which includes it) and one probe call's host time behind the hold (a call whose device work
    takes milliseconds costs its host microseconds: its bursts are as long as a small call's, and its first call
    after a synchronisation, slower than the rest, does not make the whole figure). A call that waits for the
    device trips the timeout instead; it is then timed without the hold and ``False`` says the figure includes
    that wait. The median of ``repeats`` bursts."""
    import cupy

    dev_id = cupy.cuda.Device().id
    _, state = _hold_state(dev_id)

    def burst(n: int, held: bool) -> tuple[float, bool]:  # (seconds, whether the hold timed out)
        state[1] = 0
        release = _hold(dev_id) if held else None
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        if release is not None:
            release()
        cupy.cuda.Device().synchronize()
        return elapsed, bool(held and state[1])

    probe_s, tripped = burst(1, True)  # tripped: the hold timed out, fn waits for the device
    held = not tripped
    bound_ms = min(per_call_ms, probe_s * 1e3) if held else per_call_ms
    calls = max(1, min(calls, int(_HOLD_TIMEOUT_NS / 1e6 / _HOLD_SHARE / max(bound_ms, 1e-6))))
    samples = []
    while len(samples) < repeats:
        elapsed, stalled = burst(calls, held)
        if stalled:  # a later burst stalled on the device after all
            held = False
            continue
        samples.append(elapsed * 1e6 / calls)
    return float(np.median(samples)), held


SUSTAINED_BATCH_MS = 50.0  # sustained: calls enqueued between two synchronisations (an NVML reading each)


def sustained(fn: Callable[[], object], seconds: float, *, batch_ms: float = SUSTAINED_BATCH_MS) -> dict:
    """``fn`` called back to back for ``seconds`` s, the way a training loop keeps a card busy: within a second or
    so a card at its power limit settles at the clock the limit allows, and there the time per call follows the
    energy per call. The first half settles; the second is measured: wall ms per call, the card's energy counter
    over it per call (mJ; None where NVML has no counter), the mean power, the SM clock (mean and range) and the
    throttle reasons seen. The calls go in batches of about ``batch_ms``, each followed by one device
    synchronisation (a gap of its latency per batch) with an NVML reading taken while the batch runs. No flush, no
    hold: the L2 keeps what the last call left, as in a loop."""
    import cupy

    if not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    dev = cupy.cuda.Device()
    dev_id = dev.id
    readings: list[dict] = []

    def batch(n: int, sample: bool) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if sample:
            readings.append(_device.nvml_sample(dev_id))  # while the batch runs (the host is ahead of it)
        dev.synchronize()  # the device, not a stream: torch may enqueue on its own
        return (time.perf_counter() - t) * 1e3

    def resize(n: int, ms: float) -> int:
        return max(1, min(n * 8, int(round(n * batch_ms / max(ms, 1e-3)))))

    n = resize(1, batch(1, False))
    settle_end = time.perf_counter() + seconds / 2
    while time.perf_counter() < settle_end:
        n = resize(n, batch(n, False))
    e0 = _device.nvml_energy_mj(dev_id)
    t0 = time.perf_counter()
    stop, calls = t0 + seconds / 2, 0
    while True:
        batch(n, True)
        calls += n
        if time.perf_counter() >= stop:
            break
    wall = time.perf_counter() - t0
    e1 = _device.nvml_energy_mj(dev_id)
    energy = None if e0 is None or e1 is None or e1 < e0 else e1 - e0
    clocks = [r["sm_clock_mhz"] for r in readings if "sm_clock_mhz" in r]
    return {
        "seconds": wall,
        "calls": calls,
        "ms_per_call": wall * 1e3 / calls,
        "mj_per_call": None if energy is None else energy / calls,
        "power_w": None if energy is None else energy / 1e3 / wall,
        "sm_clock_mean_mhz": float(np.mean(clocks)) if clocks else None,
        **_clock_summary(readings),  # extremes, throttle reasons, throttled: as a timed row's clocks
    }


def merge_sustained(passes: Sequence[dict]) -> dict:
    """Passes of ``sustained`` over the same call (taken at different moments) as one: means of the per-call
    figures, the clock summaries merged as rounds' are (``_merge_clocks``); the passes kept."""
    def mean(key):
        vals = [p[key] for p in passes if p.get(key) is not None]
        return float(np.mean(vals)) if len(vals) == len(passes) else None

    return {
        "seconds": float(sum(p["seconds"] for p in passes)),
        "calls": int(sum(p["calls"] for p in passes)),
        "ms_per_call": mean("ms_per_call"),
        "mj_per_call": mean("mj_per_call"),
        "power_w": mean("power_w"),
        "sm_clock_mean_mhz": mean("sm_clock_mean_mhz"),
        **_merge_clocks(passes),
        "passes": [dict(p) for p in passes],
    }


def _clock_summary(readings: list[dict]) -> dict:
    """NVML readings (``device.nvml_sample``) as a clock summary: extremes, throttle reasons, ``throttled``."""
    return _merge_clocks([_reading_summary(r) for r in readings])


def _reading_summary(reading: dict) -> dict:
    reasons = list(reading.get("throttle_reasons", []))
    out: dict = {"throttle_reasons": reasons, "throttled": bool(set(reasons) & _device.SLOWDOWN_REASONS)}
    for src, keys in (("sm_clock_mhz", ("sm_clock_min_mhz", "sm_clock_max_mhz")),
                      ("temperature_c", ("temperature_max_c",)), ("power_w", ("power_max_w",))):
        if src in reading:
            out.update(dict.fromkeys(keys, reading[src]))
    return out


def benchmark(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 25.0,
    budget_ms: float = 500.0,
    min_samples: int = 10,
    max_samples: int = 500,
    rel_noise_target: float = 0.01,
    flush_l2: bool = True,
    hold: bool = True,
) -> Timing:
    """Time ``fn`` (which enqueues GPU work on the current stream) with CUDA events; ``hold`` measures device
    time alone (see the module doc)."""
    import cupy

    if min_samples < 1 or max_samples < min_samples:
        raise ValueError(f"need 1 <= min_samples <= max_samples, got {min_samples}, {max_samples}")
    if SAMPLE_ORDER not in SAMPLE_ORDERS:
        raise ValueError(f"timing.SAMPLE_ORDER = {SAMPLE_ORDER!r}: must be one of {', '.join(SAMPLE_ORDERS)}")
    dev_id = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream()
    flush = globals()["flush_l2"] if flush_l2 else (lambda: None)

    # warm-up: at least one call, then until warmup_ms of wall time
    t0 = time.perf_counter()
    fn()
    stream.synchronize()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        fn()
        stream.synchronize()

    held = hold and can_hold(fn)

    readings = [_device.nvml_sample(dev_id)]
    samples: list[float] = []
    converged = False
    start_wall = time.perf_counter()
    batch = min_samples
    while len(samples) < max_samples:
        pairs = []
        for _ in range(min(batch, max_samples - len(samples))):
            if SAMPLE_ORDER == "hold-flush" and held:
                release = _hold(dev_id)
                flush()
            else:
                flush()
                if SAMPLE_ORDER == "flush-sync":
                    stream.synchronize()
                release = _hold(dev_id) if held else None
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            fn()
            end.record(stream)
            if release is not None:
                release()
            pairs.append((start, end))
        readings.append(_device.nvml_sample(dev_id))  # sampled while the batch runs
        end.synchronize()
        if held and _hold_state(dev_id)[1][1]:  # a hold timed out: the work waits for the device; drop the batch
            held = False
            continue
        samples.extend(cupy.cuda.get_elapsed_time(s, e) for s, e in pairs)
        stats = summarize(samples)
        if len(samples) >= min_samples and stats.rel_noise <= rel_noise_target:
            converged = True
            break
        if (time.perf_counter() - start_wall) * 1e3 >= budget_ms:
            break
        batch = max(min_samples, len(samples) // 2)
    readings.append(_device.nvml_sample(dev_id))
    clocks = _clock_summary(readings)
    clocks["held"] = held
    return summarize(samples, converged=converged, clocks=clocks)
