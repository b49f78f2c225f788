"""``rms_norm`` (optionally fused with the residual add before it) and ``rotary_`` (in place on q and k), the
small kernels of a decoder layer (kernels/norm_rope.cu), on CuPy arrays (bf16 as uint16 bits) or torch CUDA
tensors, fp16 or bf16. CuPy in, CuPy out on CuPy's current stream; torch in, torch out on torch's current stream
with outputs from its allocator (``cukernels.launch`` frames), so both capture into CUDA graphs.

Each call is keyed on its signature (``cukernels.launch.Cache``): the first validates and compiles, later ones
fill in pointers and launch.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cukernels import compile as _compile
from cukernels import dtypes
from cukernels import launch as _launch

SOURCE = Path(__file__).parent / "kernels" / "norm_rope.cu"
NORM_WARPS = 4  # rows per block of rms_norm (NORM_WARPS in norm_rope.cu)
NORM_VEC = 8  # elements per access: 16 bytes of fp16/bf16, so hidden must be a multiple of 8
ROPE_THREADS = 256
_DTYPES = (dtypes.FP16, dtypes.BF16)


NORM_ROW_THREADS = 512  # most threads of rms_norm_row's block (its __launch_bounds__)
NORM_ROW_PER = 4  # most pieces per thread there: rows up to 512 * 4 * NORM_VEC = 16384 elements


def norm_plan(hidden: int) -> tuple[int, int]:
    """(pieces per thread, threads) of rms_norm_row for a row of ``hidden`` elements, or (0, 32 * NORM_WARPS) for
    the warp-per-row kernel where the row is longer than rms_norm_row holds."""
    vecs = hidden // NORM_VEC
    per = -(-vecs // NORM_ROW_THREADS)
    if per > NORM_ROW_PER:
        return 0, NORM_WARPS * 32
    return per, -(-(-(-vecs // per)) // 32) * 32


def norm_expression(dtype, add: bool, per: int = 0) -> str:
    flag = "true" if add else "false"
    if per:
        return f"rms_norm_row<{dtypes.ctype(dtype)}, {NORM_VEC}, {flag}, {per}>"
    return f"rms_norm<{dtypes.ctype(dtype)}, {NORM_VEC}, {flag}>"


def rotary_expression(dtype) -> str:
    return f"rotary_neox<{dtypes.ctype(dtype)}>"


def name_expressions() -> list[str]:
    """Every instance the Python side can launch (the offline compile test builds them all)."""
    return [e for dt in _DTYPES for e in (
        [norm_expression(dt, add, per) for add in (False, True) for per in range(NORM_ROW_PER + 1)]
        + [rotary_expression(dt)])]


def _device_of(name: str, x) -> int:
    v = _launch.view(x)
    if v is None:
        raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
                        + (" on the host" if hasattr(x, "shape") else ""))
    return v[0][4]


def _check_contiguous(name: str, x) -> None:
    if not dtypes.is_c_contiguous(x):
        raise ValueError(f"{name} must be C-contiguous, got a strided view of shape {tuple(x.shape)}")


# ---------------------------------------------------------------- RMSNorm


class NormCall:
    def __init__(self, rows: int, hidden: int, dtype: np.dtype, add: bool, eps: float, frame):
        import cupy

        self.frame, self.shape, self.dtype = frame, (rows, hidden), dtypes.dtype_name(dtype)
        with cupy.cuda.Device(frame.device_id):
            per, threads = norm_plan(hidden)
            kern = _compile.kernel(SOURCE, norm_expression(dtype, add, per))
            P = _launch.Ptr  # 0 x, 1 residual (0 without the add), 2 weight, 3 out
            # a block per row, or NORM_WARPS rows per block (that kernel also takes the row count)
            grid, shape = (rows, ()) if per else (-(-rows // NORM_WARPS), (np.int32(rows),))
            self.launcher = _launch.Launcher(kern, (grid,), (threads,),
                                             (P(0), P(1), P(2), P(3), *shape, np.int32(hidden), np.float32(eps)),
                                             pdl=True)

    def __call__(self, px: int, pres: int, pw: int):
        f = self.frame
        out, pout = f.empty(self.shape, self.dtype)
        self.launcher.launch(f.stream(), (px, pres, pw, pout))
        return out


def validate_norm(x, weight, residual, eps) -> tuple[int, int, np.dtype, int]:
    named = [("x", x), ("weight", weight)] + ([("residual", residual)] if residual is not None else [])
    devs = {_device_of(name, t) for name, t in named}
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D [rows, hidden], got shape {tuple(x.shape)}")
    rows, hidden = (int(v) for v in x.shape)
    dt = dtypes.storage(x)
    if dt not in _DTYPES:
        raise TypeError(f"x must be float16 or bfloat16, got {dtypes.text(x)}")
    if rows < 1 or hidden < NORM_VEC or hidden % NORM_VEC:
        raise ValueError(f"x is [{rows}, {hidden}]: rows must be >= 1 and hidden a positive multiple of {NORM_VEC}")
    if tuple(weight.shape) != (hidden,):
        raise ValueError(f"weight must be [hidden] = [{hidden}], got shape {tuple(weight.shape)}")
    if residual is not None and tuple(residual.shape) != (rows, hidden):
        raise ValueError(f"residual must be x's shape {[rows, hidden]}, got {list(residual.shape)}")
    for name, t in named:
        if dtypes.storage(t) != dt:
            raise TypeError(f"{name} must have x's dtype {dtypes.text(x)}, got {dtypes.text(t)}")
        _check_contiguous(name, t)
    if isinstance(eps, bool) or not isinstance(eps, (float, int)) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
    if len(devs) != 1:
        raise ValueError(f"x, weight (and residual) must be on one device, got devices {sorted(devs)}")
    return rows, hidden, dt, devs.pop()


_NORM = _launch.Cache("models.rms_norm")


def rms_norm(x, weight, *, eps: float = 1e-5, residual=None):
    """``x * rsqrt(mean(x^2) + eps) * weight`` per row of x ``[rows, hidden]`` (fp32 statistics), a new array
    like x. With ``residual`` (x's shape): ``residual += x`` in place first (rounded to the dtype), and the
    normalised row is that sum -- the fused add + norm between two sublayers of a pre-norm block."""
    vx, vw = _launch.view(x), _launch.view(weight)
    vr = None if residual is None else _launch.view(residual)
    key = None
    if vx is not None and vw is not None and (residual is None or vr is not None) and type(eps) is float:
        key = (vx[0], vw[0], None if vr is None else vr[0], eps)
    call = _NORM.get(key) if key is not None else None
    if call is None:
        rows, hidden, dt, dev = validate_norm(x, weight, residual, eps)
        call = NormCall(rows, hidden, dt, residual is not None, float(eps), _launch.frame(_launch.is_torch(x), dev))
        if key is not None:
            _NORM.put(key, call)
        vx, vw = _launch.view(x), _launch.view(weight)
        vr = None if residual is None else _launch.view(residual)
    pr = 0 if vr is None else vr[1]
    if (vx[1] | vw[1] | pr) & 15:
        _launch.check_aligned(("x", "weight", "residual"), (vx[1], vw[1], pr))
    return _launch.on_device(call.frame.device_id, call, vx[1], pr, vw[1])


# ---------------------------------------------------------------- rotary


def rotary_tables(seq: int, head_dim: int, theta: float = 10000.0, *, like=None):
    """cos and sin float32 ``[seq, head_dim / 2]``: angle(pos, i) = pos * theta^(-2i / head_dim), made in float64
    on the host. ``like``: a torch tensor or CuPy array whose library and device the tables go to (None: NumPy)."""
    half = head_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2 / head_dim)
    angle = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    if like is None:
        return cos, sin
    if _launch.is_torch(like):
        import torch

        return tuple(torch.from_numpy(t).to(like.device) for t in (cos, sin))
    import cupy

    with cupy.cuda.Device(like.device.id):
        return cupy.asarray(cos), cupy.asarray(sin)


class RotaryCall:
    def __init__(self, tokens: int, heads_total: int, head_dim: int, rot_heads: int, seq: int, dtype: np.dtype,
                 frame):
        import cupy

        self.frame = frame
        work = tokens * rot_heads * (head_dim // 4)
        with cupy.cuda.Device(frame.device_id):
            kern = _compile.kernel(SOURCE, rotary_expression(dtype))
            P = _launch.Ptr  # 0 qkv, 1 cos, 2 sin
            self.launcher = _launch.Launcher(kern, (-(-work // ROPE_THREADS),), (ROPE_THREADS,),
                                             (P(0), P(1), P(2), np.int32(tokens), np.int32(heads_total * head_dim),
                                              np.int32(head_dim), np.int32(rot_heads), np.int32(seq)), pdl=True)

    def __call__(self, pqkv: int, pcos: int, psin: int) -> None:
        self.launcher.launch(self.frame.stream(), (pqkv, pcos, psin))


def validate_rotary(qkv, cos, sin, seq, rot_heads) -> tuple:
    devs = {_device_of(name, t) for name, t in (("qkv", qkv), ("cos", cos), ("sin", sin))}
    if len(qkv.shape) != 3:
        raise ValueError(f"qkv must be 3-D [tokens, heads, head_dim], got shape {tuple(qkv.shape)}")
    tokens, heads_total, head_dim = (int(v) for v in qkv.shape)
    dt = dtypes.storage(qkv)
    if dt not in _DTYPES:
        raise TypeError(f"qkv must be float16 or bfloat16, got {dtypes.text(qkv)}")
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"head_dim {head_dim} (qkv.shape[2]) must be a positive multiple of 4")
    for name, v in (("seq", seq), ("rot_heads", rot_heads)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if not 1 <= rot_heads <= heads_total:
        raise ValueError(f"rot_heads must be in 1..{heads_total} (qkv.shape[1]), got {rot_heads}")
    if tokens < 1:  # an empty grid is not a launch CUDA accepts
        raise ValueError(f"qkv must hold at least one token (qkv.shape[0]), got shape {tuple(qkv.shape)}")
    if seq < 1 or tokens % seq:
        raise ValueError(f"seq must divide the {tokens} tokens (qkv.shape[0]) into whole sequences, got {seq}")
    for name, t in (("cos", cos), ("sin", sin)):
        if dtypes.storage(t) != np.float32:
            raise TypeError(f"{name} must be float32, got {dtypes.text(t)}")
        if len(t.shape) != 2 or int(t.shape[0]) < seq or int(t.shape[1]) != head_dim // 2:
            raise ValueError(f"{name} must be [>= seq, head_dim / 2] = [>= {seq}, {head_dim // 2}], got shape "
                             f"{tuple(t.shape)}")
        _check_contiguous(name, t)
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    _check_contiguous("qkv", qkv)
    if len(devs) != 1:
        raise ValueError(f"qkv, cos and sin must be on one device, got devices {sorted(devs)}")
    return tokens, heads_total, head_dim, dt, devs.pop()


_ROTARY = _launch.Cache("models.rotary")


def rotary_(qkv, cos, sin, *, seq: int, rot_heads: int) -> None:
    """Rotate heads ``[0, rot_heads)`` of qkv ``[tokens, heads, head_dim]`` in place (neox half-rotation), token t
    at position ``t % seq``; cos, sin float32 ``[>= seq, head_dim / 2]`` (``rotary_tables``). With the fused QKV
    projection's output viewed as ``[tokens, heads + 2 kv_heads, head_dim]``, rot_heads = heads + kv_heads rotates
    q and k and leaves v."""
    views = [_launch.view(t) for t in (qkv, cos, sin)]
    key = None
    if None not in views and type(seq) is int and type(rot_heads) is int:
        key = (*(v[0] for v in views), seq, rot_heads)
    call = _ROTARY.get(key) if key is not None else None
    if call is None:
        tokens, heads_total, head_dim, dt, dev = validate_rotary(qkv, cos, sin, seq, rot_heads)
        call = RotaryCall(tokens, heads_total, head_dim, int(rot_heads), int(seq), dt,
                          _launch.frame(_launch.is_torch(qkv), dev))
        if key is not None:
            _ROTARY.put(key, call)
        views = [_launch.view(t) for t in (qkv, cos, sin)]
    pq, pc, ps = (v[1] for v in views)
    if (pq & 3) | ((pc | ps) & 7):
        _launch.check_aligned(("qkv",), (pq,), 4)
        _launch.check_aligned(("cos", "sin"), (pc, ps), 8)
    _launch.on_device(call.frame.device_id, call, pq, pc, ps)
