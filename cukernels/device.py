"""What the GPU allows: limits read from the live device (CuPy attributes + NVML) or from a profile.

A ``DeviceSpec`` is the one object the planner, the compile path and the timer consult. On a live GPU the
limits come from the driver (``cudaDeviceGetAttribute``) and the datasheet peaks from the profile that NVML's
device name matches; with no GPU a profile stands in, so plans and offline compiles can be checked anywhere.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from importlib import resources
from types import MappingProxyType
from typing import Any, Mapping

_LIMIT_KEYS = (
    "sm_count",
    "smem_per_block_optin",
    "smem_per_sm",
    "smem_per_block",
    "l2_bytes",
    "regs_per_sm",
    "regs_per_block",
    "max_threads_per_block",
    "max_threads_per_sm",
)
_PEAK_KEYS = ("bf16_tflops", "fp16_tflops", "fp32_tflops", "mem_bandwidth_gbs")

# CuPy device attribute -> DeviceSpec field
_ATTRIBUTES = {
    "MultiProcessorCount": "sm_count",
    "MaxSharedMemoryPerBlockOptin": "smem_per_block_optin",
    "MaxSharedMemoryPerMultiprocessor": "smem_per_sm",
    "MaxSharedMemoryPerBlock": "smem_per_block",
    "L2CacheSize": "l2_bytes",
    "MaxRegistersPerMultiprocessor": "regs_per_sm",
    "MaxRegistersPerBlock": "regs_per_block",
    "MaxThreadsPerBlock": "max_threads_per_block",
    "MaxThreadsPerMultiProcessor": "max_threads_per_sm",
}


class NoGPUError(RuntimeError):
    """CuPy sees no usable CUDA device."""


class UnknownProfileError(ValueError):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class Peaks:
    """Dense datasheet peaks (0 where the part has no such unit)."""

    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    mem_bandwidth_gbs: float

    def tflops(self, dtype_name: str) -> float:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[dtype_name]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    name: str
    key: str | None  # profile key, None when a live GPU matched no profile
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block_optin: int
    smem_per_sm: int
    smem_per_block: int
    l2_bytes: int
    regs_per_sm: int
    regs_per_block: int
    max_threads_per_block: int
    max_threads_per_sm: int
    peaks: Peaks | None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    expected_fallback: str | None = None
    source: str = "profile"  # "live" or "profile"

    @property
    def arch(self) -> str:
        return arch_for(self.compute_capability)

    def limits(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in _LIMIT_KEYS}


def arch_for(cc: tuple[int, int]) -> str:
    """NVRTC target: the arch-specific ``sm_90a`` on Hopper (wgmma, setmaxnreg), plain ``sm_XY`` elsewhere."""
    major, minor = cc
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


# ---------------------------------------------------------------- profiles


@functools.cache
def _profile_docs() -> dict[str, dict]:
    docs = {}
    for entry in resources.files("profiles").iterdir():
        if entry.name.endswith(".toml"):
            doc = tomllib.loads(entry.read_text())
            docs[doc["key"]] = doc
    return docs


def profile_names() -> list[str]:
    return sorted(_profile_docs())


def _spec_from_doc(doc: dict, **live) -> DeviceSpec:
    limits = {k: int(doc["limits"][k]) for k in _LIMIT_KEYS}
    limits.update({k: v for k, v in live.items() if k in _LIMIT_KEYS})
    return DeviceSpec(
        name=live.get("name", doc["name"]),
        key=doc["key"],
        compute_capability=tuple(live.get("compute_capability", doc["compute_capability"])),
        peaks=Peaks(**{k: float(doc["peaks"][k]) for k in _PEAK_KEYS}),
        overrides=MappingProxyType(dict(doc.get("overrides", {}))),
        sources=MappingProxyType(dict(doc.get("sources", {}))),
        expected_fallback=doc.get("expected_fallback"),
        source=live.get("source", "profile"),
        **limits,
    )


def _folded(name: str) -> str:
    return re.sub(r"[\s_-]", "", name.lower())


def profile_key(name: str) -> str:
    """The profile key ``name`` stands for: a key in any case and spelling of its separators ("H200",
    "h100-sxm"), a prefix of exactly one key ("h100" -> "h100_sxm"), or a GPU's NVML name ("NVIDIA H100 80GB
    HBM3"). A clear error lists the known keys, or the candidates of an ambiguous prefix ("a100")."""
    keys = profile_names()
    wanted = _folded(name)
    exact = [k for k in keys if _folded(k) == wanted]
    prefixed = [k for k in keys if wanted and _folded(k).startswith(wanted)]
    found = exact or prefixed or [k for k in (match_profile(name),) if k]
    if len(found) == 1:
        return found[0]
    if found:
        raise UnknownProfileError(f"profile {name!r} is ambiguous: it could be {', '.join(found)}")
    raise UnknownProfileError(f"unknown profile {name!r}; known profiles: {', '.join(keys)}")


def profile(name: str) -> DeviceSpec:
    """The spec of a named profile (``h200``, ``gb10``, ``H100``, ...: see ``profile_key``)."""
    return _spec_from_doc(_profile_docs()[profile_key(name)])


def all_profiles() -> list[DeviceSpec]:
    return [profile(n) for n in profile_names()]


def match_profile(device_name: str) -> str | None:
    """Profile key whose NVML name pattern occurs in ``device_name`` as whole words (case-insensitive, so "L4"
    does not match "L40S" nor "A10" match "A10G"); the longest matching pattern wins."""
    best, best_len = None, 0
    for key, doc in _profile_docs().items():
        for pattern in doc.get("nvml_patterns", []):
            if re.search(rf"(?<![\w-]){re.escape(pattern)}(?![\w-])", device_name, re.IGNORECASE) and len(pattern) > best_len:
                best, best_len = key, len(pattern)
    return best


# ---------------------------------------------------------------- the live GPU


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _cupy_device():
    if not gpu_available():
        raise NoGPUError(
            "no CUDA GPU is visible to CuPy; use a profile instead (e.g. `python -m cukernels --profile h200`)"
        )
    import cupy

    return cupy.cuda.Device()


@functools.cache
def _live_spec(device_id: int) -> DeviceSpec:
    import cupy

    dev = cupy.cuda.Device(device_id)
    attrs = dev.attributes
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    nvml_name = nvml_info(device_id).get("name", name)
    cc = (int(props["major"]), int(props["minor"]))
    live = {field: int(attrs[attr]) for attr, field in _ATTRIBUTES.items()}
    key = match_profile(nvml_name)
    if key is not None:
        return _spec_from_doc(
            _profile_docs()[key], name=nvml_name, compute_capability=cc, source="live", **live
        )
    return DeviceSpec(name=nvml_name, key=None, compute_capability=cc, peaks=None, source="live", **live)


def current() -> DeviceSpec:
    """The spec of CuPy's current device, limits queried live; peaks from the matched profile."""
    return _live_spec(_cupy_device().id)


# ---------------------------------------------------------------- NVML


@functools.cache
def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _nvml_handle(device_id: int):
    nv = _nvml()
    if nv is None:
        return None, None
    try:
        import cupy

        bus = cupy.cuda.Device(device_id).pci_bus_id
        return nv, nv.nvmlDeviceGetHandleByPciBusId(bus)
    except Exception:
        try:
            return nv, nv.nvmlDeviceGetHandleByIndex(device_id)
        except Exception:
            return nv, None


def _throttle_reasons(nv, handle) -> list[str]:
    get = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = get(handle)
    names = {
        "GpuIdle": "idle",
        "ApplicationsClocksSetting": "applications_clocks",
        "SwPowerCap": "sw_power_cap",
        "HwSlowdown": "hw_slowdown",
        "SyncBoost": "sync_boost",
        "SwThermalSlowdown": "sw_thermal",
        "HwThermalSlowdown": "hw_thermal",
        "HwPowerBrakeSlowdown": "hw_power_brake",
        "DisplayClockSetting": "display_clocks",
    }
    out = []
    for suffix, label in names.items():
        bit = getattr(nv, f"nvmlClocksThrottleReason{suffix}", None)
        if bit is None:
            bit = getattr(nv, f"nvmlClocksEventReason{suffix}", None)
        if bit is not None and mask & bit:
            out.append(label)
    return out


# reasons that mean the clock was pulled down under load (idle and app-clock settings do not)
SLOWDOWN_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


def nvml_info(device_id: int = 0) -> dict:
    """Static facts NVML knows: name, driver, max clocks, power limit. Empty when NVML is unavailable."""
    nv, h = _nvml_handle(device_id)
    if h is None:
        return {}
    info: dict[str, Any] = {}
    for key, call in (
        ("name", lambda: nv.nvmlDeviceGetName(h)),
        ("driver", lambda: nv.nvmlSystemGetDriverVersion()),
        ("cuda_driver_version", lambda: nv.nvmlSystemGetCudaDriverVersion()),
        ("sm_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        ("mem_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
        ("power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
    ):
        try:
            value = call()
            info[key] = value.decode() if isinstance(value, bytes) else value
        except Exception:
            pass
    return info


def nvml_energy_mj(device_id: int = 0) -> float | None:
    """The card's energy counter (mJ since the driver loaded; NVML, Volta and later), or None where NVML or the
    counter is not there."""
    nv, h = _nvml_handle(device_id)
    if h is None:
        return None
    try:
        return float(nv.nvmlDeviceGetTotalEnergyConsumption(h))
    except Exception:
        return None


def nvml_sample(device_id: int = 0) -> dict:
    """One reading of the changing state: SM/memory clocks, power, temperature, throttle reasons."""
    nv, h = _nvml_handle(device_id)
    if h is None:
        return {}
    sample: dict[str, Any] = {}
    for key, call in (
        ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("throttle_reasons", lambda: _throttle_reasons(nv, h)),
    ):
        try:
            sample[key] = call()
        except Exception:
            pass
    return sample
