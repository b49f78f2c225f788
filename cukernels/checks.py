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


def _host(x) -> np.ndarray:
    if type(x).__module__.startswith("cupy"):
        x = x.get()
    elif type(x).__module__.startswith("torch"):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x)
    if x.dtype == dtypes.BF16:
        return dtypes.bf16_to_float32(x).astype(np.float64)
    return x.astype(np.float64)


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
    """Compare ``actual`` (any supported dtype, CuPy/NumPy/torch) against a higher-precision ``reference``."""
    a, r = _host(actual), _host(reference)
    if a.shape != r.shape:
        raise ValueError(f"{name}: shape {a.shape} differs from the reference's {r.shape}")
    same = (a == r) | (np.isnan(a) & np.isnan(r))  # equal infinities (e.g. LSE of an empty row) count as exact
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - r))
    bad = ~np.isfinite(err)
    nonfinite = int(bad.sum())
    finite_err = np.where(bad, 0.0, err)
    ref_mag = np.where(np.isfinite(r), np.abs(r), 0.0)
    max_abs = float(finite_err.max()) if err.size else 0.0
    max_rel = float((finite_err / (ref_mag + max(tol.atol, 1e-30))).max()) if err.size else 0.0
    mean_abs = float(finite_err.mean()) if err.size else 0.0
    ref_norm = float(np.linalg.norm(np.where(np.isfinite(r), r, 0.0)))
    rel_l2 = float(np.linalg.norm(finite_err) / ref_norm) if ref_norm > 0 else float(np.linalg.norm(finite_err))

    naive_max = None
    if nonfinite:
        passed, reason = False, f"{nonfinite} non-finite or unwritten elements"
    elif naive is not None:
        n = _host(naive)
        with np.errstate(invalid="ignore"):
            n_err = np.where((n == r), 0.0, np.abs(n - r))
        naive_max = float(np.nanmax(np.where(np.isfinite(n_err), n_err, 0.0))) if n_err.size else 0.0
        bound = tol.naive_factor * naive_max + tol.atol
        passed = max_abs <= bound
        reason = f"max_abs {max_abs:.3g} {'<=' if passed else '>'} {tol.naive_factor}x naive {naive_max:.3g} + {tol.atol:g}"
    else:
        limit = tol.atol + tol.rtol * ref_mag
        worst = int(np.argmax(finite_err - limit)) if err.size else 0
        passed = bool((finite_err <= limit).all())
        if passed:
            reason = f"all within atol={tol.atol:g} rtol={tol.rtol:g}"
        else:
            idx = np.unravel_index(worst, err.shape)
            reason = (
                f"{int((finite_err > limit).sum())} elements beyond atol={tol.atol:g} rtol={tol.rtol:g}; "
                f"worst at {tuple(int(i) for i in idx)}: got {a[idx]:.6g}, expected {r[idx]:.6g}"
            )
    return CheckResult(
        name=name,
        max_abs=max_abs,
        max_rel=max_rel,
        mean_abs=mean_abs,
        rel_l2=rel_l2,
        nonfinite=nonfinite,
        passed=passed,
        reason=reason,
        naive_max_abs=naive_max,
    )


def poison_pool(nbytes: int) -> None:
    """Poison memory that CuPy's pool will hand out next: fill ``nbytes`` with 0xFF (NaN in fp32/fp16/bf16) and
    free it, so outputs an op allocates itself start as NaN and an element the kernel never wrote fails ``compare``."""
    import cupy

    block = cupy.empty(int(nbytes), dtype=cupy.uint8)
    block.fill(0xFF)
    cupy.cuda.get_current_stream().synchronize()
    del block
