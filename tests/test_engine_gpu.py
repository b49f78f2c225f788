"""Engine on a real GPU: a kernel built through the compile path, launched, checked and timed; the copy ceiling."""
from pathlib import Path

import numpy as np
import pytest

from cukernels import bandwidth, checks, compile, device, dtypes, timing

pytestmark = pytest.mark.gpu
AXPY = Path(__file__).parent / "kernels" / "axpy.cu"


def test_live_spec_is_queried_and_matched():
    import cupy

    spec = device.current()
    attrs = cupy.cuda.Device().attributes
    assert spec.source == "live"
    assert spec.smem_per_block_optin == attrs["MaxSharedMemoryPerBlockOptin"]
    assert spec.sm_count == attrs["MultiProcessorCount"] and spec.l2_bytes == attrs["L2CacheSize"]
    if spec.key is not None:  # a known GPU: the profile's limits agree with the driver's
        prof = device.profile(spec.key)
        assert prof.smem_per_block_optin == spec.smem_per_block_optin
        assert prof.sm_count == spec.sm_count


@pytest.mark.parametrize("dtype", [np.float16, dtypes.BF16, np.float32])
def test_kernel_built_launched_checked_timed(dtype):
    import cupy

    spec = device.current()
    n, items, threads = 1 << 22, 4, 256
    x = dtypes.random((n,), dtype, seed=1)
    y0 = dtypes.random((n,), dtype, seed=2)
    y = y0.copy()
    kern = compile.kernel(AXPY, f"axpy<{dtypes.ctype(dtype)}, {items}>")
    smem = min(64 * 1024, spec.smem_per_block_optin)  # above the 48 KB default: the engine must raise the limit
    grid = (-(-n // (threads * items)),)
    kern.launch(grid, (threads,), (x, y, np.float32(0.5), np.int32(n)), smem=smem)
    ref = 0.5 * dtypes.to_float32(x).astype(cupy.float64) + dtypes.to_float32(y0).astype(cupy.float64)
    checks.compare(y, ref, tol=checks.TOLERANCES[dtypes.dtype_name(dtype)]).raise_if_failed()
    t = timing.benchmark(lambda: kern.launch(grid, (threads,), (x, y, np.float32(0.5), np.int32(n)), smem=smem),
                         budget_ms=200)
    assert 0 < t.p20_ms <= t.median_ms <= t.p80_ms and t.samples >= 10
    assert "throttle_reasons" in t.clocks


def test_launch_refuses_more_shared_memory_than_the_device_has():
    spec = device.current()
    kern = compile.kernel(AXPY, "axpy<float, 1>")
    with pytest.raises(ValueError, match="allows"):
        kern.launch((1,), (32,), (), smem=spec.smem_per_block_optin + 1)


def test_poison_pool_reaches_fresh_allocations():
    import cupy

    checks.poison_pool(1 << 20)
    fresh = cupy.empty(1000, dtype=cupy.float32)
    assert bool(cupy.isnan(fresh).all())


def test_copy_bandwidth_near_the_datasheet():
    spec = device.current()
    result = bandwidth.measure_copy(1 << 30)
    assert result.correct
    print(f"copy: {result.tb_per_s:.2f} TB/s, {result.timing}")
    if spec.peaks is not None:
        assert result.tb_per_s * 1e3 >= 0.75 * spec.peaks.mem_bandwidth_gbs


def test_held_timing_measures_device_time_not_host_time():
    """A call whose host side is slow (sleeps between tiny launches) is timed by its kernels when the stream is
    held; a call that synchronises the host is detected and timed without holding."""
    import time

    import cupy

    x = cupy.zeros(1 << 10, dtype=cupy.float32)

    def slow_host():
        for _ in range(5):
            x.fill(1.0)
            time.sleep(0.002)  # 10 ms of host time around ~5 tiny kernels

    held = timing.benchmark(slow_host, budget_ms=100, min_samples=5)
    unheld = timing.benchmark(slow_host, budget_ms=100, min_samples=5, hold=False)
    assert held.clocks["held"] and not unheld.clocks["held"]
    assert held.median_ms < 1.0 < 5.0 < unheld.median_ms

    def syncs():
        x.fill(2.0)
        cupy.cuda.get_current_stream().synchronize()

    t = timing.benchmark(syncs, budget_ms=100, min_samples=5)
    assert not t.clocks["held"] and t.median_ms < 15.0  # no 20 ms hold timeouts left in the samples


def test_sustained_reads_time_energy_and_clock_per_call():
    """timing.sustained on a real card: a 256 MiB copy back to back; where NVML has an energy counter (every
    datacenter card since Volta), the energy per call and the mean power are read from it and plausible."""
    import cupy

    a = cupy.ones(1 << 26, dtype=cupy.float32)
    b = cupy.empty_like(a)

    def copy():
        b[...] = a

    out = timing.sustained(copy, 1.0)
    print(out)
    assert out["calls"] > 10 and 0.4 <= out["seconds"] < 2.0
    assert 0.05 < out["ms_per_call"] < 100 and out["sm_clock_mean_mhz"] and out["sm_clock_mean_mhz"] > 100
    if device.nvml_energy_mj() is not None:
        assert 30 < out["power_w"] < 2000  # a busy card draws more than idle and less than any card's limit
        assert out["mj_per_call"] == pytest.approx(out["power_w"] * out["ms_per_call"], rel=1e-6)


@pytest.mark.parametrize("order", timing.SAMPLE_ORDERS)
def test_held_timing_in_every_sample_order_and_with_a_settle(monkeypatch, order):
    """Whatever the sample's order (the probe knob) and however long the hold lasts past the flush, the events
    bracket the work alone: a slow host's tiny kernels read well under a millisecond."""
    import time

    import cupy

    x = cupy.zeros(1 << 10, dtype=cupy.float32)

    def slow_host():
        for _ in range(3):
            x.fill(1.0)
            time.sleep(0.001)

    monkeypatch.setattr(timing, "SAMPLE_ORDER", order)
    monkeypatch.setattr(timing, "HOLD_SETTLE_NS", 200_000)  # 0.2 ms of hold after the flush, outside the events
    t = timing.benchmark(slow_host, budget_ms=50, min_samples=5)
    assert t.clocks["held"] and t.median_ms < 0.15


def test_l2_flush_evicts_by_reading():
    """The timer's flush evicts what a kernel left in L2 (a 16 MB read is slower after it than when repeated
    without it) and writes nothing (its buffer is unchanged): L2 is left clean, so no write-back of the flush's
    own lines runs inside the next timed kernel."""
    import cupy

    spec = device.current()
    buf, sink = timing._flush_buffer(cupy.cuda.Device().id, 2 * spec.l2_bytes)
    buf[:] = cupy.arange(buf.size, dtype=cupy.uint32)
    timing.flush_l2()
    assert bool((buf == cupy.arange(buf.size, dtype=cupy.uint32)).all()) and int(sink[0]) == 0
    data = cupy.ones(16 << 18, dtype=cupy.uint32)  # 16 MB: fits in L2
    kern = compile.kernel(timing._FLUSH_SOURCE, "l2_flush_read")
    junk = cupy.zeros(1, dtype=cupy.uint32)

    def read():
        kern.launch((4 * spec.sm_count,), (256,), (data, np.uint64(data.size // 4), junk))

    cold = timing.benchmark(read, budget_ms=100, min_samples=10)
    warm = timing.benchmark(read, budget_ms=100, min_samples=10, flush_l2=False)
    print(f"16 MB read: {cold.median_ms * 1e3:.1f} us after the flush, {warm.median_ms * 1e3:.1f} us from L2")
    assert cold.median_ms > 1.3 * warm.median_ms


@pytest.mark.parametrize("dt", [dtypes.BF16, dtypes.FP16, dtypes.FP32])
def test_random_large_arrays_drawn_in_pieces(monkeypatch, dt):
    """Past RANDOM_PIECE elements ``dtypes.random`` draws piece by piece into its output: same shape and dtype,
    normal with the asked scale, every piece its own draw, and the same seed gives the same array."""
    import cupy

    monkeypatch.setattr(dtypes, "RANDOM_PIECE", 1000)
    x = dtypes.random((7, 1100), dt, seed=3, scale=0.5)
    assert x.shape == (7, 1100) and x.dtype == dt
    f = dtypes.to_float32(x).ravel()
    assert abs(float(f.mean())) < 0.02 and abs(float(f.std()) - 0.5) < 0.02
    pieces = f[:7000].reshape(7, 1000)
    assert all(not bool(cupy.array_equal(pieces[0], pieces[i])) for i in range(1, 7))
    assert bool(cupy.array_equal(x, dtypes.random((7, 1100), dt, seed=3, scale=0.5)))
    assert dtypes.random((10,), dt, seed=3).shape == (10,)  # small arrays: one draw, as before
