"""The copy ceiling: a 16-byte-vector device copy built by the engine and timed by the timer.

It is the engine's end-to-end self-check (compile path, launch, timer) and the memory-bandwidth ceiling that
bandwidth-bound kernels are judged against (bytes read + bytes written over the median time).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import compile as _compile
from . import timing as _timing

_SOURCE = Path(__file__).parent / "kernels" / "copy.cu"
_UNROLL = 1
_THREADS = 256


def copy(src, dst) -> None:
    """``dst[:] = src`` for contiguous CuPy arrays of equal byte size, a multiple of 16 bytes."""
    if src.nbytes != dst.nbytes:
        raise ValueError(f"src has {src.nbytes} bytes, dst {dst.nbytes}: they must match")
    if src.nbytes % 16 or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        raise ValueError("copy needs contiguous arrays whose size is a multiple of 16 bytes")
    kern = _compile.kernel(_SOURCE, f"copy_vec16<{_UNROLL}>")
    n_vec = src.nbytes // 16
    grid = max(1, -(-n_vec // (_THREADS * _UNROLL)))
    kern.launch((grid,), (_THREADS,), (src, dst, np.int64(n_vec)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CopyBandwidth:
    nbytes: int
    tb_per_s: float
    timing: _timing.Timing
    correct: bool


def measure_copy(nbytes: int = 1 << 30, *, budget_ms: float = 1000.0) -> CopyBandwidth:
    """Copy ``nbytes`` of random data between two buffers; TB/s counts bytes read plus bytes written."""
    import cupy

    n = nbytes // 4
    src = cupy.random.default_rng().integers(0, 2**31 - 1, size=n, dtype=cupy.int32)
    dst = cupy.full(n, -1, dtype=cupy.int32)
    copy(src, dst)
    correct = bool((dst == src).all())
    t = _timing.benchmark(lambda: copy(src, dst), budget_ms=budget_ms, rel_noise_target=0.005, flush_l2=False)
    return CopyBandwidth(nbytes=src.nbytes, tb_per_s=2 * src.nbytes / (t.median_ms * 1e-3) / 1e12, timing=t,
                         correct=correct)
