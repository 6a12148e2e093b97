"""The vLLM plugin's entry point (the plugin in worker processes is tests/e2e/test_vllm_plugin.py)."""

from __future__ import annotations

from importlib.metadata import entry_points


def test_entry_point_is_registered():
    assert "tunecache" in {e.name for e in entry_points(group="vllm.general_plugins")}
