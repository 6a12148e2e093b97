"""The tuner's vLLM process fills vLLM's model-inspection cache with every registered model where
the release can (0.34's ``ModelRegistry.fill_model_info_cache``; checked against the wheel by
tests/contract/test_vllm_aot.py), so the harvested ``vllm_modelinfos`` covers any architecture."""

from __future__ import annotations

import sys
import types

from tunecache.service.tuner.vllm_warmup import fill_model_info_cache


def registry_module(monkeypatch, registry) -> None:
    """A stand-in ``vllm.model_executor.models.registry`` at the edge, holding ``registry``."""
    module = types.ModuleType("vllm.model_executor.models.registry")
    module.ModelRegistry = registry
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.models"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)


def test_a_release_with_it_fills_every_models_inspection(monkeypatch, tmp_path):
    class Registry:  # 0.34's _ModelRegistry: fill_model_info_cache writes under VLLM_CACHE_ROOT/modelinfos
        def fill_model_info_cache(self):
            (tmp_path / "modelinfos").mkdir()
            for name in ("vllm-model_executor-models-llama-LlamaForCausalLM.json",
                         "vllm-model_executor-models-qwen3-Qwen3ForCausalLM.json"):
                (tmp_path / "modelinfos" / name).write_text("{}")

    registry_module(monkeypatch, Registry())
    assert fill_model_info_cache() is True
    assert len(list((tmp_path / "modelinfos").iterdir())) == 2


def test_a_release_without_it_leaves_the_boots_own_inspection(monkeypatch):
    registry_module(monkeypatch, object())  # 0.33's registry has no fill_model_info_cache
    assert fill_model_info_cache() is False
