"""Element types and the project's bfloat16 convention.

CuPy has no bfloat16 dtype. In cukernels **a ``uint16`` array holds bfloat16 bits**: that is how a bf16
tensor is passed in and handed back. ``to_bf16`` and ``bf16_to_float32`` convert; torch CUDA tensors in
bfloat16 are accepted zero-copy and come back as torch bfloat16 tensors.
"""
from __future__ import annotations

import math

import numpy as np

FP16 = np.dtype(np.float16)
BF16 = np.dtype(np.uint16)  # bfloat16 bits
FP32 = np.dtype(np.float32)

_CTYPES = {FP16: "__half", BF16: "__nv_bfloat16", FP32: "float"}
_NAMES = {FP16: "fp16", BF16: "bf16", FP32: "fp32"}
_BY_NAME = {v: k for k, v in _NAMES.items()}


def _xp(x):
    """The array library (cupy or numpy) that owns ``x``."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def ctype(dtype) -> str:
    """CUDA C++ type name for a supported element dtype (``uint16`` is bf16)."""
    dt = np.dtype(dtype)
    if dt not in _CTYPES:
        raise TypeError(f"unsupported element dtype {dt}; expected float16, bfloat16 (uint16 bits) or float32")
    return _CTYPES[dt]


def dtype_name(dtype) -> str:
    dt = np.dtype(dtype)
    if dt not in _NAMES:
        raise TypeError(f"unsupported element dtype {dt}; expected float16, bfloat16 (uint16 bits) or float32")
    return _NAMES[dt]


def from_name(name: str) -> np.dtype:
    """``"fp16" | "bf16" | "fp32"`` -> the storage dtype."""
    if name not in _BY_NAME:
        raise ValueError(f"dtype must be one of {sorted(_BY_NAME)}, got {name!r}")
    return _BY_NAME[name]


def to_bf16(x):
    """Round a float array to bfloat16 (nearest even) and return its bits as uint16, same library as ``x``."""
    xp = _xp(x)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    nan = xp.isnan(bits.view(xp.float32))
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16
    out = rounded.astype(xp.uint16)
    return xp.where(nan, xp.uint16(0x7FC0), out)


def bf16_to_float32(x):
    """Decode uint16 bfloat16 bits to float32, same library as ``x``."""
    xp = _xp(x)
    if x.dtype != BF16:
        raise TypeError(f"bf16_to_float32 expects uint16 (bfloat16 bits), got {x.dtype}")
    return (xp.ascontiguousarray(x).astype(xp.uint32) << 16).view(xp.float32)


def to_float32(x):
    """Any supported element array -> float32 (bf16 decoded)."""
    if x.dtype == BF16:
        return bf16_to_float32(x)
    return x.astype(_xp(x).float32)


def from_float32(x, dtype):
    """float32 array -> storage of ``dtype`` (bf16 encoded as uint16 bits)."""
    dt = np.dtype(dtype)
    if dt == BF16:
        return to_bf16(x)
    return x.astype(dt)


RANDOM_PIECE = 1 << 26  # elements drawn at once by ``random`` (256 MB of float32 and the rounding's temporaries)


def random(shape, dtype, *, seed=None, scale=1.0):
    """Fresh normal random CuPy data in a storage dtype: never time or test on zeros. An array of more than
    ``RANDOM_PIECE`` elements is drawn and rounded piece by piece into its output, so the float32 draw and the
    rounding's temporaries never exist whole (seed 004's expert weights, 5.8 GB in bf16, took ~60 GB at once)."""
    import cupy

    rng = cupy.random.default_rng(seed)
    n = math.prod(shape) if isinstance(shape, (tuple, list)) else int(shape)
    if n <= RANDOM_PIECE:
        return from_float32(rng.standard_normal(shape, dtype=cupy.float32) * scale, dtype)
    out = cupy.empty(n, dtype=np.dtype(dtype))
    for start in range(0, n, RANDOM_PIECE):
        x = rng.standard_normal(min(RANDOM_PIECE, n - start), dtype=cupy.float32)
        x *= scale
        out[start:start + x.size] = from_float32(x, dtype)
        del x
    return out.reshape(shape)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


_TORCH_STORAGE = {"torch.float16": FP16, "torch.bfloat16": BF16, "torch.float32": FP32,
                  "torch.int32": np.dtype(np.int32), "torch.int16": np.dtype(np.int16)}


def storage(x) -> np.dtype | None:
    """The storage dtype of a CuPy/NumPy array or torch tensor in this project's terms (torch bfloat16 ->
    ``BF16``, uint16 bits), or None for a torch dtype with no such storage."""
    if _is_torch(x):
        return _TORCH_STORAGE.get(str(x.dtype))
    return np.dtype(x.dtype)


def text(x) -> str:
    """The element type as the caller wrote it, for error messages: ``bfloat16`` for a torch bf16 tensor,
    ``uint16 (bfloat16 bits)`` for a CuPy uint16 array."""
    if _is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    dt = np.dtype(x.dtype)
    return "uint16 (bfloat16 bits)" if dt == BF16 else str(dt)


def is_c_contiguous(x) -> bool:
    if _is_torch(x):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def as_cupy(x, *, name: str):
    """Return ``(cupy_array, was_torch)``. torch CUDA tensors are wrapped zero-copy (bf16 as uint16 bits)."""
    import cupy

    if isinstance(x, cupy.ndarray):
        return x, False
    if _is_torch(x):
        import torch

        if not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor, got a tensor on {x.device}")
        if x.dtype == torch.bfloat16:
            return cupy.from_dlpack(x.view(torch.int16)).view(cupy.uint16), True
        return cupy.from_dlpack(x), True
    raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}")


def like_input(arr, was_torch: bool):
    """Hand ``arr`` back as the caller gave its inputs: CuPy, or torch (bf16 restored) when the input was torch."""
    if not was_torch:
        return arr
    import torch

    if arr.dtype == BF16:
        return torch.from_dlpack(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(arr)
