"""The arch of a GPU by its name, where the name says it: what a record's ``key.arch`` must be
for the GPU its FlashInfer file was tuned on (``_metadata.gpu``), and the arch a pod without
a CUDA device takes (:mod:`tunecache.formats.arch`)."""

from __future__ import annotations

#: GPU name -> arch. The names are what ``torch.cuda.get_device_name()`` returns (FlashInfer
#: records it as ``_metadata.gpu``); the longest matching prefix wins. On a GPU the arch
#: comes from ``torch.cuda.get_device_capability`` instead
#: (:func:`tunecache.formats.arch.arch_from_capability`).
KNOWN_GPU_ARCHES: dict[str, str] = {
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


def arch_for_gpu_name(gpu_name: str) -> str | None:
    """The arch of a known GPU name (longest-prefix match), or ``None`` if unknown."""
    matches = [p for p in KNOWN_GPU_ARCHES if gpu_name.startswith(p)]
    return KNOWN_GPU_ARCHES[max(matches, key=len)] if matches else None


def arch_mismatch(gpu: str, arch: str) -> str | None:
    """Why a key's ``arch`` cannot be that of a file tuned on ``gpu`` (its ``_metadata.gpu``),
    or ``None``: it is, or the GPU's name does not say its arch (an unknown GPU)."""
    known = arch_for_gpu_name(gpu)
    if known is None or known == arch:
        return None
    return (f"key.arch {arch!r} is not the arch of the GPU the file was tuned on (_metadata.gpu {gpu!r} is {known}); "
            f"pods on that GPU look up {known}, so no pod would ever find it")
