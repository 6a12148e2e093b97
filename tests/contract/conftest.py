"""What every contract test module shares: the directory of vLLM wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.vllm_wheels import wheels_dir


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The directory the vLLM wheels are kept in (:func:`tests.support.vllm_wheels.wheels_dir`;
    :func:`~tests.support.vllm_wheels.release_wheel` makes it when it downloads one)."""
    return wheels_dir()
