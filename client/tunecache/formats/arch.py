"""GPU arch names as tunecache keys them (``"sm90"``): from a CUDA capability, or from a
GPU's name where no CUDA device can be asked."""

from __future__ import annotations

from tunecache.contract.gpu_arch import arch_for_gpu_name

__all__ = ["arch_for_gpu_name", "arch_from_capability"]

#: The GPU name -> arch table (used only where no CUDA device can be queried: ``tunecache
#: push`` of a file on a laptop) is the contract's, which the service checks records against.


def arch_from_capability(major: int, minor: int) -> str:
    """``(9, 0)`` -> ``"sm90"``, as vLLM's ``DeviceCapability.to_int`` names it."""
    return f"sm{major}{minor}"
