"""vLLM's adaptor, as the registry gives it: the releases it knows and where they read tactics."""

from __future__ import annotations

import pytest

from tunecache.engines import ENGINES, engine_for
from tunecache.engines.base import EngineAdaptor
from tunecache.engines.vllm.releases import RELEASES


def test_the_registry_gives_each_engine_by_the_name_it_has():
    assert all(isinstance(adaptor, EngineAdaptor) and adaptor.name == name for name, adaptor in ENGINES.items())
    with pytest.raises(KeyError, match="'sglang' is not one tunecache knows \\(vllm\\)"):
        engine_for("sglang")


def test_vllms_releases_are_the_tables_rows():
    vllm = engine_for("vllm")
    assert vllm.release_of("0.27.1+cu130") is RELEASES[(0, 27)] and vllm.release_of("0.24.0") is None
    assert vllm.release_of("") is None and vllm.known_range() == "0.25-0.34"
    assert vllm.autotune_layout(vllm.release_of("0.33.0rc1")) == "root"

