"""The device facts the kernel's plan reads, from the torch device in use or from a device profile.

A plan (run_kernel._cuda_plan) is a function of the shape and of these facts alone: the units that run CTAs,
the width of a warp (32 on NVIDIA, 64 on a wave64 device such as the MetaX C500 or AMD's CDNA GPUs), the shared
memory one unit holds (a CTA's tiles must fit it), the L2 size (carried for reports; no rule reads it yet), and
the launch features of the backend (programmatic dependent launch: CUDA from compute capability 9). Given a
profile (kopt's hardware.yaml entry: name, vendor, arch, units, warp_size, smem_per_unit_bytes, l2_bytes), the
plan of a device that is not here is resolved on any machine, the one it would run there.

Only the standard library at module level; torch is imported by from_torch.
"""
from typing import NamedTuple


class Device(NamedTuple):
    """What the plan knows about a device."""

    name: str
    #: "cuda" (NVIDIA, nvcc), "maca" (MetaX, TileLang's MACA fork and mxcc), "hip" (AMD ROCm)
    backend: str
    #: the compile target's arch: sm_90a, xcore1000, gfx942
    arch: str
    units: int
    warp_size: int
    #: shared memory of one unit, bytes: a CTA's tiles must fit in it
    smem_per_unit: int
    #: L2 bytes, 0 when unknown
    l2_bytes: int
    #: programmatic dependent launch (griddepcontrol): CUDA from compute capability 9 (Hopper) on
    dependent_launch: bool

    @property
    def nvcc(self) -> bool:
        """Built by nvcc with TileLang's CUDA templates: the switches that name them (red_once's prelude, nvcc's
        fast math) apply only here."""
        return self.backend == "cuda"


_VENDOR_BACKEND = {"nvidia": "cuda", "metax": "maca", "amd": "hip"}
_FROM_TORCH: dict = {}


def _cuda_arch(arch: str) -> str:
    """sm_90 -> sm_90a (TileLang's arch for Hopper's own instructions); other archs as they are."""
    if arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 90:
        return arch + "a"
    return arch


def from_profile(profile: dict) -> Device:
    """The Device of a profile (a hardware.yaml entry as a dict: name, vendor, arch, units, warp_size,
    smem_per_unit_bytes, l2_bytes). A missing unit count, warp size or shared-memory size is an error: a plan
    resolved from a guess would be a plan of no device."""
    missing = [k for k in ("units", "warp_size", "smem_per_unit_bytes") if not profile.get(k)]
    backend = _VENDOR_BACKEND.get(str(profile.get("vendor", "")).lower())
    if missing or backend is None:
        why = f"no {', '.join(missing)}" if missing else f"vendor {profile.get('vendor')!r} is not a GPU vendor"
        raise ValueError(f"device profile {profile.get('name')!r} cannot plan the kernel: {why}")
    arch = str(profile.get("arch") or "")
    digits = arch[3:].rstrip("a")
    major = int(digits) // 10 if backend == "cuda" and arch.startswith("sm_") and digits.isdigit() else 0
    return Device(name=str(profile["name"]), backend=backend, arch=_cuda_arch(arch) if backend == "cuda" else arch,
                  units=int(profile["units"]), warp_size=int(profile["warp_size"]),
                  smem_per_unit=int(profile["smem_per_unit_bytes"]), l2_bytes=int(profile.get("l2_bytes") or 0),
                  dependent_launch=backend == "cuda" and major >= 9)


def from_torch(device) -> Device:
    """The Device of a torch GPU device (CUDA, or mcPytorch / ROCm torch, which keep the torch.cuda API),
    read from the driver once per device index."""
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    dev = _FROM_TORCH.get(idx)
    if dev is None:
        props = torch.cuda.get_device_properties(idx)
        backend = "maca" if getattr(torch.version, "maca", None) else "hip" if torch.version.hip else "cuda"
        major, minor = torch.cuda.get_device_capability(idx)
        if backend == "cuda":
            arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
        else:
            arch = str(getattr(props, "gcnArchName", "") or "").split(":")[0] or backend
        dev = Device(name=props.name, backend=backend, arch=arch, units=props.multi_processor_count,
                     warp_size=int(getattr(props, "warp_size", 0) or 32),
                     smem_per_unit=int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0),
                     l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
                     dependent_launch=backend == "cuda" and major >= 9)
        _FROM_TORCH[idx] = dev
    return dev
