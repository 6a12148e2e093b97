"""What every contract test module shares: the directory of vLLM wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.vllm_wheels import wheels_dir


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The directory the vLLM wheels are kept in (:func:`tests.support.vllm_wheels.wheels_dir`),
    made where it is missing."""
    directory = wheels_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return directory
