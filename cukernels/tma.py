"""Tensor maps for Hopper's tensor memory accelerator (TMA): the driver's ``cuTensorMapEncodeTiled`` (called through
ctypes; NVIDIA's ``cuda-bindings`` package, the ``hopper`` extra ``pip install 'cukernels[hopper]'``, gives its
enums and is what makes TMA available), held as kernel parameters.

A kernel takes a map by value as ``const __grid_constant__ tma::TensorMap`` (cukernels/kernels/tma.cuh). A
``TensorMap`` here is that parameter: 128 bytes at a 64-byte-aligned address, which ``launch.Launcher`` points its
parameter slot at. Everything but the base address is fixed when the map is made (element type, sizes, strides,
box, swizzle); the base address comes from the call: ``bind(address)`` re-encodes only when it differs from the
last one, so a cached launcher whose inputs come back at the same address (a training step, a captured graph)
never encodes twice.

Validation happens when the map is made, with the rules of the driver's documentation (rank 1-5, a 16-byte
aligned base, strides multiples of 16 bytes, box sides 1-256, an inner box of a multiple of 16 bytes no wider than
the swizzle span), so a bad layout is a clear ``ValueError`` here, not an opaque CUresult at the first launch.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

SWIZZLES = (0, 32, 64, 128)  # bytes of the swizzle span; 0 = none


@functools.cache
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ImportError("TMA tensor maps need NVIDIA's cuda-bindings package: pip install 'cukernels[hopper]' "
                          "(or pip install cuda-bindings)") from exc
    return driver


def available() -> str | None:
    """Why tensor maps cannot be encoded here (no cuda-bindings), or None."""
    try:
        _driver()
    except ImportError as exc:
        return str(exc)
    return None


_DTYPES = {  # element size -> the driver's data type used for bit copies of that size
    1: "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    2: "CU_TENSOR_MAP_DATA_TYPE_UINT16",
    4: "CU_TENSOR_MAP_DATA_TYPE_UINT32",
    8: "CU_TENSOR_MAP_DATA_TYPE_UINT64",
}
_FLOAT_DTYPES = {"float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "bfloat16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
                 "float32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}


class TensorMap:
    """A tiled tensor map over ``dims`` elements (innermost first, as the driver counts them), ``strides`` bytes
    between consecutive rows of each outer dimension (len(dims) - 1 values), a ``box`` of elements per copy, the
    shared-memory ``swizzle`` span in bytes (0, 32, 64, 128). ``dtype``: an element size in bytes (1, 2, 4, 8: the
    data are copied as bits) or "float16" / "bfloat16" / "float32". ``index``/``offset``: the call pointer the
    base address comes from (``launch.Launcher`` binds it at each launch), plus a byte offset."""

    __slots__ = ("dims", "strides", "box", "swizzle", "dtype", "index", "offset", "_buf", "address", "_bound", "_recent",
                 "_c_args")

    def __init__(self, dtype, dims, strides, box, *, swizzle: int = 128, index: int = 0, offset: int = 0):
        self.dims, self.strides, self.box = (tuple(int(v) for v in x) for x in (dims, strides, box))
        self.swizzle, self.dtype, self.index, self.offset = int(swizzle), dtype, int(index), int(offset)
        self._check()
        self._buf = (ctypes.c_uint8 * (128 + 63))()
        self.address = (ctypes.addressof(self._buf) + 63) & ~63  # what the kernel parameter slot points at
        self._bound = None
        self._recent = {}  # base address -> encoded bytes, the last RECENT ones (buffers that alternate)
        self._c_args = None

    def _check(self) -> None:
        rank = len(self.dims)
        if not 1 <= rank <= 5:
            raise ValueError(f"a tensor map has 1 to 5 dimensions, got dims {self.dims}")
        if len(self.strides) != rank - 1:
            raise ValueError(f"strides: {rank - 1} values (bytes between rows of each outer dimension) for dims "
                             f"{self.dims}, got {self.strides}")
        if len(self.box) != rank:
            raise ValueError(f"box: one value per dimension ({rank}), got {self.box}")
        if isinstance(self.dtype, str):
            if self.dtype not in _FLOAT_DTYPES:
                raise ValueError(f"dtype must be one of {sorted(_FLOAT_DTYPES)} or an element size, got "
                                 f"{self.dtype!r}")
        elif self.dtype not in _DTYPES:
            raise ValueError(f"element size must be one of {sorted(_DTYPES)} bytes, got {self.dtype!r}")
        size = self._elem_size()
        if any(d < 1 or d > 2**32 for d in self.dims):
            raise ValueError(f"dims must be 1..2**32 elements each, got {self.dims}")
        if any(s % 16 or s <= 0 or s >= 2**40 for s in self.strides):
            raise ValueError(f"strides must be positive multiples of 16 bytes below 2**40, got {self.strides}")
        if any(b < 1 or b > 256 for b in self.box):
            raise ValueError(f"box sides must be 1..256 elements, got {self.box}")
        inner = self.box[0] * size
        if inner % 16:
            raise ValueError(f"the box's inner side must be a multiple of 16 bytes, got {self.box[0]} x {size} B")
        if self.swizzle not in SWIZZLES:
            raise ValueError(f"swizzle must be one of {SWIZZLES} (bytes), got {self.swizzle}")
        if self.swizzle and inner > self.swizzle:
            raise ValueError(f"with a {self.swizzle}-byte swizzle the box's inner side is at most {self.swizzle} "
                             f"bytes, got {inner}")

    def __repr__(self) -> str:
        return (f"TensorMap(dtype={self.dtype!r}, dims={self.dims}, strides={self.strides}, box={self.box}, "
                f"swizzle={self.swizzle})")

    @property
    def box_bytes(self) -> int:
        """Bytes one copy moves (the mbarrier transaction count of a load)."""
        return int(np.prod(self.box)) * self._elem_size()

    def _elem_size(self) -> int:
        return {"float16": 2, "bfloat16": 2, "float32": 4}[self.dtype] if isinstance(self.dtype, str) else self.dtype

    def _encode_args(self):
        d = _driver()
        u64, u32 = d.cuuint64_t, d.cuuint32_t
        name = _FLOAT_DTYPES[self.dtype] if isinstance(self.dtype, str) else _DTYPES[self.dtype]
        swz = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}[self.swizzle]
        return (getattr(d.CUtensorMapDataType, name), len(self.dims), [u64(v) for v in self.dims],
                [u64(v) for v in self.strides], [u32(v) for v in self.box], [u32(1)] * len(self.dims),
                d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                getattr(d.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swz}"),
                d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)

    RECENT = 8

    def bind(self, address: int) -> None:
        """Encode the map for base ``address`` into the parameter buffer (nothing to do if already there; a copy
        of the bytes when it was one of the last RECENT addresses, as when a caller's buffers alternate)."""
        address = int(address) + self.offset
        if address == self._bound:
            return
        if (cached := self._recent.get(address)) is not None:
            ctypes.memmove(self.address, cached, 128)
            self._bound = address
            return
        if address % 16:
            raise ValueError(f"a tensor map's base address must be 16-byte aligned, got {address:#x} ({self})")
        if self._c_args is None:
            self._c_args = _c_arguments(self._encode_args())
        a = self._c_args
        err = _c_encoder()(self.address, a[0], a[1], address, a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9])
        if err:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {err} for {self} at {address:#x}")
        self._bound = address
        if len(self._recent) >= self.RECENT:
            self._recent.pop(next(iter(self._recent)))  # the oldest
        self._recent[address] = ctypes.string_at(self.address, 128)


@functools.cache
def _c_encoder():
    """The driver's ``cuTensorMapEncodeTiled`` called through ctypes with prepared argument arrays, writing straight
    into a map's parameter buffer. Measured on an H100: 1.8-2.0 us per encode against 12-16 us through
    cuda-bindings' wrapper, which builds its argument objects on each call; a training step's layers share one
    cached launcher and hand it new addresses, so this is paid on every call there. cuda-bindings stays the
    dependency that makes TMA available (its enums give the argument values)."""
    _driver()
    try:
        from .compile import libcuda

        fn = libcuda().cuTensorMapEncodeTiled
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"cannot call cuTensorMapEncodeTiled in the CUDA driver (libcuda.so.1): {exc}") from exc
    p, i, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
    fn.restype = ctypes.c_int
    fn.argtypes = [p, i, u32, p, p, p, p, p, i, i, i, i]
    return fn


def _c_arguments(args) -> tuple:
    """``_encode_args``' values as ctypes arrays (kept alive by the returned tuple) and plain ints, in the order
    of cuTensorMapEncodeTiled after the output and the address: (dtype, rank, dims, strides, box, element strides,
    interleave, swizzle, L2 promotion, OOB fill, the arrays)."""
    dtype, rank, dims, strides, box, estr, *enums = args
    arrays = ((ctypes.c_uint64 * rank)(*(int(v) for v in dims)),
              (ctypes.c_uint64 * max(rank - 1, 1))(*(int(v) for v in strides)),
              (ctypes.c_uint32 * rank)(*(int(v) for v in box)), (ctypes.c_uint32 * rank)(*(int(v) for v in estr)))
    return (int(dtype), rank, *(ctypes.addressof(x) for x in arrays), *(int(e) for e in enums), arrays)


def max_active_clusters(kernel_handle: int, cluster: int, threads: int, smem: int) -> int:
    """How many clusters of ``cluster`` CTAs (``threads`` each, ``smem`` dynamic bytes, already reserved on the
    kernel) the device runs at once (``cuOccupancyMaxActiveClusters``): the grid of a persistent clustered kernel.
    The SMs of a cluster come from one GPC, so this can be less than SMs / cluster."""
    d = _driver()
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cluster, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = smem
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
    cfg.attrs, cfg.numAttrs = [attr], 1
    err, n = d.cuOccupancyMaxActiveClusters(d.CUfunction(init_value=int(kernel_handle)), cfg)
    if err != d.CUresult.CUDA_SUCCESS or n < 1:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed ({err!r}, {n}) for clusters of {cluster} x "
                           f"{threads} threads with {smem} B of shared memory")
    return int(n)
