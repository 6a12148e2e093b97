"""Tests and torch: importing torch takes seconds in each test process that does it.

- :func:`cuda_available`: whether CUDA is usable here, asking torch only where an NVIDIA driver
  is installed (the GPU tests skip elsewhere without any test process importing torch).
- :data:`IMPORTS_TORCH`: the mark of a test that imports torch (itself, or through FlashInfer,
  the tuner's child or vLLM's platform probe). ``scripts/test.sh --fast`` distributes by group
  (``--dist loadgroup``), so that these tests share one test process and the others never
  import torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

IMPORTS_TORCH = pytest.mark.xdist_group("torch")


def cuda_available() -> bool:
    """torch's ``torch.cuda.is_available()``, asked only where an NVIDIA driver is installed
    (``/proc/driver/nvidia`` or ``nvidia-smi``); ``False`` where torch is not installed."""
    if not Path("/proc/driver/nvidia").exists() and shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
