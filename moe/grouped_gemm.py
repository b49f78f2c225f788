"""``grouped_gemm``: one GEMM per expert over the expert-ordered rows, on tensor cores, scheduled on the GPU.

Contract:

- ``a`` ``[rows, K]``: rows in expert order; group ``e`` is rows ``offsets[e]:offsets[e+1]``.
- ``b`` ``[experts, N, K]``, K contiguous: expert e's weight in torch ``Linear`` layout ``[out, in]``. Both
  operands are K-major, mma.sync's row.col form (no transposes in shared memory, plain ldmatrix for both).
- ``offsets`` int32 ``[experts + 1]`` on the GPU, non-decreasing, ``0 <= offsets[0]`` and ``offsets[-1] <= rows``
  (the caller's promise: it is read on the GPU only, never copied to the host). Any group may be empty. Rows
  outside ``[offsets[0], offsets[-1])`` are not written.
- dtypes: float16, or bfloat16 as ``uint16`` bits (the project convention); torch CUDA tensors are accepted
  zero-copy. Accumulation in fp32; the output has the input dtype.
- ``K`` and ``N`` multiples of 8 (16-byte rows for cp.async); ``epilogue="swiglu"`` needs ``N`` a multiple of 16.
- ``epilogue``: ``None``; ``"swiglu"``: ``b[e]``'s rows are gate and up interleaved (row ``2j`` gate j, row
  ``2j+1`` up j; ``interleave_gate_up`` builds it), output ``[rows, N/2]`` = ``silu(gate) * up``; ``"gelu"``:
  ``gelu(x)`` (erf form).
- ``row_scale``: float32 ``[rows]``, multiplies each output row after the epilogue (the routing weight of the
  down projection).
- ``out_dtype``: ``None`` (a's dtype) or ``numpy.float32`` (plain GEMM only: fp32 results, e.g. router logits).

Nothing is synchronised with the host: the kernel finds each CTA's (expert, m-tile, n-tile) from ``offsets``
itself (grouped_gemm.cu's header), so the call can be captured in a CUDA graph.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cukernels import dtypes, tiling

from . import gemm_configs, launch

SOURCE = Path(__file__).parent / "kernels" / "grouped_gemm.cu"
_DTYPES = (dtypes.FP16, dtypes.BF16)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _contiguous(x) -> bool:
    flags = getattr(x, "flags", None)
    return bool(flags.c_contiguous) if flags is not None else True


def validate(a, b, offsets, *, epilogue=None, row_scale=None, out_dtype=None) -> gemm_configs.GemmProblem:
    """Check shapes, dtypes and layout from the arrays' attributes alone (no GPU needed); return the problem."""
    if epilogue not in gemm_configs.EPILOGUES:
        raise ValueError(f"epilogue must be one of {list(gemm_configs.EPILOGUES)}, got {epilogue!r}")
    if out_dtype is not None and np.dtype(out_dtype) not in (np.dtype(np.float32), np.dtype(a.dtype)):
        raise TypeError(f"out_dtype must be None, float32 or a's dtype {a.dtype}, got {np.dtype(out_dtype)}")
    if out_dtype is not None and np.dtype(out_dtype) == np.float32 and epilogue is not None:
        raise ValueError(f"out_dtype=float32 is for the plain GEMM; epilogue {epilogue!r} writes a's dtype")
    if len(getattr(a, "shape", ())) != 2:
        raise ValueError(f"a must be 2-D [rows, K], got shape {tuple(getattr(a, 'shape', ()))}")
    if len(getattr(b, "shape", ())) != 3:
        raise ValueError(f"b must be 3-D [experts, N, K] (one [N, K] weight per expert, K contiguous), "
                         f"got shape {tuple(getattr(b, 'shape', ()))}")
    if np.dtype(a.dtype) not in _DTYPES:
        raise TypeError(f"a must be float16 or bfloat16 (uint16 bits), got {a.dtype}")
    if np.dtype(b.dtype) != np.dtype(a.dtype):
        raise TypeError(f"b must have a's dtype {a.dtype}, got {b.dtype}")
    rows, k = (int(v) for v in a.shape)
    experts, n, kb = (int(v) for v in b.shape)
    if kb != k:
        raise ValueError(f"b's K (shape[2]) is {kb}, a's K (shape[1]) is {k}: they must match")
    if experts < 1:
        raise ValueError("b has no experts (shape[0] == 0)")
    if k < 8 or k % 8:
        raise ValueError(f"K = {k} (a.shape[1]): must be a positive multiple of 8")
    mult = 16 if epilogue == "swiglu" else 8
    if n < mult or n % mult:
        raise ValueError(f"N = {n} (b.shape[1]): must be a positive multiple of {mult}"
                         + (" (SwiGLU halves it into gate/up pairs)" if epilogue == "swiglu" else ""))
    if rows >= 2**31:
        raise ValueError(f"a has {rows} rows: at most 2**31 - 1 are supported")
    if tuple(getattr(offsets, "shape", ())) != (experts + 1,):
        raise ValueError(f"offsets must be 1-D [experts + 1] = [{experts + 1}], got shape "
                         f"{tuple(getattr(offsets, 'shape', ()))}")
    if np.dtype(offsets.dtype) != np.int32:
        raise TypeError(f"offsets must be int32, got {offsets.dtype}")
    if row_scale is not None:
        if tuple(getattr(row_scale, "shape", ())) != (rows,):
            raise ValueError(f"row_scale must be 1-D [rows] = [{rows}], got shape "
                             f"{tuple(getattr(row_scale, 'shape', ()))}")
        if np.dtype(row_scale.dtype) != np.float32:
            raise TypeError(f"row_scale must be float32, got {row_scale.dtype}")
    for name, x in (("a", a), ("b", b), ("offsets", offsets), ("row_scale", row_scale)):
        if x is not None and not _contiguous(x):
            raise ValueError(f"{name} must be C-contiguous, got strides {x.strides} for shape {tuple(x.shape)}")
    return gemm_configs.GemmProblem(rows=rows, n=n, k=k, experts=experts, dtype=dtypes.dtype_name(a.dtype),
                                    epilogue=epilogue)


def _device_array(x, name):
    import cupy

    if x is None:
        return None
    arr, _ = dtypes.as_cupy(x, name=name)
    if arr.data.ptr % 16:
        raise ValueError(f"{name} must be 16-byte aligned (address {arr.data.ptr:#x}); pass a fresh array")
    if arr.device.id != cupy.cuda.Device().id:
        raise ValueError(f"{name} is on device {arr.device.id}, the current device is {cupy.cuda.Device().id}")
    return arr


def grouped_gemm(a, b, offsets, *, epilogue: str | None = None, row_scale=None, out_dtype=None, config=None):
    """Per-expert ``epilogue(a[group e] @ b[e].T) * row_scale`` (see the module doc). ``config``: a
    ``gemm_configs.GemmConfig`` to use instead of the planner's choice (benchmarks), checked against the device."""
    import cupy

    was_torch = _is_torch(a)
    if was_torch or _is_torch(b) or _is_torch(offsets) or _is_torch(row_scale):
        a, b, offsets = (dtypes.as_cupy(x, name=n)[0] for x, n in ((a, "a"), (b, "b"), (offsets, "offsets")))
        row_scale = None if row_scale is None else dtypes.as_cupy(row_scale, name="row_scale")[0]
    problem = validate(a, b, offsets, epilogue=epilogue, row_scale=row_scale, out_dtype=out_dtype)
    out_dtype = np.dtype(a.dtype if out_dtype is None else out_dtype)
    for name, x in (("a", a), ("b", b), ("offsets", offsets), ("row_scale", row_scale)):
        if x is not None and not isinstance(x, cupy.ndarray):
            raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}")
    a, b, offsets, row_scale = (_device_array(x, n) for x, n in
                                ((a, "a"), (b, "b"), (offsets, "offsets"), (row_scale, "row_scale")))
    if config is None:
        config = launch.plan(gemm_configs.plan, problem).config
    else:
        tiling.check_fits(config, launch.spec())
    n_out = problem.n // 2 if epilogue == "swiglu" else problem.n
    out = cupy.empty((problem.rows, n_out), dtype=out_dtype)
    if problem.rows == 0:
        return dtypes.like_input(out, was_torch)
    kern = launch.kernel(SOURCE, config.name_expression(dtype=a.dtype, epilogue=epilogue, out_dtype=out_dtype))
    kern.launch((config.grid(problem),), (config.threads,),
                (a, b, out, offsets, row_scale if row_scale is not None else np.uintp(0),
                 np.int32(problem.experts), np.int32(problem.n), np.int32(problem.k)),
                smem=config.smem_bytes())
    return dtypes.like_input(out, was_torch)


def interleave_gate_up(w_gate, w_up):
    """``[experts, I, K]`` gate and up weights -> ``[experts, 2I, K]`` with row 2j = gate j, row 2j+1 = up j
    (the layout ``epilogue="swiglu"`` reads). CuPy or NumPy, same library out."""
    xp = dtypes._xp(w_gate)
    if w_gate.shape != w_up.shape or w_gate.ndim != 3:
        raise ValueError(f"w_gate and w_up must both be [experts, I, K], got {w_gate.shape} and {w_up.shape}")
    e, i, k = w_gate.shape
    return xp.stack([w_gate, w_up], axis=2).reshape(e, 2 * i, k)


def reference(a, b, offsets, *, epilogue=None, row_scale=None) -> np.ndarray:
    """float64 NumPy reference: a per-expert loop over the fp32 values of the stored inputs."""
    def host(x):
        x = x.get() if hasattr(x, "get") else np.asarray(x)
        return dtypes.to_float32(x).astype(np.float64) if x.dtype in _DTYPES else x

    a64, b64, off = host(a), host(b), np.asarray(host(offsets)).astype(np.int64)
    n = b64.shape[1]
    out = np.zeros((a64.shape[0], n // 2 if epilogue == "swiglu" else n))
    for e in range(b64.shape[0]):
        lo, hi = off[e], off[e + 1]
        if hi <= lo:
            continue
        y = a64[lo:hi] @ b64[e].T
        if epilogue == "swiglu":
            g, u = y[:, 0::2], y[:, 1::2]
            y = g / (1.0 + np.exp(-g)) * u
        elif epilogue == "gelu":
            from math import erf, sqrt

            y = 0.5 * y * (1.0 + np.vectorize(erf, otypes=[np.float64])(y / sqrt(2.0)))
        out[lo:hi] = y
    if row_scale is not None:
        out *= np.asarray(host(row_scale), dtype=np.float64)[:, None]
    return out
