"""vLLM 0.33/0.34's compile cache: the mega AOT artifact, one per rank, and what a pod compares
before it takes one.

Since torch 2.12 (vLLM 0.33 and 0.34 pin torch 2.14) vLLM saves one artifact per rank,
``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<sha256>/rank_{rank}_{dp}/model``,
beside the hash directory's ``inductor_cache/`` (``vllm/compilation/decorators.py``:
``__call__`` names it, ``save_aot_compiled_function`` writes it), and a warm boot loads only
those (``_try_load_aot_compiled_fn(model, path)``): no backbone directory, no traced-file
names. The pod never computes ``<sha256>``: the plugin takes the path vLLM is about to load
(:mod:`tunecache.client.boot.aot`), so where the pod's HOME, user, cache directories, package
prefix, ``CUDA_HOME`` or side-channel ports are no longer decide anything. What still decides
whether the artifact loads is recorded by the tuner (:class:`AotArtifacts`, inside the signed
compile-cache tarball as :data:`AOT_RECORD_FILE`) and compared here before anything is placed:

* **the device index** each rank compiled on: Inductor bakes ``get_raw_stream(<index>)`` into
  the artifact, which fails with "CUDA driver error: invalid argument" on another index, unless
  vLLM compiled with ``VLLM_COMPILE_ON_ONE_RANK=1`` (then one artifact is valid on every index,
  and the tuner stores one, checked byte-identical across its ranks) (:func:`device_refusal`);
* **the engine variant**: vLLM 0.34's ``VllmConfig.compile_factors()``, field by field, but
  where the model lives (:data:`PLACEMENT_CONFIG_FACTORS`) (:func:`factor_differences`);
* **torch's load gate** (``torch._dynamo.package.SystemInfo.check_compatibility``: Python,
  torch, CUDA toolkit, Triton, GPU name), after which vLLM recompiles silently
  (:func:`system_differences`);
* **placement inputs** vLLM hashes into ``<sha256>`` (:data:`PLACEMENT_ENV_FACTORS`): they
  change the name only, which the pod takes from vLLM, so a difference is named in the install
  line and installs all the same (:func:`placement_differences`).

Pure: the standard library and pydantic.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: The name of the tuner's :class:`AotArtifacts` inside a ``vllm_compile_cache`` tarball.
AOT_RECORD_FILE = "tunecache-aot-artifacts.json"
#: The directory of the AOT artifacts under ``torch_compile_cache/``.
AOT_DIR = "torch_aot_compile"
#: The file vLLM saves each rank's artifact as (``decorators.py``: ``os.path.join(cache_dir, "model")``).
MODEL_FILE = "model"
#: Inductor's cache beside the ranks (``decorators.py``: ``TORCHINDUCTOR_CACHE_DIR``).
INDUCTOR_DIR = "inductor_cache"
#: The variable that makes one artifact valid on every device index (vLLM 0.34, itself a compile factor).
COMPILE_ON_ONE_RANK = "VLLM_COMPILE_ON_ONE_RANK"

#: ``rank_{rank}_{dp}``, as vLLM names a rank's directory.
RANK_DIR = re.compile(r"^rank_(\d+)_(\d+)$")

#: vLLM environment factors (``vllm.envs.compile_factors()``) that are where something lives on
#: the pod or how it reaches its peers, not how the model compiles: vLLM 0.34 hashes them into
#: the AOT name. The pod takes the name from vLLM, so they only change which directory the
#: artifact goes into; named in the install line (and by doctor) when they differ. Every variable
#: of 0.33/0.34's ``vllm/envs.py::environment_variables`` that ``compile_factors()`` hashes and
#: whose name says it is a host, port, address or library path is here
#: (``tests/contract/test_vllm_aot.py``).
PLACEMENT_ENV_FACTORS: dict[str, str] = {
    "CUDA_HOME": "where the CUDA toolkit is installed",
    "VLLM_NCCL_SO_PATH": "where NCCL's library is",
    "VLLM_CUDART_SO_PATH": "where the CUDA runtime library is",
    "VLLM_HOST_IP": "the pod's own address",
    "VLLM_PORT": "the pod's own port",
    "VLLM_P2P_SIDE_CHANNEL_HOST": "a side-channel host of the KV transfer",
    "VLLM_P2P_SIDE_CHANNEL_PORT": "a side-channel port of the KV transfer",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "a side-channel host of NIXL",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "a side-channel port of NIXL",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT": "Mooncake's bootstrap port",
    "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "Mooncake's local host name",
    "VLLM_EC_SIDE_CHANNEL_HOST": "a side-channel host of the encoder-cache transfer",
    "VLLM_EC_SIDE_CHANNEL_PORT": "a side-channel port of the encoder-cache transfer",
    "VLLM_LOOPBACK_IP": "the pod's loopback address",
    "VLLM_CONFIG_ROOT": "where vLLM reads its own config files",
    "VLLM_CACHE_ROOT": "where vLLM caches",
    "VLLM_XLA_CACHE_PATH": "the TPU (XLA) compile cache",
}

#: Fields of ``VllmConfig.compile_factors()`` (``<sub-config>.<field>``) that are where the model's
#: files live (a path or a hub name), not the graph: the way tunecache treats ``ModelConfig.model``
#: for the engine variant already. Named when they differ; never a reason not to install.
PLACEMENT_CONFIG_FACTORS: dict[str, str] = {
    "model.model": "where the model's weights are read from",
    "model.tokenizer": "where the tokenizer is read from",
    "model.model_weights": "where the model's weights are read from",
    "model.hf_config_path": "where the model's config is read from",
    "load.download_dir": "where weights are downloaded to",
}

#: torch's ``SystemInfo`` fields, as its ``check_compatibility`` compares them, and their names in a line.
SYSTEM_FIELDS: dict[str, str] = {
    "python_version": "Python", "torch_version": "torch", "toolkit_version": "CUDA toolkit",
    "triton_version": "Triton", "gpu_name": "GPU",
}


class AotRank(BaseModel):
    """One rank's artifact as the tuner's vLLM saved it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    rank: int = Field(ge=0, le=4095, description="the rank (ParallelConfig.rank)")
    dp_rank: int = Field(ge=0, le=4095, description="the data-parallel index of the rank directory")
    device_index: int | None = Field(default=None, ge=0, le=4095,
                                     description="the CUDA device index it was compiled on (torch.cuda.current_device())")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the artifact's bytes")


class AotArtifacts(BaseModel):
    """What the tuner harvested of vLLM 0.33/0.34's AOT compile cache, and what it was made under."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vllm_version: str = Field(max_length=64)
    aot_dir: str = Field(pattern=r"^[0-9a-f]{64}$", description="the tuner's torch_aot_compile/<sha256> name")
    ranks: list[AotRank] = Field(max_length=4096, description="each rank's artifact (one when one_for_all_ranks)")
    one_for_all_ranks: bool = Field(
        default=False, description="compiled with VLLM_COMPILE_ON_ONE_RANK=1 and every rank's artifact byte-identical: "
                                   "the one artifact (rank_0_0's) serves every rank and device index")
    compile_factors: dict[str, Any] = Field(
        default_factory=dict, description="vLLM 0.34's VllmConfig.compile_factors(), flattened to <config>.<field> "
                                          "(long values as their sha256); {} where the release has none")
    env: dict[str, Any] = Field(default_factory=dict, description="vllm.envs.compile_factors() on the tuner")
    system: dict[str, Any] = Field(default_factory=dict,
                                   description="torch's SystemInfo.current() on the tuner's worker (SYSTEM_FIELDS)")
    variant_factors: dict[str, Any] | None = Field(
        default=None, description="the engine variant the artifacts are for (tunecache.engines.vllm.compile_cache."
                                  "VariantFactors, as the tuner's compile facts computed it; None: a tuner before "
                                  "variants of this release)")

    def rank_member(self, rank: int, dp_rank: int) -> str | None:
        """The path inside the tarball of the artifact for ``rank``/``dp_rank``; ``None``: none recorded."""
        if self.one_for_all_ranks and self.ranks:
            first = self.ranks[0]
            return f"{AOT_DIR}/{self.aot_dir}/rank_{first.rank}_{first.dp_rank}/{MODEL_FILE}"
        for entry in self.ranks:
            if (entry.rank, entry.dp_rank) == (rank, dp_rank):
                return f"{AOT_DIR}/{self.aot_dir}/rank_{rank}_{dp_rank}/{MODEL_FILE}"
        return None

    def recorded(self, rank: int, dp_rank: int) -> AotRank | None:
        if self.one_for_all_ranks:
            return self.ranks[0] if self.ranks else None
        return next((e for e in self.ranks if (e.rank, e.dp_rank) == (rank, dp_rank)), None)


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def flatten_factors(factors: dict[str, Any]) -> dict[str, Any]:
    """``VllmConfig.compile_factors()`` (``{"model": {...}, "cache": {...}, ...}``) as
    ``{"model.max_model_len": ...}``, each value as JSON data; long values (over 120 characters
    of JSON) as ``{"sha256": <16 hex>}``: enough to name a field that differs."""
    import hashlib

    flat: dict[str, Any] = {}
    for group, fields in sorted(factors.items()):
        items = fields.items() if isinstance(fields, dict) else [("", fields)]
        for name, value in items:
            text = json.dumps(value, sort_keys=True, default=str)
            flat[f"{group}.{name}" if name else group] = (
                json.loads(text) if len(text) <= 120 else {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16]})
    return flat


def config_factor_groups(factors: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """vLLM 0.34's ``VllmConfig.compile_factors()`` (``vllm/config/vllm.py``: one entry per
    sub-config, each its ``get_compile_factors`` fields) as an engine variant counts it:
    ``(hashes, fields)``, per sub-config the sha256 of its fields' JSON (keys sorted, every value
    whole) and its fields (long values as their sha256, :func:`flatten_factors`), where the model
    lives left out (:data:`PLACEMENT_CONFIG_FACTORS` but ``model.model``, which the caller sets to
    the served model's name). The release's version, not a sub-config, is the variant's own field."""
    import hashlib

    hashes: dict[str, str] = {}
    fields: dict[str, dict[str, Any]] = {}
    for group, values in sorted(factors.items()):
        if not isinstance(values, dict):
            continue
        kept = {name: value for name, value in values.items()
                if f"{group}.{name}" == "model.model" or f"{group}.{name}" not in PLACEMENT_CONFIG_FACTORS}
        text = json.dumps(kept, sort_keys=True, default=str)
        hashes[group] = hashlib.sha256(text.encode()).hexdigest()
        fields[group] = {name.split(".", 1)[1]: value for name, value in flatten_factors({group: kept}).items()}
    return hashes, fields


def rank_facts(config: Any, env_factors: Any, device_index: int | None, system: Any) -> dict[str, Any]:
    """One rank's compile facts as JSON data, read alike by the tuner (recorded with the run:
    :func:`tunecache.service.tuner.aot_harvest.aot_rank_facts`) and the pod (compared with them:
    :func:`tunecache.client.boot.aot.pod_aot_facts`): from the compiled model's or worker's
    ``vllm_config``, its ``parallel_config.rank`` and data-parallel index (``data_parallel_index``,
    else ``data_parallel_rank``, as ``decorators.py`` names the rank directory) and, where the
    release has it (0.34), ``VllmConfig.compile_factors()`` flattened (:func:`flatten_factors`);
    with the caller's ``vllm.envs.compile_factors()`` (``env_factors``), CUDA device index and
    ``torch._dynamo.package.SystemInfo`` as a dict (``system``), which need vLLM and torch."""
    parallel = config.parallel_config
    dp_rank = getattr(parallel, "data_parallel_index", None)
    if dp_rank is None:
        dp_rank = getattr(parallel, "data_parallel_rank", 0)
    factors = config.compile_factors() if callable(getattr(config, "compile_factors", None)) else {}
    return json.loads(json.dumps({
        "rank": int(parallel.rank), "dp_rank": int(dp_rank or 0), "device_index": device_index,
        "compile_factors": flatten_factors(factors), "env": env_factors, "system": system,
    }, default=str))


def factor_differences(node: dict[str, Any], pod: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(variant, placement)``: each flattened compile factor (:func:`flatten_factors`) that
    differs between the tuner's and the pod's, one line each; ``variant`` makes another graph
    (the artifact is not this pod's engine variant), ``placement`` is where the model lives
    (:data:`PLACEMENT_CONFIG_FACTORS`)."""
    variant: list[str] = []
    placement: list[str] = []
    for name in sorted(set(node) | set(pod)):
        theirs, mine = node.get(name, "(unset)"), pod.get(name, "(unset)")
        if theirs == mine:
            continue
        line = f"vLLM config {name}: tuner {_shown(theirs)}, pod {_shown(mine)}"
        (placement if name in PLACEMENT_CONFIG_FACTORS else variant).append(line)
    return variant, placement


def placement_differences(node_env: dict[str, Any], pod_env: dict[str, Any]) -> list[str]:
    """Each :data:`PLACEMENT_ENV_FACTORS` variable whose value differs, one line each (the
    artifact still installs: vLLM names its directory with the pod's own values)."""
    return [f"{name}: tuner {_shown(node_env.get(name))}, pod {_shown(pod_env.get(name))}"
            for name in sorted(PLACEMENT_ENV_FACTORS)
            if name in node_env or name in pod_env
            if node_env.get(name) != pod_env.get(name)]


def env_differences(node_env: dict[str, Any], pod_env: dict[str, Any]) -> list[str]:
    """Each other vLLM environment factor whose value differs (``VLLM_COMPILE_ON_ONE_RANK`` among
    them): another graph, or another way to load it."""
    return [f"environment {name}: tuner {_shown(node_env.get(name, '(unset)'))}, pod {_shown(pod_env.get(name, '(unset)'))}"
            for name in sorted(set(node_env) | set(pod_env))
            if name not in PLACEMENT_ENV_FACTORS and node_env.get(name, "(unset)") != pod_env.get(name, "(unset)")]


def system_differences(node: dict[str, Any], pod: dict[str, Any], on_gpu: bool) -> list[str]:
    """What torch's ``SystemInfo.check_compatibility`` would refuse, each field named: Python and
    torch always; the CUDA toolkit, Triton and the GPU name when the pod loads on a GPU
    (``on_gpu``), a Triton of ``(0, 0)`` (none) and a pod GPU of ``None`` not compared, as torch
    does. ``[]``: torch loads it."""
    checked = ["python_version", "torch_version"]
    if on_gpu:
        checked += ["toolkit_version", "triton_version", "gpu_name"]
    lines = []
    for name in checked:
        theirs, mine = node.get(name), pod.get(name)
        if isinstance(theirs, list):
            theirs = tuple(theirs)
        if isinstance(mine, list):
            mine = tuple(mine)
        if name == "triton_version" and mine == (0, 0):
            continue
        if name == "gpu_name" and mine is None:
            continue
        if theirs != mine:
            lines.append(f"{SYSTEM_FIELDS[name]}: tuner {_shown(theirs)}, pod {_shown(mine)}")
    return lines


def device_refusal(record: AotArtifacts, rank: int, dp_rank: int, device_index: int | None,
                   pod_one_rank: bool) -> str | None:
    """Why the artifact for ``rank`` must not be placed on device index ``device_index``
    (``None``: it may): Inductor bakes the index it compiled on into the artifact
    (``get_raw_stream(<index>)``), and loading it on another fails with "CUDA driver error:
    invalid argument". One artifact for all ranks compiled with ``VLLM_COMPILE_ON_ONE_RANK=1``
    is valid on every index when the pod sets it too."""
    entry = record.recorded(rank, dp_rank)
    if entry is None:
        return f"the run holds no artifact for rank {rank} (data-parallel {dp_rank})"
    if record.one_for_all_ranks:
        if pod_one_rank:
            return None
        return (f"the run's one artifact for all ranks was compiled with {COMPILE_ON_ONE_RANK}=1 and this pod does not "
                f"set it (a compile factor: vLLM would look for another name, and an artifact of one rank is bound "
                f"to the device index it was compiled on)")
    if entry.device_index is None:
        return f"the run does not record which device index rank {rank} was compiled on"
    if device_index is None:
        return f"this worker's CUDA device index is unknown (rank {rank} was compiled on cuda:{entry.device_index})"
    if device_index != entry.device_index:
        return (f"rank {rank} was compiled on cuda:{entry.device_index} and runs on cuda:{device_index} here: Inductor "
                f"bakes the device index into the artifact (it would fail with \"CUDA driver error: invalid "
                f"argument\"); set {COMPILE_ON_ONE_RANK}=1 on the tuner and the pods for one artifact valid on every index")
    return None
