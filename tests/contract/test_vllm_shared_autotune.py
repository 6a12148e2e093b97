"""vLLM 0.33/0.34's FlashInfer sparse-MLA decode autotune on SM120, which reads the shared
``autotune_configs.json`` tunecache writes beside the per-rank files
(:func:`tunecache.engines.vllm.paths.shared_autotune_file_names`), against each release's own
code read from its wheel (nothing of it imported):

* ``flashinfer_sparse_mla_warmup._run_flashinfer_sparse_mla_decode_autotune`` runs only where
  ``current_platform.is_device_capability_family(120)``, and on vLLM's v1 path tunes with
  ``flashinfer_autotune(True, cache=str(cache_path))`` for ``cache_path =
  resolve_flashinfer_autotune_file(runner)``, whose name is ``autotune_configs.json`` in the
  directory of the per-rank files (``flashinfer_autotune_root() / flashinfer_autotune_cache_hash``);
* ``kernel_warmup`` runs that warmup before ``flashinfer_autotune``, which ends with
  ``tuner.save_configs`` of the rank's file: the run's file holds the shared file's entries.

Which releases: 0.33 and 0.34 (``TUNECACHE_VLLM_RELEASES`` narrows them; by default 0.34, which CI runs).
"""

from __future__ import annotations

import pytest

from tests.support.vllm_wheels import function_source, release_wheel, releases

SHARED_RELEASES = ["0.33.0", "0.34.0"]


def _shared_releases() -> list[str]:
    return [v for v in releases() if v in SHARED_RELEASES] or [SHARED_RELEASES[-1]]


@pytest.mark.parametrize("version", _shared_releases())
def test_the_sm120_leader_reads_autotune_configs_json_beside_the_rank_files(wheels, version):  # noqa: F811
    wheel = release_wheel(wheels, version)
    sparse = wheel.read("vllm/model_executor/warmup/flashinfer_sparse_mla_warmup.py")
    body = function_source(sparse, "_run_flashinfer_sparse_mla_decode_autotune")
    assert "current_platform.is_device_capability_family(120)" in body
    assert "cache_path = resolve_flashinfer_autotune_file(runner)" in body
    assert "flashinfer_autotune(True, cache=str(cache_path))" in body
    cache = wheel.read("vllm/model_executor/warmup/flashinfer_autotune_cache.py")
    resolve = function_source(cache, "resolve_flashinfer_autotune_file")
    assert "flashinfer_autotune_root() / flashinfer_autotune_cache_hash(runner)" in resolve
    assert 'return output_dir / "autotune_configs.json"' in resolve
    assert "return path.with_name(" in function_source(cache, "resolve_rank_flashinfer_autotune_file")  # the same directory


@pytest.mark.parametrize("version", _shared_releases())
def test_kernel_warmup_tunes_sparse_mla_decode_before_the_rank_file_is_saved(wheels, version):  # noqa: F811
    source = release_wheel(wheels, version).read("vllm/model_executor/warmup/kernel_warmup.py")
    warmup = function_source(source, "kernel_warmup")
    assert warmup.index("flashinfer_sparse_mla_decode_autotune_warmup(worker)") < warmup.index("flashinfer_autotune(")
    autotune = function_source(source, "flashinfer_autotune")
    assert "cache_path = resolve_rank_flashinfer_autotune_file(runner)" in autotune
    # save_configs writes what the process's AutoTuner holds, loaded entries included (FlashInfer's
    # autotuner.py: "those entries are included in the output as well")
    assert "tuner.save_configs(str(cache_path))" in autotune
