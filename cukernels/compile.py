"""The one place that builds kernels.

``kernel(source, name_expression)`` compiles a templated ``.cu`` file with NVRTC through ``cupy.RawModule``
for the current device (``-arch=sm_90a`` on Hopper) and returns a launchable ``Kernel``, cached per
(device, source tree, options, name expression). ``compile_offline`` compiles the same source for a named arch
with no GPU at all and returns the ptxas resource report (registers, spills, static shared memory, stack):
that is how CI proves every planned variant builds, without spills, for every profile's architecture.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Iterable, Sequence

from . import device as _device

_BASE_OPTIONS = ("-std=c++17",)
_DEFAULT_DYNAMIC_SMEM = 48 * 1024


class CompileError(RuntimeError):
    def __init__(self, source: Path, name_expressions: Sequence[str], options: Sequence[str], log: str):
        self.source, self.name_expressions, self.options, self.log = source, tuple(name_expressions), tuple(options), log
        super().__init__(
            f"NVRTC failed to compile {Path(source).name} for {', '.join(name_expressions)}\n"
            f"options: {' '.join(options)}\n--- NVRTC log ---\n{log.strip()}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resources:
    """ptxas' report for one kernel instance."""

    name_expression: str
    arch: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    static_smem_bytes: int
    # ptxas' "Potential Performance Loss" notes for this kernel (e.g. C7515: its wgmma serialised, each waiting
    # for the last), which a kernel that must keep the tensor cores fed may not have
    performance_warnings: tuple[str, ...] = ()

    @property
    def spills(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


# ---------------------------------------------------------------- sources and include paths


@functools.cache
def toolkit_include_dirs() -> tuple[str, ...]:
    """CUDA headers of the installed toolkit wheels (``cupy-cuda13x[ctk]``) or of a CUDA_PATH install."""
    found = []
    try:
        import nvidia  # namespace package of the NVIDIA wheels

        for root in nvidia.__path__:
            for candidate in sorted(Path(root).glob("*/include")):
                if (candidate / "cuda_fp16.h").exists() or (candidate / "cuda_runtime.h").exists():
                    found.append(str(candidate))
    except ImportError:
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        base = os.environ.get(env)
        if base and (Path(base) / "include" / "cuda_fp16.h").exists():
            found.append(str(Path(base) / "include"))
    if not found and Path("/usr/local/cuda/include/cuda_fp16.h").exists():
        found.append("/usr/local/cuda/include")
    return tuple(dict.fromkeys(found))


# headers every op's kernels may include (e.g. "wgmma.cuh"): the engine's own kernel folder
ENGINE_INCLUDE = Path(__file__).resolve().parent / "kernels"


def _tree_digest(source: Path) -> str:
    """Digest of the source and every header it can include (its folder and the engine's): CuPy's disk cache
    keys on the top file only."""
    h = hashlib.sha256()
    for path in sorted(source.parent.glob("*.cu*")) + sorted(ENGINE_INCLUDE.glob("*.cuh")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _options(source: Path, arch: str, options: Iterable[str]) -> tuple[str, ...]:
    opts = list(_BASE_OPTIONS) + [f"-arch={arch}", f"-I{source.parent}", f"-I{ENGINE_INCLUDE}"]
    opts += [f"-I{d}" for d in toolkit_include_dirs()]
    opts.append(f"-DCUKERNELS_SOURCE_DIGEST=0x{_tree_digest(source)}")
    opts += list(options)
    return tuple(opts)


# ---------------------------------------------------------------- on a GPU


@functools.cache
def libcuda():
    """The CUDA driver library through ctypes, for the entry points CuPy does not expose (occupancy, tensor-map
    encoding in cukernels.tma)."""
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


class Kernel:
    """A compiled kernel instance; ``launch`` checks the dynamic shared memory against the device first."""

    def __init__(self, raw, name_expression: str, spec: _device.DeviceSpec, module=None):
        self._raw = raw
        self.module = module  # the cupy.RawModule (its __device__ globals: get_global), for probes and tools
        self.name_expression = name_expression
        self.spec = spec
        # the default dynamic limit is what the 48 KB default leaves beside the kernel's static shared memory
        self.static_smem = int(raw.shared_size_bytes)
        self._smem_raised_to = _DEFAULT_DYNAMIC_SMEM - self.static_smem
        self._lock = threading.Lock()

    @property
    def registers(self) -> int:
        return int(self._raw.num_regs)

    @property
    def handle(self) -> int:
        """The ``CUfunction`` (loaded on this kernel's device) for ``cukernels.launch.Launcher``."""
        return int(self._raw.kernel.ptr)

    def reserve_smem(self, smem: int) -> None:
        """Check ``smem`` dynamic bytes against the device and raise the kernel's dynamic limit to it once."""
        if smem + self.static_smem > self.spec.smem_per_block_optin:
            raise ValueError(
                f"{self.name_expression}: {smem} bytes of dynamic shared memory requested beside "
                f"{self.static_smem} static; the device allows {self.spec.smem_per_block_optin} per block"
            )
        if smem > self._smem_raised_to:
            with self._lock:
                self._raw.max_dynamic_shared_size_bytes = smem
                self._smem_raised_to = smem

    def blocks_per_sm(self, threads: int, smem: int) -> int:
        """CTAs of ``threads`` threads and ``smem`` dynamic bytes that one SM holds at once (the driver's occupancy
        calculator, cuOccupancyMaxActiveBlocksPerMultiprocessor, through ctypes: CuPy does not expose it)."""
        import ctypes

        self.reserve_smem(smem)
        n = ctypes.c_int(0)
        rc = libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(self.handle), ctypes.c_int(threads), ctypes.c_size_t(smem))
        if rc != 0:
            raise RuntimeError(f"{self.name_expression}: cuOccupancyMaxActiveBlocksPerMultiprocessor failed ({rc})")
        return int(n.value)

    def resident_grid(self, work: int, threads: int, smem: int) -> int:
        """A persistent grid: ``work`` CTAs at most, and no more than the GPU holds at once (``blocks_per_sm`` on
        every SM), so CTAs that wait on each other's counters are all running; at least one."""
        return max(1, min(int(work), self.blocks_per_sm(threads, smem) * self.spec.sm_count))

    def launch(self, grid, block, args, *, smem: int = 0, stream=None) -> None:
        """A one-off launch through CuPy (arrays and NumPy scalars as arguments); the ops' hot paths use
        ``cukernels.launch.Launcher`` instead."""
        self.reserve_smem(smem)
        self._raw(tuple(grid), tuple(block), tuple(args), shared_mem=smem, stream=stream)


_cache: dict[tuple, Kernel] = {}
_cache_lock = threading.Lock()
_BUILT_WITH: list = []  # (options, name part, kernels built) of the open kernels_built_with blocks


@contextlib.contextmanager
def kernels_built_with(options: Sequence[str], name_part: str = ""):
    """Within the block, every kernel whose name expression contains ``name_part`` is built with the extra compile
    ``options`` appended (``-DMACRO=V``: a probe or a kernel variant behind an ``#if``, for A/B runs; the innermost
    matching block wins); yields the list of the kernels so built. Every package's kernel lookups go through
    ``kernel`` and honour it; an op's call cached meanwhile keeps the kernels it was made with, so the caller clears
    the ops' caches around the block (``moe.launch.kernels_built_with`` also clears the MoE plan cache)."""
    entry = (tuple(options), name_part, [])
    _BUILT_WITH.append(entry)
    try:
        yield entry[2]
    finally:
        _BUILT_WITH.remove(entry)


def kernel(source: Path | str, name_expression: str, *, options: Sequence[str] = ()) -> Kernel:
    """Compile (once per process, device, source, options) and return the kernel ``name_expression``, with the
    options of an open ``kernels_built_with`` block whose name part it contains.

    The hot path is one dictionary lookup: sources are read and hashed only on the first call for a key, so a
    kernel file edited while a process runs is picked up by the next process (CuPy's disk cache is keyed on the
    digest of the whole kernels folder, so it never serves a stale binary)."""
    if _BUILT_WITH:
        for extra, part, built in reversed(_BUILT_WITH):
            if part in name_expression:
                kern = _build(source, name_expression, (*options, *extra))
                built.append(kern)
                return kern
    return _build(source, name_expression, options)


def _build(source: Path | str, name_expression: str, options: Sequence[str]) -> Kernel:
    import cupy

    dev_id = cupy.cuda.runtime.getDevice()
    key = (dev_id, source, tuple(options), name_expression)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    path = Path(source)
    spec = _device.current()
    opts = _options(path, spec.arch, options)
    try:
        module = cupy.RawModule(code=path.read_text(), options=opts, name_expressions=[name_expression],
                                backend="nvrtc")
        raw = module.get_function(name_expression)
    except cupy.cuda.compiler.CompileException as exc:
        raise CompileError(path, [name_expression], opts, str(exc)) from exc
    built = Kernel(raw, name_expression, spec, module)
    with _cache_lock:
        _cache[key] = built
    return built


# ---------------------------------------------------------------- offline (no GPU)

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_PERF = re.compile(r"\((C\d+)\) Potential Performance Loss: (.*?) in the function '([^']+)'")


def _parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = out.setdefault(m.group(1), {"stack": 0, "spill_st": 0, "spill_ld": 0, "regs": 0, "smem": 0})
        elif current is not None and (m := _PROPS.search(line)):
            current["stack"], current["spill_st"], current["spill_ld"] = map(int, m.groups())
        elif current is not None and (m := _USED.search(line)):
            current["regs"] = int(m.group(1))
            if s := _SMEM.search(line):
                current["smem"] = int(s.group(1))
    return out


def _performance_warnings(log: str) -> dict[str, tuple[str, ...]]:
    """Lowered kernel name -> ptxas' performance notes on it ("C7515: wgmma.mma_async instructions are ...")."""
    out: dict[str, list[str]] = {}
    for m in _PERF.finditer(log):
        out.setdefault(m.group(3), []).append(f"{m.group(1)}: {m.group(2)}")
    return {k: tuple(v) for k, v in out.items()}


_PTX_ENTRY = re.compile(r"\.entry\s+(\S+?)\s*\(")


@contextlib.contextmanager
def _offline_program(source: Path, name_expressions: Sequence[str], opts: Sequence[str]):
    """An NVRTC program of ``source`` with ``name_expressions``, compiled with ``opts`` (no GPU needed); yields
    (nvrtc, program); CompileError with the log on failure; destroyed on exit."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source.read_text(), source.name, [], [])
    try:
        for expr in name_expressions:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError as exc:
            raise CompileError(source, name_expressions, opts, nvrtc.getProgramLog(prog) or str(exc)) from exc
        yield nvrtc, prog
    finally:
        nvrtc.destroyProgram(prog)


def instruction_counts(
    source: Path | str, name_expressions: Sequence[str], arch: str, *, options: Sequence[str] = ()
) -> dict[str, collections.Counter]:
    """Compile to PTX for ``arch`` with no GPU; per name expression, how many times each PTX instruction (opcode
    with its type suffixes, e.g. ``add.s32``, ``wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16``) appears
    in the kernel's body. Two builds whose counts match differ at most in order and register names: what a
    refactor that should not change the generated code is checked with (tools/ptx_diff.py)."""
    source = Path(source)
    opts = _options(source, arch, options)
    with _offline_program(source, name_expressions, opts) as (nvrtc, prog):
        ptx = nvrtc.getPTX(prog)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        bodies: dict[str, collections.Counter] = {}
        current = None
        for raw in ptx.splitlines():
            line = raw.split("//", 1)[0].strip()
            if m := _PTX_ENTRY.search(line):
                current = bodies.setdefault(m.group(1), collections.Counter())
                continue
            if current is None or not line.endswith(";") or line.startswith((".", "{", "}")):
                continue
            tokens = line.split()
            if tokens[0].startswith("@"):  # a predicate guard
                tokens = tokens[1:]
            if tokens:
                current[tokens[0].rstrip(";")] += 1
        result = {}
        for expr in name_expressions:
            lowered = nvrtc.getLoweredName(prog, expr)
            if lowered not in bodies:
                raise CompileError(source, [expr], opts, f"no PTX entry for {lowered}")
            result[expr] = bodies[lowered]
        return result


def _libnvrtc():
    """The libnvrtc CuPy compiles with, as a ctypes library (found in this process's mappings once CuPy loaded it)."""
    import ctypes

    from cupy_backends.cuda.libs import nvrtc

    nvrtc.getVersion()  # loads the library
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "libnvrtc.so" in Path(path).name:
            return ctypes.CDLL(path)
    raise RuntimeError("libnvrtc is not mapped in this process (CuPy's NVRTC could not be found)")


def cubin(source: Path | str, name_expression: str, arch: str, *, options: Sequence[str] = ()) -> bytes:
    """The cubin NVRTC builds for one kernel instance with the engine's options (no GPU): the code a device of
    ``arch`` runs, for disassembly (tools/sass.py). Read with libnvrtc's own nvrtcGetCUBIN: CuPy's getCUBIN
    returns it one byte short (a C string's length), which nvdisasm refuses."""
    import ctypes

    source = Path(source)
    lib = _libnvrtc()
    opts = _options(source, arch, options)
    with _offline_program(source, [name_expression], opts) as (_, prog):
        n = ctypes.c_size_t(0)
        if lib.nvrtcGetCUBINSize(ctypes.c_void_p(prog), ctypes.byref(n)) != 0:
            raise RuntimeError("nvrtcGetCUBINSize failed")
        buf = ctypes.create_string_buffer(n.value)
        if lib.nvrtcGetCUBIN(ctypes.c_void_p(prog), buf) != 0:
            raise RuntimeError("nvrtcGetCUBIN failed")
        return buf.raw


@functools.cache
def _no_cache() -> tuple[str, ...]:
    """``--no-cache`` where NVRTC has a cache (12.9 on). With a driver present, NVRTC 12.9+ keeps the cubins it
    built in the driver's compute cache and answers a repeat of the same program from it without running ptxas:
    the program log then holds no ptxas report (seen on the GPU machines with NVRTC 13.0, from the second compile
    of one architecture in a process), and resources read from it would be missing. Without a driver (CI) there
    is no cache, so it never showed there."""
    from cupy.cuda import nvrtc

    return ("--no-cache",) if tuple(nvrtc.getVersion()) >= (12, 9) else ()


# compile_offline's programs: at most OFFLINE_CHUNK expressions each (NVRTC takes markedly longer per instance in
# one large program than in several small ones), OFFLINE_JOBS of them at once in threads (NVRTC compiles without
# the GIL: two programs in two threads 1.38 s against 2.57 one after the other; each takes its own memory)
OFFLINE_CHUNK = 8
OFFLINE_JOBS = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def compile_offline(
    source: Path | str, name_expressions: Sequence[str], arch: str, *, options: Sequence[str] = (),
    jobs: int | None = None,
) -> dict[str, Resources]:
    """Compile for ``arch`` (e.g. ``sm_80``, ``sm_90a``) with no GPU; return ptxas resources per name expression
    (``compile_offline_all`` of this one job; ``jobs``: threads, default ``OFFLINE_JOBS``)."""
    return compile_offline_all([(source, name_expressions, arch)], options=options, jobs=jobs)[0]


def compile_offline_all(
    work: Iterable[tuple[Path | str, Sequence[str], str]], *, options: Sequence[str] = (), jobs: int | None = None
) -> list[dict[str, Resources]]:
    """``compile_offline`` of several (source, name expressions, arch) at once, one dict per item in order: every
    item's expressions in programs of at most ``OFFLINE_CHUNK``, ``jobs`` (default ``OFFLINE_JOBS``) programs at a
    time in threads. ptxas reports each kernel alone, so the resources are those of one program with them all."""
    items = [(Path(src), list(exprs), arch) for src, exprs, arch in work]
    programs = [(i, src, exprs[k:k + OFFLINE_CHUNK], arch) for i, (src, exprs, arch) in enumerate(items)
                for k in range(0, max(len(exprs), 1), OFFLINE_CHUNK)]
    workers = min(OFFLINE_JOBS if jobs is None else max(1, jobs), len(programs))
    if workers <= 1:
        parts = [_compile_offline(src, exprs, arch, options) for _, src, exprs, arch in programs]
    else:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(lambda p: _compile_offline(p[1], p[2], p[3], options), programs))
    merged: list[dict[str, Resources]] = [{} for _ in items]
    for (i, *_), part in zip(programs, parts):
        merged[i].update(part)
    return [{e: merged[i][e] for e in exprs} for i, (_, exprs, _) in enumerate(items)]


def _compile_offline(source: Path, name_expressions: Sequence[str], arch: str, options: Sequence[str]
                     ) -> dict[str, Resources]:
    opts = _options(source, arch, options) + ("--ptxas-options=-v",) + _no_cache()
    with _offline_program(source, name_expressions, opts) as (nvrtc, prog):
        log = nvrtc.getProgramLog(prog)
        parsed, perf = _parse_ptxas(log), _performance_warnings(log)
        result = {}
        for expr in name_expressions:
            lowered = nvrtc.getLoweredName(prog, expr)
            if lowered not in parsed:
                raise CompileError(source, [expr], opts, f"no ptxas report for {lowered}\n{log}")
            r = parsed[lowered]
            result[expr] = Resources(
                name_expression=expr,
                arch=arch,
                registers=r["regs"],
                spill_store_bytes=r["spill_st"],
                spill_load_bytes=r["spill_ld"],
                stack_bytes=r["stack"],
                static_smem_bytes=r["smem"],
                performance_warnings=perf.get(lowered, ()),
            )
        return result
