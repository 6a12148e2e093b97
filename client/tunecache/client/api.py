"""Python API for pods: fetch the matching tuning, install it, and load it into FlashInfer.

    from tunecache.client.api import install_tuning
    installed = install_tuning("http://tunecache:8321", "Qwen/Qwen3-30B-A3B", 8192, "/var/cache/tunecache")
    # FlashInfer now has the tactics (AutoTuner.load_configs) and, with jit=True, the JIT modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunecache.client.environment import detect_environment, pod_key
from tunecache.store.http import TunecacheClient
from tunecache.client.install import InstallResult, default_file_name, fetch_and_install
from tunecache.client.layouts import FlashInferFile
from tunecache.client.pipeline import InstallTarget
from tunecache.signing import load_trusted_keys
from tunecache.client.settings import load_client_settings
from tunecache.contract import ArtifactKind, ReportSource, expert_parallel_size


@dataclass(frozen=True)
class LoadedTuning:
    installed: InstallResult
    loaded: bool
    """What ``AutoTuner.get().load_configs`` returned: False means FlashInfer rejected the
    file's environment (it then tunes or uses its heuristics as without tunecache)."""


def install_tuning(
    server: str | None,
    model: str,
    max_num_batched_tokens: int,
    dest_dir: str | Path,
    *,
    tensor_parallel_size: int = 1,
    dtype: str = "auto",
    quantization: str = "auto",
    data_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
    jit: bool = True,
    load: bool = True,
) -> LoadedTuning:
    """Install the tuning for this process's GPU and FlashInfer environment, then load it.

    ``server`` is the tunecache URL (``None``: ``TUNECACHE_URL``); timeouts, attempts and
    the token come from :class:`tunecache.client.settings.ClientSettings`. The key's
    parallel sizes are the deployment's: ``data_parallel_size`` (vLLM's
    ``--data-parallel-size``) and ``enable_expert_parallel`` (vLLM's
    ``--enable-expert-parallel``: :func:`tunecache.contract.expert_parallel_size`).

    The environment comes from ``flashinfer.autotuner._collect_metadata`` and the GPU from
    torch (``detect_arch``), so FlashInfer and a CUDA device must be present. The
    FlashInfer cache file goes into ``dest_dir``; with ``jit`` the run's JIT modules go
    into this process's FlashInfer workspace; with ``load`` the file is loaded with
    ``flashinfer.autotuner.AutoTuner.get().load_configs(path)`` (FlashInfer 0.7), so calls
    made afterwards in this process find their tactics without an ``autotune`` context.

    Raises:
        ValueError: no server URL, or a ``TUNECACHE_*`` setting that is not valid (named).
        EnvironmentUnavailable (``tunecache.client.environment``): FlashInfer not importable.
        NoCompatibleTuning, ServerUnreachable, ServerError, ArtifactCorrupt
        (``tunecache.store.http``), BadJitArtifact (``tunecache.formats.jit_module``).
    """
    settings = load_client_settings()
    environment = detect_environment()
    key = pod_key(
        environment.gpu, model, max_num_batched_tokens,
        dtype=dtype, quantization=quantization, tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        expert_parallel_size=expert_parallel_size(tensor_parallel_size, data_parallel_size, enable_expert_parallel),
    )
    with TunecacheClient.from_settings(settings, server) as client:
        trusted = load_trusted_keys(settings.trusted_keys) if settings.trusted_keys else None
        target = InstallTarget.of((ArtifactKind.FLASHINFER_JIT_MODULE,) if jit else (),
                                  FlashInferFile(Path(dest_dir), default_file_name(key)))
        installed = fetch_and_install(client, key, environment, target, trusted, ReportSource.API)
    loaded = False
    if load:
        from flashinfer.autotuner import AutoTuner

        loaded = AutoTuner.get().load_configs(str(installed.path))
    return LoadedTuning(installed=installed, loaded=loaded)
