"""Numerical checks: poisoned outputs, comparison against a higher-precision reference, the tolerance policy.

Policy (FlashAttention's test idea, DESIGN.md "Numerics"): a low-precision kernel is compared with an fp32/fp64
reference. When the same computation done naively in the low precision (``naive``) is available, the kernel
passes if its max error is at most ``naive_factor`` times the naive one's, plus ``atol``: rounding of the inputs
and the output is unavoidable, so that is the yardstick. Without a naive result, every element must satisfy
``|actual - ref| <= atol + rtol * |ref|``. A non-finite value where the reference is finite always fails —
outputs are poisoned with NaN before a run, so an element the kernel never wrote fails too.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import dtypes

BF16_NAN_BITS = 0x7FC0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerance:
    atol: float
    rtol: float = 0.0
    naive_factor: float = 2.0


# Defaults per storage precision: element-wise caps for results of O(1) magnitude.
TOLERANCES = {
    "fp32": Tolerance(atol=1e-5, rtol=1e-5),
    "fp16": Tolerance(atol=2e-3, rtol=2e-3),
    "bf16": Tolerance(atol=1.6e-2, rtol=1.6e-2),
}


def poison(arr):
    """Fill ``arr`` in place with a value no kernel writes (NaN; bf16 NaN bits; the integer minimum)."""
    if arr.dtype == dtypes.BF16:
        arr.fill(BF16_NAN_BITS)
    elif np.issubdtype(arr.dtype, np.floating):
        arr.fill(np.nan)
    elif np.issubdtype(arr.dtype, np.integer):
        arr.fill(np.iinfo(arr.dtype).min)
    else:
        raise TypeError(f"cannot poison dtype {arr.dtype}")
    return arr


def count_poison(arr) -> int:
    """Elements still holding the poison value of an integer array (unwritten outputs)."""
    if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == dtypes.BF16:
        raise TypeError("count_poison is for integer outputs; float outputs show up as non-finite in compare()")
    return int((arr == np.iinfo(arr.dtype).min).sum())


def _as_float64(x, xp):
    """``x`` (CuPy, NumPy or torch; bf16 as uint16 bits) as a float64 array of the library ``xp``."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().float().cpu().numpy() if xp is np else _torch_to_cupy(x)
    if xp is np and type(x).__module__.startswith("cupy"):
        x = x.get()
    x = xp.asarray(x)
    if x.dtype == dtypes.BF16:
        x = dtypes.bf16_to_float32(x)
    return x.astype(xp.float64)


def _torch_to_cupy(t):
    import cupy

    return cupy.from_dlpack(t.detach().float().contiguous())


def _array_module(*arrays):
    """CuPy when any input lives on the GPU (the comparison then runs there, no host copy), else NumPy."""
    for a in arrays:
        mod = type(a).__module__
        if mod.startswith("cupy") or (mod.startswith("torch") and a.is_cuda):
            import cupy

            return cupy
    return np


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    max_abs: float
    max_rel: float
    mean_abs: float
    rel_l2: float
    nonfinite: int
    passed: bool
    reason: str
    naive_max_abs: float | None = None

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise AssertionError(f"{self.name}: {self.reason}")

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"{self.name}: {verdict} max_abs={self.max_abs:.3g} max_rel={self.max_rel:.3g} ({self.reason})"


def compare(actual, reference, *, tol: Tolerance, naive=None, name: str = "out") -> CheckResult:
    """Compare ``actual`` (any supported dtype; CuPy, NumPy or torch) against a higher-precision ``reference``.
    Runs on the GPU when the data is there; only scalars come back to the host."""
    xp = _array_module(actual, reference, *(() if naive is None else (naive,)))
    a, r = _as_float64(actual, xp), _as_float64(reference, xp)
    if a.shape != r.shape:
        raise ValueError(f"{name}: shape {a.shape} differs from the reference's {r.shape}")

    def abs_err(x):
        same = (x == r) | (xp.isnan(x) & xp.isnan(r))  # equal infinities (an empty row's LSE) count as exact
        with np.errstate(invalid="ignore"):
            return xp.where(same, 0.0, xp.abs(x - r))

    err = abs_err(a)
    bad = ~xp.isfinite(err)
    nonfinite = int(bad.sum())
    err = xp.where(bad, 0.0, err)
    ref_mag = xp.where(xp.isfinite(r), xp.abs(r), 0.0)
    empty = err.size == 0
    max_abs = 0.0 if empty else float(err.max())
    max_rel = 0.0 if empty else float((err / (ref_mag + max(tol.atol, 1e-30))).max())
    mean_abs = 0.0 if empty else float(err.mean())
    ref_norm = float(xp.linalg.norm(xp.where(xp.isfinite(r), r, 0.0).ravel()))
    err_norm = float(xp.linalg.norm(err.ravel()))
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else err_norm

    naive_max = None
    if nonfinite:
        passed, reason = False, f"{nonfinite} non-finite or unwritten elements"
    elif naive is not None:
        n_err = abs_err(_as_float64(naive, xp))
        naive_max = 0.0 if empty else float(xp.where(xp.isfinite(n_err), n_err, 0.0).max())
        bound = tol.naive_factor * naive_max + tol.atol
        passed = max_abs <= bound
        reason = f"max_abs {max_abs:.3g} {'<=' if passed else '>'} {tol.naive_factor}x naive {naive_max:.3g} + {tol.atol:g}"
    else:
        over = err - (tol.atol + tol.rtol * ref_mag)
        n_over = int((over > 0).sum())
        passed = n_over == 0
        if passed:
            reason = f"all within atol={tol.atol:g} rtol={tol.rtol:g}"
        else:
            idx = np.unravel_index(int(over.argmax()), err.shape)
            reason = (f"{n_over} elements beyond atol={tol.atol:g} rtol={tol.rtol:g}; worst at "
                      f"{tuple(int(i) for i in idx)}: got {float(a[idx]):.6g}, expected {float(r[idx]):.6g}")
    return CheckResult(name=name, max_abs=max_abs, max_rel=max_rel, mean_abs=mean_abs, rel_l2=rel_l2,
                       nonfinite=nonfinite, passed=passed, reason=reason, naive_max_abs=naive_max)


def poison_pool(nbytes: int, byte: int = 0xFF) -> None:
    """Poison the memory that CuPy hands out next: until ``nbytes`` more have been allocated, every allocation
    through CuPy's current allocator is filled with ``byte`` on the current stream before it is returned, so
    outputs an op allocates itself start poisoned. 0xFF is NaN in fp32/fp16/bf16 (an unwritten float fails
    ``compare``); for integer outputs where -1 is legal pick another byte (0x7F gives 0x7F7F7F7F in int32).

    Filling each block as it is handed out (rather than filling one freed block and hoping the pool reuses it)
    holds whatever the pool's fragmentation: a best-fit pool serves a small request from the smallest free
    remainder, which a poisoned large block is not."""
    import cupy

    pool_malloc = cupy.get_default_memory_pool().malloc
    remaining = [int(nbytes)]

    def malloc(size: int):
        mem = pool_malloc(size)
        if size:
            cupy.cuda.runtime.memsetAsync(mem.ptr, byte, size, cupy.cuda.get_current_stream().ptr)
        remaining[0] -= size
        if remaining[0] <= 0:
            cupy.cuda.set_allocator(pool_malloc)
        return mem

    cupy.cuda.set_allocator(malloc)


def stop_poisoning() -> None:
    """Back to CuPy's pool as it is (``poison_pool`` stops by itself after its bytes; timing must not wait)."""
    import cupy

    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)