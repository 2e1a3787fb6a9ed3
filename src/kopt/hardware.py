"""Device profiles (data/hardware.yaml), device detection, the measured copy ceiling, flush size.

torch is imported lazily, inside the functions that touch a device.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kopt import paths

HARDWARE_YAML = Path(__file__).resolve().parent / "data" / "hardware.yaml"
SCHEMA_VERSION = 1
MiB = 1 << 20
#: Smallest cache flush: even a small-L2 part gets a buffer far beyond its caches (DESIGN.md).
MIN_FLUSH_BYTES = 256 * MiB
#: Size of the copy that measures the bandwidth ceiling: ~20x the largest L2 here, so caches
#: cannot serve it, and ~0.5 ms on an H200, well past launch overhead.
COPY_BYTES = 1 << 30


class DeviceProfile(BaseModel):
    """Static facts about one kind of device, from data/hardware.yaml."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """Short name used in DEVICE:, ledgers and cache files (e.g. H200)."""
    vendor: Literal["nvidia", "metax", "amd", "cpu"]
    arch: str = ""
    match: list[str] = Field(default_factory=list)
    """Case-insensitive regexes searched in the driver's device name."""
    unit_name: str = "SM"
    units: Optional[int] = Field(default=None, ge=1)
    warp_size: Optional[int] = Field(default=None, ge=1)
    l2_bytes: Optional[int] = Field(default=None, ge=0)
    smem_per_unit_bytes: Optional[int] = Field(default=None, ge=0)
    mem_bytes: Optional[int] = Field(default=None, ge=0)
    spec_bw_gbps: Optional[float] = Field(default=None, gt=0)
    """Datasheet memory bandwidth, 1e9 bytes/s."""
    spec_verified: bool = False
    """False where the spec figure was not checked against a vendor datasheet."""
    copy_gbps_seen: Optional[float] = Field(default=None, gt=0)
    """A copy ceiling measured once elsewhere: a lead, never used in place of a measurement."""
    notes: str = ""


class HardwareFile(BaseModel):
    """The whole hardware.yaml."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    devices: list[DeviceProfile]


class CopyCeiling(BaseModel):
    """Cached result of one copy-ceiling measurement (results/hardware-<device>.json)."""

    schema_version: int = SCHEMA_VERSION
    device: str
    raw_name: str = ""
    copy_gbps: float = Field(gt=0)
    """Bytes read + bytes written per second / 1e9, best of several copies."""
    copy_bytes: int = Field(ge=0)
    method: str = "d2d-copy-events-best"
    measured_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    torch: str = ""
    read_gbps: Optional[float] = Field(default=None, gt=0)
    """Streaming-read ceiling: bytes read per second / 1e9, best of several reads (kopt.roofline)."""
    read_bytes: int = Field(0, ge=0)
    read_method: str = ""
    floor_ms: Optional[float] = Field(default=None, gt=0)
    """Launch floor: cold device-only span of a minimal kernel (loads one tile, stores one row), ms."""
    floor_method: str = ""
    roofline_at: Optional[str] = None
    """When the read ceiling and the floor were measured."""
    commit: Optional[str] = None
    """The workspace commit the read ceiling and floor were measured at."""


@dataclass
class DeviceInfo:
    """What kopt knows about the device in use: profile facts overridden by the driver's answers."""

    name: str
    device: str
    raw_name: str
    unit_name: str
    units: Optional[int]
    warp_size: Optional[int]
    l2_bytes: Optional[int]
    spec_bw_gbps: Optional[float]
    profile: Optional[DeviceProfile]


@lru_cache(maxsize=4)
def load_profiles(path: Optional[Path] = None) -> tuple[DeviceProfile, ...]:
    """Load and validate hardware.yaml (the packaged one by default)."""
    data = yaml.safe_load((path or HARDWARE_YAML).read_text())
    return tuple(HardwareFile.model_validate(data).devices)


def profile(name: str) -> Optional[DeviceProfile]:
    """The profile with this short name, or None."""
    return next((p for p in load_profiles() if p.name == name), None)


def match_profile(raw_name: str) -> Optional[DeviceProfile]:
    """The first profile whose pattern matches a driver device name, or None."""
    for p in load_profiles():
        if any(re.search(rx, raw_name, re.IGNORECASE) for rx in p.match):
            return p
    return None


def device_name(raw_name: str) -> str:
    """Short device name: 'NVIDIA H200' -> 'H200'; unknown devices get a cleaned-up token."""
    p = match_profile(raw_name)
    if p is not None:
        return p.name
    s = re.sub(r"^(NVIDIA|MetaX|AMD)\s+", "", raw_name.strip(), flags=re.IGNORECASE)
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-")
    return s or "unknown"


def is_cpu(device: str) -> bool:
    """Whether a device string names the host CPU."""
    return device == "cpu" or device.startswith("cpu:")


def detect(device: str) -> DeviceInfo:
    """Describe a device ('cpu', 'cuda', 'cuda:1'): name from the driver, units and L2 read when possible."""
    if is_cpu(device):
        p = profile("cpu")
        return DeviceInfo(
            name="cpu", device="cpu", raw_name="cpu", unit_name="core", units=os.cpu_count(),
            warp_size=1, l2_bytes=p.l2_bytes if p else None, spec_bw_gbps=None, profile=p,
        )
    return _detect_gpu(device)


@lru_cache(maxsize=8)
def _detect_gpu(device: str) -> DeviceInfo:
    import torch

    dev = torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    raw = torch.cuda.get_device_name(idx)
    props = torch.cuda.get_device_properties(idx)
    p = match_profile(raw)
    units = getattr(props, "multi_processor_count", None)
    l2 = getattr(props, "L2_cache_size", None) or None      # some backends report 0: unknown
    warp = getattr(props, "warp_size", None)
    return DeviceInfo(
        name=device_name(raw), device=f"{dev.type}:{idx}", raw_name=raw,
        unit_name=p.unit_name if p else "SM",
        units=units or (p.units if p else None),
        warp_size=warp or (p.warp_size if p else None),
        l2_bytes=l2 or (p.l2_bytes if p else None),
        spec_bw_gbps=p.spec_bw_gbps if p else None,
        profile=p,
    )


def flush_bytes(info: DeviceInfo) -> int:
    """Bytes to zero before a cold call: max(2 x L2, 256 MiB), so no input survives in L2."""
    return max(2 * (info.l2_bytes or 0), MIN_FLUSH_BYTES)


def cache_file(name: str, cache_dir: Optional[Path] = None) -> Path:
    """Where a device's copy ceiling is cached: <workspace>/results/hardware-<name>.json by default."""
    d = Path(cache_dir) if cache_dir is not None else paths.workspace() / "results"
    return d / f"hardware-{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}.json"


def read_cached(name: str, cache_dir: Optional[Path] = None) -> Optional[CopyCeiling]:
    """The cached copy ceiling of a device, or None when absent or unreadable."""
    f = cache_file(name, cache_dir)
    try:
        return CopyCeiling.model_validate_json(f.read_text())
    except (OSError, ValueError):
        return None


def write_cached(entry: CopyCeiling, cache_dir: Optional[Path] = None) -> Path:
    """Write a copy-ceiling entry atomically (temp file in the same folder, then rename)."""
    from kopt import atomic

    return atomic.write_text(cache_file(entry.device, cache_dir), json.dumps(entry.model_dump(), indent=2) + "\n")


def events_best_ms(fn: Callable[[], object], reps: int, device: Optional[str] = None, warm: int = 1) -> float:
    """The best of `reps` CUDA-event timings of fn after `warm` untimed calls (clocks up, code loaded). Best,
    not median: a ceiling is what the memory system can do, not what it usually does."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize(device)
    best = float("inf")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        a.record()
        fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b))
    return best


def measure_copy_gbps(device: str, nbytes: int = COPY_BYTES, reps: int = 10) -> float:
    """Best-of-`reps` device-to-device copy bandwidth, counting bytes read + written, CUDA events."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    best_ms = events_best_ms(lambda: dst.copy_(src), reps, device, warm=3)
    return 2 * nbytes / (best_ms / 1e3) / 1e9


def copy_ceiling_gbps(
    device: str,
    cache_dir: Optional[Path] = None,
    *,
    refresh: bool = False,
    measure: Optional[Callable[[str], float]] = None,
) -> Optional[float]:
    """Measured copy ceiling (GB/s) of a device, measured once and cached per device name; None on CPU."""
    if is_cpu(device):
        return None
    info = detect(device)
    if not refresh:
        hit = read_cached(info.name, cache_dir)
        if hit is not None:
            return hit.copy_gbps
    gbps = (measure or measure_copy_gbps)(device)
    try:
        import torch

        tv = torch.__version__
    except ImportError:                       # only possible with an injected `measure`
        tv = ""
    write_cached(CopyCeiling(device=info.name, raw_name=info.raw_name, copy_gbps=gbps,
                             copy_bytes=COPY_BYTES, torch=tv), cache_dir)
    return gbps


# ---------------------------------------------------------------- which device a run uses

def check_device(device: str) -> None:
    """A usage error unless device is auto, cuda or cpu."""
    from kopt.errors import UsageError

    if device not in ("auto", "cuda", "cpu"):
        raise UsageError(f"unknown device {device!r}; use auto, cuda or cpu")


def resolve_device(device: str) -> str:
    """auto -> cuda when a GPU is visible, else cpu; cuda without a GPU is a usage error."""
    from kopt.errors import UsageError

    check_device(device)
    if device == "cpu":
        return "cpu"
    if _driver_gpu_count() > 0 and _torch_cuda_build() is True:  # no torch import on the way to the child
        return "cuda"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise UsageError("--device cuda but no CUDA device is visible")
    return "cpu"


def cuda_missing(tool: str) -> Optional[str]:
    """None when a run here gets a CUDA device (resolve_device("auto") == "cuda"), else the one line a GPU-only
    `tool` prints before it exits 2 on a host without one."""
    return None if resolve_device("auto") == "cuda" else f"{tool} needs a CUDA device; none is visible"


def exit_unless_cuda(tool: str) -> None:
    """For a GPU-only script: on a host without a CUDA device, its one line (cuda_missing) on stderr and exit 2."""
    if why := cuda_missing(tool):
        print(f"error: {why}", file=sys.stderr)
        raise SystemExit(2)


def driver():
    """The CUDA driver library through ctypes, initialised (cuInit), without importing torch; None where
    there is no NVIDIA driver (CPU hosts, other vendors' runtimes) or it does not initialise."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        return cuda if cuda.cuInit(0) == 0 else None
    except (OSError, AttributeError):
        return None


def device_label(device: str) -> Optional[str]:
    """The short name (device_name) the rows of `device` carry in ledgers ('cpu', 'H200'), read through the
    driver without importing torch; None where it cannot be read."""
    import ctypes

    if is_cpu(device):
        return "cpu"
    cuda = driver()
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    handle, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
    if cuda is None or cuda.cuDeviceGet(ctypes.byref(handle), index) != 0 \
            or cuda.cuDeviceGetName(name, len(name), handle) != 0:
        return None
    return device_name(name.value.decode(errors="replace"))


def _driver_gpu_count() -> int:
    """CUDA devices the driver sees (honours CUDA_VISIBLE_DEVICES), through libcuda alone; 0 when there
    is no NVIDIA driver, so the caller falls back to torch. Importing torch costs seconds on some hosts;
    the evaluation child pays it anyway."""
    import ctypes

    cuda, n = driver(), ctypes.c_int(0)
    if cuda is None or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


def _torch_cuda_build() -> Optional[bool]:
    """Whether the installed torch is a CUDA build, read from torch/version.py without importing
    torch; None when that file cannot be read (the caller then imports torch)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except (AttributeError, TypeError, IndexError, OSError, ValueError):
        return None
    return _version_says_cuda(text)


def _version_says_cuda(text: str) -> Optional[bool]:
    """torch/version.py's `cuda` entry: a version string (True), None (False), absent (None)."""
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(\S+)", text, re.M)
    return None if m is None else m.group(1) != "None"
