"""The vLLM plugin's entry point (the plugin in worker processes is tests/e2e/test_vllm_plugin.py)."""

from __future__ import annotations

from importlib.metadata import entry_points


def test_entry_point_is_the_boot_pipelines_register():
    from tunecache.client.boot.hooks import register

    [plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tunecache"]
    assert plugin.load() is register
