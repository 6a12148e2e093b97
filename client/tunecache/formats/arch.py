"""GPU arch names as tunecache keys them (``"sm90"``): from a CUDA capability, or from a
GPU's name where no CUDA device can be asked."""

from __future__ import annotations

#: Fallback GPU name -> arch table, used only where no CUDA device can be queried
#: (``tunecache push`` of a file on a laptop). On a GPU the arch comes from
#: ``torch.cuda.get_device_capability`` (see :func:`arch_from_capability`). The names are
#: what ``torch.cuda.get_device_name()`` returns; the longest matching prefix wins.
_KNOWN_GPU_ARCHES: dict[str, str] = {
    "NVIDIA A100": "sm80",
    "NVIDIA A10": "sm86",
    "NVIDIA L4": "sm89",
    "NVIDIA L40": "sm89",
    "NVIDIA H100": "sm90",
    "NVIDIA H200": "sm90",
    "NVIDIA H20": "sm90",
    "NVIDIA GH200": "sm90",
    "NVIDIA B200": "sm100",
    "NVIDIA GB200": "sm100",
    "NVIDIA B300": "sm103",
}


def arch_from_capability(major: int, minor: int) -> str:
    """``(9, 0)`` -> ``"sm90"``, as vLLM's ``DeviceCapability.to_int`` names it."""
    return f"sm{major}{minor}"


def arch_for_gpu_name(gpu_name: str) -> str | None:
    """The arch of a known GPU name (longest-prefix match), or ``None`` if unknown."""
    matches = [p for p in _KNOWN_GPU_ARCHES if gpu_name.startswith(p)]
    return _KNOWN_GPU_ARCHES[max(matches, key=len)] if matches else None
