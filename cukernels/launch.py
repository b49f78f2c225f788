"""The launch cache and the hot path of a call.

A public op keys each call on its *signature*: for every tensor argument ``view(x)``'s key (type, shape,
strides, dtype, device) and the op's flags. The first call with a signature validates completely, plans,
compiles and records a ready ``Launcher`` per kernel (function handle, grid, block, dynamic shared memory and
every constant argument packed once into the parameter buffer). Later calls with that signature fill in the
pointers, take the stream and allocator of the caller's framework (``Frame``) and call ``cuLaunchKernel``:
no planning, no NumPy scalars, no DLPack, no host synchronisation.

What a signature cannot promise is checked per call: the 16-byte alignment of the data pointers, which the
ops' vector loads need (``check_aligned``), and that the arrays' device is the current one (the call moves
to it, as the framework's own ops do).

Frames: CuPy arrays run on CuPy's current stream with outputs from CuPy's memory pool; torch tensors run on
``torch.cuda.current_stream()`` (the raw handle) with outputs and workspaces from torch's caching allocator,
so they follow torch's stream semantics and its CUDA-graph memory pools. A workspace that a call needs only
while its kernels run goes back to the CuPy pool when the call returns; while CuPy's current stream is being
captured into a graph, the pool would hand that memory to later allocations while replays still write it,
so those workspaces are kept alive instead (``release_captured_workspaces`` frees them once the graphs are
gone).
"""
from __future__ import annotations

import ctypes
import functools
import operator
import os
import struct
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from .tma import TensorMap

# numpy scalar types of constant kernel arguments -> their struct format in an 8-byte parameter slot
_SLOT_FORMATS = {np.int32: "<i", np.uint32: "<I", np.int64: "<q", np.uint64: "<Q", np.float32: "<f",
                 np.float64: "<d"}


class Ptr:
    """Placeholder for the ``index``-th pointer that each call hands to ``Launcher.launch``, plus a constant byte
    ``offset`` (an array inside a call's workspace)."""

    __slots__ = ("index", "offset")

    def __init__(self, index: int, offset: int = 0):
        self.index, self.offset = index, int(offset)

    def __repr__(self) -> str:
        return f"Ptr({self.index}, {self.offset})"


class Launcher:
    """One kernel launch with everything but the pointers and the stream fixed.

    ``args`` lists the kernel's parameters in order: ``Ptr(i)`` for the call's i-th pointer, a NumPy scalar
    (``np.int32``, ``np.int64``, ``np.float32``, ``np.uint64`` ...) for a constant, an int for a constant
    pointer, or a ``tma.TensorMap`` (bound to its call pointer at each launch where that pointer moved; a map
    belongs to one launcher, which remembers the pointers it bound its maps to). cuLaunchKernel reads each
    parameter through its own address, so the parameters need not lie in one block: constants sit in 8-byte
    slots of one buffer, the call's pointers in a second buffer, one after the other, which a launch fills with
    one ``struct.pack_into`` (the pointers gathered by an ``operator.itemgetter``, offsets added by ``map``: no
    Python loop). The buffers are shared by the callers of a launcher, hence the lock; cuLaunchKernel copies the
    values before it returns (a graph capture too)."""

    __slots__ = ("name", "_launch", "_launch_pdl", "_params_addr", "_gather", "_offsets", "_pack", "_ptrs", "_maps",
                 "_map_gather", "_map_bases", "_lock", "_keep")

    def __init__(self, kernel, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], *, smem: int = 0,
                 pdl: bool = False):
        kernel.reserve_smem(smem)
        self.name = kernel.name_expression
        grid, block = (tuple(int(v) for v in dims) + (1,) * (3 - len(dims)) for dims in (grid, block))
        if min(grid + block) < 1:
            raise ValueError(f"{self.name}: empty launch grid {grid} x block {block}")
        n = len(args)
        consts = (ctypes.c_uint64 * max(n, 1))()
        ptr_args = [(i, a) for i, a in enumerate(args) if isinstance(a, Ptr)]
        self._ptrs = (ctypes.c_uint64 * max(len(ptr_args), 1))()
        params = (ctypes.c_void_p * max(n, 1))()
        maps = []
        for i, a in enumerate(args):
            if isinstance(a, Ptr):
                continue
            params[i] = ctypes.addressof(consts) + 8 * i
            if isinstance(a, TensorMap):  # a 128-byte parameter: its slot points at the map's own buffer
                params[i] = a.address
                maps.append(a)
            elif isinstance(a, (int, np.integer)) and type(a) in (int, np.uintp, np.uint64):
                consts[i] = int(a)
            else:
                fmt = _SLOT_FORMATS.get(type(a))
                if fmt is None:
                    raise TypeError(f"{self.name}: argument {i} is a {type(a).__name__}; constants must be NumPy "
                                    f"scalars of {', '.join(t.__name__ for t in _SLOT_FORMATS)} or int pointers")
                struct.pack_into(fmt, consts, 8 * i, a)
        for j, (i, _) in enumerate(ptr_args):
            params[i] = ctypes.addressof(self._ptrs) + 8 * j
        indices = [a.index for _, a in ptr_args]
        # itemgetter of one index returns the item, not a 1-tuple
        self._gather = (operator.itemgetter(*indices) if len(indices) > 1 else
                        (lambda ptrs, i=indices[0]: (ptrs[i],)) if indices else (lambda ptrs: ()))
        offsets = tuple(a.offset for _, a in ptr_args)
        self._offsets = offsets if any(offsets) else None
        self._pack = struct.Struct(f"<{len(indices)}Q").pack_into
        self._params_addr = ctypes.addressof(params)
        self._keep = (consts, params)
        self._maps = tuple(maps)
        # the maps' call pointers, compared as one tuple with those of the last launch (one check, not one per map)
        self._map_gather = operator.itemgetter(*(m.index for m in maps), 0) if maps else None
        self._map_bases = None
        self._lock = threading.Lock()
        self._launch = functools.partial(_driver_launch(), kernel.handle, *grid, *block, int(smem))
        # pdl: the kernel waits for the grid before it (griddepcontrol.wait, cukernels/kernels/pdl.cuh) before it
        # touches global memory, so it may be launched while that grid still runs (sm_90 and later)
        self._launch_pdl = _PdlLaunch(kernel.handle, grid, block, int(smem)) if pdl and _pdl_capable() else None

    def launch(self, stream: int, ptrs: Sequence[int]) -> None:
        vals = self._gather(ptrs)
        if self._offsets is not None:
            vals = map(_add, vals, self._offsets)
        with self._lock:
            self._pack(self._ptrs, 0, *vals)
            if self._map_gather is not None and (bases := self._map_gather(ptrs)) != self._map_bases:
                self._map_bases = None  # until every map is bound (bind raises on a misaligned base)
                for m, base in zip(self._maps, bases):  # re-encoded only where the pointer moved (see tma.py)
                    m.bind(base)
                self._map_bases = bases
            fn = self._launch_pdl if self._launch_pdl is not None and PDL[0] else self._launch
            try:
                fn(stream, self._params_addr, 0)
            except Exception as exc:
                if not _no_context(exc):
                    raise
                _make_context_current()  # a thread whose first CUDA work is this launch (see below)
                fn(stream, self._params_addr, 0)


_add = operator.add


def count_launches(fn: Callable[[], Any]) -> int:
    """Kernel launches one call of ``fn`` makes through the engine (``Launcher.launch``, ``compile.Kernel.launch``),
    counted by wrapping both for that call only: the hot path carries no counter. Single-threaded use (the bench);
    launches made by other libraries (CuPy's own kernels, torch) are not counted."""
    from . import compile as _compile

    count = [0]
    saved = Launcher.launch, _compile.Kernel.launch

    def counted(original):
        def launch(self, *args, **kwargs):
            count[0] += 1
            return original(self, *args, **kwargs)
        return launch

    Launcher.launch, _compile.Kernel.launch = counted(saved[0]), counted(saved[1])
    try:
        fn()
    finally:
        Launcher.launch, _compile.Kernel.launch = saved
    return count[0]

# ---------------------------------------------------------------- programmatic dependent launch
#
# A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start while the kernel before it
# on the stream is still running, once every CTA of that kernel has executed griddepcontrol.launch_dependents (or
# exited); it must then execute griddepcontrol.wait (which returns when the previous grid has completed and its
# memory is visible) before it reads that grid's outputs or writes anything the grid may still read. Our kernels
# that do so (pdl.cuh: pdl::wait() before any global access, then pdl::launch_dependents()) are launched this way:
# their launch, block scheduling and prologue (barrier init, tensor-map prefetch, register reallocation) overlap
# the previous kernel's tail, which is most of a small kernel's time in a chain of them (a 128-token decoder
# layer). Stream capture records the launch as a programmatic edge, so CUDA graphs keep the overlap. PDL[0] = False
# (or CUKERNELS_PDL=0 in the environment) launches every kernel the plain way, for A/B runs and as an escape hatch.
PDL = [os.environ.get("CUKERNELS_PDL", "1") != "0"]
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def _launch_kernel_ex():
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


def _pdl_capable() -> bool:
    """The current device takes programmatic dependent launches (compute capability 9.0 or later)."""
    from . import device

    return device.current().compute_capability >= (9, 0)


class _PdlLaunch:
    """cuLaunchKernelEx with the programmatic-stream-serialization attribute, called like CuPy's launchKernel
    (stream, parameter array, extra); the config lives here and only its stream changes per launch (the caller
    holds the launcher's lock)."""

    __slots__ = ("_attr", "_config", "_config_addr", "_fn", "_handle")

    def __init__(self, handle: int, grid, block, smem: int):
        self._attr = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attr.value[0] = 1
        self._config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), smem, None,
                                     ctypes.pointer(self._attr), 1)
        self._config_addr = ctypes.addressof(self._config)
        self._fn, self._handle = _launch_kernel_ex(), handle

    def __call__(self, stream: int, params: int, extra: int) -> None:
        self._config.stream = stream or None
        status = self._fn(self._config_addr, self._handle, params, None)
        if status:
            from cupy_backends.cuda.api.driver import CUDADriverError

            raise CUDADriverError(status)


def _driver_launch():
    """CuPy's cuLaunchKernel binding (imported here: ``import cukernels`` does not import CuPy)."""
    from cupy.cuda import driver

    return driver.launchKernel


_CUDA_ERROR_INVALID_CONTEXT = 201


def _no_context(exc: Exception) -> bool:
    return getattr(exc, "status", None) == _CUDA_ERROR_INVALID_CONTEXT


def _make_context_current() -> None:
    """Make the current device's primary context current on this thread. A driver-API launch needs one, and a
    thread that has done no CUDA runtime work has none: torch's autograd engine runs a backward on its own device
    thread, where torch's ``set_device`` skips ``cudaSetDevice`` when the device number already matches, so our
    backward can be that thread's first CUDA work (measured on an H100: CUDA_ERROR_INVALID_CONTEXT on the first
    ``torch.autograd.grad`` of a fresh process). ``cudaSetDevice`` makes the primary context current."""
    from cupy.cuda import runtime

    runtime.setDevice(runtime.getDevice())


# ---------------------------------------------------------------- the cache


class Cache:
    """Signature -> prepared call, least recently built evicted past ``maxsize`` (a process that sweeps shapes
    does not grow without bound). Thread-safe; a miss may be built twice by racing threads, never half."""

    def __init__(self, name: str, maxsize: int = 1024):
        self.name, self.maxsize = name, maxsize
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.misses = 0

    def get(self, key):
        return self._entries.get(key)

    def put(self, key, entry):
        with self._lock:
            self.misses += 1
            self._entries[key] = entry
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# ---------------------------------------------------------------- tensors


def _cupy_ndarray():
    import cupy

    return cupy.ndarray


_TORCH_TENSOR: type | None = None


def _torch_tensor_type():
    """torch.Tensor when torch is imported (never imports it: ``import attention`` must not)."""
    global _TORCH_TENSOR
    if _TORCH_TENSOR is None and "torch" in sys.modules:
        _TORCH_TENSOR = sys.modules["torch"].Tensor
    return _TORCH_TENSOR


_CUPY_ND: type | None = None


def view(x):
    """``(key, data pointer)`` of a CuPy array or torch tensor from its attributes, or ``None`` for anything else
    (the op's full validation then says what is wrong). The key holds type, shape, strides, dtype and device:
    two tensors with one key can share a launcher."""
    global _CUPY_ND
    if _CUPY_ND is None:
        _CUPY_ND = _cupy_ndarray()
    t = type(x)
    if t is _CUPY_ND:
        mem = x.data
        return (t, x.shape, x.strides, x.dtype, mem.device_id), mem.ptr
    tt = _TORCH_TENSOR or _torch_tensor_type()
    if tt is not None and isinstance(x, tt) and x.is_cuda:
        return (tt, x.shape, x.stride(), x.dtype, x.get_device()), x.data_ptr()
    return None


def pointer(x) -> int:
    """The data pointer of a CuPy array or torch tensor (whose signature is already known)."""
    if is_torch(x):
        return x.data_ptr()
    return x.data.ptr


def is_torch(x) -> bool:
    tt = _TORCH_TENSOR or _torch_tensor_type()
    return tt is not None and isinstance(x, tt)


# ---------------------------------------------------------------- frames: stream, device, allocator

# storage dtype names -> (numpy dtype for CuPy, torch dtype attribute name)
_DTYPES = {"fp16": (np.dtype(np.float16), "float16"), "bf16": (np.dtype(np.uint16), "bfloat16"),
           "fp32": (np.dtype(np.float32), "float32"), "int32": (np.dtype(np.int32), "int32"),
           "uint8": (np.dtype(np.uint8), "uint8")}

_CAPTURED: list = []  # CuPy workspaces of calls captured into graphs (see the module doc)


def captured_workspaces_since(mark: int) -> list:
    """Hand the caller the workspaces kept for captures since ``len`` of the list was ``mark`` (an owner of a
    graph takes those of its own capture, and frees them with the graph)."""
    taken = _CAPTURED[mark:]
    del _CAPTURED[mark:]
    return taken


def captured_mark() -> int:
    return len(_CAPTURED)


def release_captured_workspaces() -> int:
    """Let go of the CuPy workspaces that calls captured into CUDA graphs kept alive; call it once every graph
    that replays them is destroyed. Returns how many were released."""
    n = len(_CAPTURED)
    _CAPTURED.clear()
    return n


class _Frame:
    _MADE_MAX = 4096  # allocators kept by ``empty`` (a process sweeping shapes does not grow without bound)

    def empty(self, shape, dtype: str):
        """``(array, data pointer)``: an uninitialised array of ``shape`` (a tuple) and ``dtype``, through an
        allocator made once per (shape, dtype)."""
        made = self._made
        make = made.get((shape, dtype))
        if make is None:
            if len(made) >= self._MADE_MAX:
                made.clear()
            make = made[(shape, dtype)] = self.allocator(shape, dtype)
        a = make()
        return a, self.ptr(a)

    def capturing(self, stream: int) -> bool:
        """Whether ``stream`` (a raw handle; 0, the legacy stream, never is) is being captured into a graph."""
        return bool(stream) and bool(self._capturing(stream))


class CupyFrame(_Frame):
    """CuPy arrays: CuPy's current stream and memory pool."""

    torch = False

    def __init__(self, device_id: int):
        import cupy

        self.device_id = device_id
        self._made: dict = {}
        self._empty = cupy.ndarray  # what cupy.empty calls, without its Python layer
        self._alloc = cupy.cuda.alloc
        self._stream = cupy.cuda.get_current_stream
        self._capturing = cupy.cuda.runtime.streamIsCapturing
        self._np = {name: np_dt for name, (np_dt, _) in _DTYPES.items()}

    ptr = staticmethod(operator.attrgetter("data.ptr"))  # an array's data pointer

    def stream(self) -> int:
        return self._stream().ptr

    def allocator(self, shape, dtype: str):
        """A callable that makes an uninitialised array of ``shape`` and ``dtype``: what a cached call holds for
        each of its outputs (a prepared call is cheaper than ``empty``'s argument handling: 2.7 vs 3.9 us per
        array, H100 host, 2026-11-23)."""
        return functools.partial(self._empty, tuple(shape), self._np[dtype])

    def workspace(self, stream: int, nbytes: int):
        """Scratch memory for the kernels of one call (see the module doc for graph capture)."""
        mem = self._alloc(max(nbytes, 1))  # a MemoryPointer of CuPy's pool: no array object needed
        if self.capturing(stream):
            _CAPTURED.append(mem)
        return mem, mem.ptr

    def view(self, buf, offset: int, shape, dtype: str):
        """An array of ``shape`` and ``dtype`` at byte ``offset`` of a ``workspace`` (which it keeps alive)."""
        import cupy

        return cupy.ndarray(shape, self._np[dtype], memptr=buf + offset)


class TorchFrame(_Frame):
    """torch tensors: ``torch.cuda.current_stream()`` of the tensors' device and torch's caching allocator."""

    torch = True

    def __init__(self, device_id: int):
        import torch

        self.device_id = device_id
        self._made: dict = {}
        self._device = torch.device("cuda", device_id)
        self._torch_empty = torch.empty
        self.empty_like = torch.empty_like
        self._dt = {name: getattr(torch, attr) for name, (_, attr) in _DTYPES.items()}
        self.ptr = torch.Tensor.data_ptr  # a tensor's data pointer
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what torch's compiled code calls
        self._bytes = functools.partial(torch.empty, dtype=torch.uint8, device=self._device)
        from cupy.cuda import runtime

        self._capturing = runtime.streamIsCapturing
        if raw is not None:
            self.stream = functools.partial(raw, device_id)
        else:  # pragma: no cover - older torch
            self.stream = lambda: torch.cuda.current_stream(device_id).cuda_stream

    def allocator(self, shape, dtype: str):
        """A callable that makes an uninitialised tensor of ``shape`` and ``dtype`` from torch's allocator on the
        frame's device (a prepared ``torch.empty``: 3.0 vs 3.8 us per tensor, H100 host, 2026-11-23)."""
        return functools.partial(self._torch_empty, *(tuple(shape) or ((),)), dtype=self._dt[dtype],
                                 device=self._device)

    def workspace(self, stream: int, nbytes: int):
        t = self._bytes(max(nbytes, 1))
        return t, t.data_ptr()

    def view(self, buf, offset: int, shape, dtype: str):
        """A tensor of ``shape`` and ``dtype`` at byte ``offset`` of a ``workspace``."""
        dt = self._dt[dtype]
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return buf[offset:offset + n].view(dt).view(shape)


_FRAMES: dict = {}


def frame(torch_mode: bool, device_id: int):
    """The frame of a call whose tensors are torch (or CuPy) on ``device_id``; one per (framework, device)."""
    key = (torch_mode, device_id)
    f = _FRAMES.get(key)
    if f is None:
        f = _FRAMES[key] = (TorchFrame if torch_mode else CupyFrame)(device_id)
    return f


_get_device: Callable[[], int] | None = None


def current_device() -> int:
    global _get_device
    if _get_device is None:
        import cupy

        _get_device = cupy.cuda.runtime.getDevice
    return _get_device()


def on_device(device_id: int, fn: Callable, *args):
    """Run ``fn(*args)`` with ``device_id`` current (the launch needs its context); the fast case is a compare."""
    if current_device() == device_id:
        return fn(*args)
    import cupy

    with cupy.cuda.Device(device_id):
        return fn(*args)


def check_aligned(names: Sequence[str], ptrs: Sequence[int], align: int = 16) -> None:
    """Raise naming the first pointer that is not ``align``-byte aligned."""
    for name, p in zip(names, ptrs):
        if p % align:
            raise ValueError(f"{name}'s data pointer must be {align}-byte aligned (offset views of a {align}-byte "
                             f"multiple only), got address {p:#x}")


class KeptWorkspace:
    """A prepared call's scratch memory of ``nbytes``, kept for the call's next run when it is at most
    ``KEEP_BYTES``: ``take(frame, stream)`` returns ``(owner, pointer)`` like ``frame.workspace``, handing back the
    kept memory when the last run was on the same stream from the same thread (stream order then separates one
    run's kernels from the next's) and the stream is not being captured. Runs under capture take fresh memory
    (the graph's; never kept), and larger workspaces go back after each run, as ``frame.workspace``'s do. For
    scratch that no output aliases and that no work outside the call's own launches reads: a kept buffer is
    overwritten by the next run. Saves an allocation per call (3-5 us of host time) where a small problem's
    time is the host's (docs/perf/engine.md, tenth session)."""

    KEEP_BYTES = 1 << 20
    __slots__ = ("nbytes", "kept", "keep_bytes")

    def __init__(self, nbytes: int, keep_bytes: int | None = None):
        self.nbytes = nbytes
        self.keep_bytes = self.KEEP_BYTES if keep_bytes is None else int(keep_bytes)  # what a caller may keep
        self.kept = None  # (stream, thread, pointer, owner) of the last run

    def take(self, frame, stream: int):
        return self.take_new(frame, stream)[:2]

    def take_new(self, frame, stream: int):
        """``take``, whether the memory is new (not the kept memory of an earlier run: for scratch that a call's
        kernels leave in a known state for the next, counters set back to zero, which new memory must first be
        put in), and whether ``stream`` is being captured (then the memory is new); the stream is asked once."""
        captured = frame.capturing(stream)
        kept = self.kept
        if not captured and kept is not None and kept[0] == stream and kept[1] == _thread_id():
            return kept[3], kept[2], False, False
        owner, ptr = frame.workspace(stream, self.nbytes)
        if self.nbytes <= self.keep_bytes and not captured:
            self.kept = (stream, _thread_id(), ptr, owner)
        return owner, ptr, True, captured


_thread_id = threading.get_ident


class Workspace:
    """Byte offsets of a call's scratch arrays in one allocation: ``add`` returns each one's offset (256-byte
    aligned), ``nbytes`` the total."""

    def __init__(self):
        self.nbytes = 0

    def add(self, nbytes: int) -> int:
        off = self.nbytes
        self.nbytes += -(-int(nbytes) // 256) * 256
        return off
