"""vLLM 0.33/0.34's compile cache in a worker: the run's AOT artifact placed at exactly the path
vLLM is about to load, right before it loads it.

vLLM's compiled model (``vllm/compilation/decorators.py``, ``__call__``) names the artifact
``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<sha256>/rank_{rank}_{dp}/model``,
points ``TORCHINDUCTOR_CACHE_DIR`` at ``<sha256>/inductor_cache`` and calls the module's
``_try_load_aot_compiled_fn(model, path)`` by its global name; the plugin's hook wraps that
function (:mod:`tunecache.client.boot.hooks`) and calls :func:`before_aot_load` with the
path. So the pod never computes ``<sha256>``: another HOME, user, cache directory, package
prefix (vLLM checks the traced sources by module name and content, ``_verify_source_unchanged``)
or ``CUDA_HOME`` changes the name, and vLLM's own name is used.

What still makes the artifact unusable is compared first (:mod:`tunecache.engines.vllm.aot`)
and named in the one line this logs: the device index the rank compiled on, the engine variant
(vLLM 0.34's ``VllmConfig.compile_factors()`` field by field), vLLM's other environment
factors, and what torch's ``SystemInfo`` refuses. The 0.25-0.32 path (directory names computed
from the factors, the backbone renamed, the traced files checked, the index relocated) is
:mod:`tunecache.client.boot.staged`'s, for those releases only. Never raises into vLLM.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.client.atomic import file_lock
from tunecache.client.boot.coordination import DEFAULT_INSTALL_DEADLINE_S
from tunecache.client.boot.handoff import Handoff
from tunecache.client.boot.reporting import variant_seen
from tunecache.client.boot.staged import (
    UNPACK_WAIT_S,
    VariantFetch,
    _variant_cache,
    unpack_staged,
    unpacked_dir,
)
if TYPE_CHECKING:
    from tunecache.engines.vllm.compile_cache import VariantFactors
    from tunecache.engines.vllm.objects import CompiledModel, Json

from tunecache.engines.vllm.aot import (
    AOT_RECORD_FILE,
    COMPILE_ON_ONE_RANK,
    INDUCTOR_DIR,
    AotArtifacts,
    device_refusal,
    env_differences,
    factor_differences,
    placement_differences,
    rank_facts,
    system_differences,
)

log = logging.getLogger("vllm.plugins.tunecache")


@dataclass(frozen=True)
class PodAotFacts:
    """What this worker's vLLM and torch say about it, compared with the tuner's record."""

    vllm_version: str
    rank: int
    dp_rank: int
    device_index: int | None
    compile_factors: dict[str, Json] = field(default_factory=dict)
    env: dict[str, Json] = field(default_factory=dict)
    system: dict[str, Json] = field(default_factory=dict)
    on_gpu: bool = False
    variant_factors: VariantFactors | None = None
    """Its engine variant (``None``: unknown)."""

    @property
    def one_rank(self) -> bool:
        return str(self.env.get(COMPILE_ON_ONE_RANK) or "").strip().lower() in ("1", "true")


def pod_aot_facts(model: CompiledModel) -> PodAotFacts:
    """This worker's :class:`PodAotFacts` from vLLM's and torch's own functions: the compiled
    model's ``vllm_config`` (``parallel_config.rank`` and ``data_parallel_index``, as
    ``decorators.py`` names the rank directory; ``VllmConfig.compile_factors()`` where the release
    has it, 0.34), ``vllm.envs.compile_factors()``, ``torch.cuda.current_device()`` (the index
    Inductor bakes into the artifact) and ``torch._dynamo.package.SystemInfo.current()``."""
    import dataclasses

    import torch
    import vllm
    import vllm.envs as envs
    from tunecache.client.boot.engine import _model_name
    from tunecache.engines.vllm.compile_cache import variant_factors

    on_gpu = bool(torch.cuda.is_available())
    try:
        from torch._dynamo.package import SystemInfo

        system = dataclasses.asdict(SystemInfo.current())
    except Exception:  # a torch without it: nothing to compare
        system = {}
    facts = rank_facts(model.vllm_config, envs.compile_factors(),
                       int(torch.cuda.current_device()) if on_gpu else None, system)
    return PodAotFacts(vllm_version=str(vllm.__version__), rank=facts["rank"], dp_rank=facts["dp_rank"],
                       device_index=facts["device_index"], compile_factors=facts["compile_factors"],
                       env=facts["env"], system=facts["system"], on_gpu=on_gpu,
                       variant_factors=variant_factors(model.vllm_config, envs.compile_factors(), str(vllm.__version__),
                                                       _model_name(model.vllm_config.model_config)))


def before_aot_load(model: CompiledModel, path: str, fetch_variant: VariantFetch | None = None) -> str | None:
    """The plugin's hook on ``_try_load_aot_compiled_fn(model, path)``, before vLLM's own: the
    run's artifact for this rank placed at ``path`` (:func:`place_aot_artifact`; ``fetch_variant``
    fetches this engine variant's compile cache when the run is another variant's). Never raises."""
    if Handoff.from_environment().compile_cache is None:
        return None
    try:
        return place_aot_artifact(path, pod_aot_facts(model), fetch_variant)
    except Exception as exc:
        log.warning("tunecache: compile cache not installed, vLLM will compile: %s: %s", type(exc).__name__, exc)
        return None


def _unpacked(staged: Path) -> Path | None:
    """The directory the main process unpacked the staged tarball into (waiting for it as the
    0.25 path does); unpacked here under the staged cache's lock when it failed or is late."""
    target = unpacked_dir(staged)
    give_up = time.monotonic() + UNPACK_WAIT_S
    while time.monotonic() < give_up and not target.is_dir() and not target.with_name(target.name + ".failed").exists():
        time.sleep(0.01)
    if target.is_dir():
        return target
    with file_lock(staged.with_suffix(".lock"), DEFAULT_INSTALL_DEADLINE_S):
        if not target.is_dir():
            unpack_staged(staged, staged.read_bytes())
    return target if target.is_dir() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _copy_atomically(source: Path, target: Path) -> bool:
    """``source`` (a file or a directory) at ``target``, copied to a temporary name in the same
    directory and renamed; ``False`` when ``target`` was there already (another rank of this
    node placed it first, or vLLM wrote it)."""
    if os.path.lexists(target):
        return False
    temporary = target.with_name(f".{target.name}.tunecache-{os.getpid()}.tmp")
    if temporary.is_dir():
        shutil.rmtree(temporary)
    if source.is_dir():
        shutil.copytree(source, temporary, symlinks=False)
    else:
        shutil.copyfile(source, temporary)
    try:
        if temporary.is_dir():
            os.rename(temporary, target)  # fails when another rank's directory is in place
        else:
            os.link(temporary, target)  # never replaces a file that appeared meanwhile
    except OSError:
        return False
    finally:
        if temporary.is_dir():
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            temporary.unlink(missing_ok=True)
    return True


def refusals(record: AotArtifacts, pod: PodAotFacts) -> list[str]:
    """Every reason the run's artifact is not this rank's, each named; ``[]``: it is."""
    reasons: list[str] = []
    if record.vllm_version != pod.vllm_version:
        reasons.append(f"vLLM version: tuner {record.vllm_version}, pod {pod.vllm_version}")
    device = device_refusal(record, pod.rank, pod.dp_rank, pod.device_index, pod.one_rank)
    if device:
        reasons.append(device)
    variant, _ = factor_differences(record.compile_factors, pod.compile_factors)
    reasons += variant
    reasons += env_differences(record.env, pod.env)
    system = system_differences(record.system, pod.system, pod.on_gpu)
    reasons += [f"torch's SystemInfo would refuse it: {line}" for line in system]
    return reasons


def _variant_record(staged: Path, record: AotArtifacts, pod: PodAotFacts, run: str,
                    fetch_variant: VariantFetch | None) -> tuple[AotArtifacts | None, Path | None, str, str]:
    """``(record, unpacked directory, run, line)`` of this pod's engine variant: the staged run's
    when it is that variant (or either side does not know its variant), else the variant's own
    run, fetched once per boot (:func:`tunecache.client.boot.staged._variant_cache`, under the
    staged cache's lock) and unpacked beside the staged one; ``(None, None, run, why)`` when the
    service has none (this worker's reports then say the variant is missing)."""
    from tunecache.engines.vllm.compile_cache import VariantFactors, variant_differences

    if pod.variant_factors is None or not record.variant_factors:
        return record, None, run, ""
    mine, node = pod.variant_factors, VariantFactors.model_validate(record.variant_factors)
    variant_seen.variant, variant_seen.missing = mine.variant, False
    if mine.variant == node.variant:
        return record, None, run, ""
    with file_lock(staged.with_suffix(".lock"), DEFAULT_INSTALL_DEADLINE_S):
        found = _variant_cache(staged, mine.variant, fetch_variant)
        if found is None:
            variant_seen.missing = True
            named = "; ".join(variant_differences(node, mine))
            return None, None, run, (f"no warm state is stored for this engine variant ({mine.variant}; run {run} is "
                                     f"variant {node.variant}, which differs in: {named}); reported to the service as "
                                     f"missing")
        variant_seen.run = found[0]
        tarball = next(staged.parent.glob(f"compile-cache-variant-{mine.variant}-*-run-{found[0]}.tar.gz"))
        unpacked = unpacked_dir(tarball)
        if not unpacked.is_dir():
            unpack_staged(tarball, found[1])
    if not (unpacked / AOT_RECORD_FILE).is_file():
        return None, None, str(found[0]), (f"run {found[0]} of this engine variant ({mine.variant}) holds no AOT "
                                           f"artifact this vLLM {pod.vllm_version} loads")
    return (AotArtifacts.model_validate_json((unpacked / AOT_RECORD_FILE).read_bytes()), unpacked, str(found[0]),
            f" (engine variant {mine.variant})")


def place_aot_artifact(path: str, pod: PodAotFacts, fetch_variant: VariantFetch | None = None) -> str:
    """Place the staged run's artifact for ``pod``'s rank at ``path`` (vLLM's own name), and its
    ``inductor_cache/`` entries into ``<hash dir>/inductor_cache`` where they are not yet,
    atomically (a temporary name in the same directory, renamed); nothing when ``path`` exists
    already or when :func:`refusals` names a reason. When the pod's engine variant is not the
    staged run's, its own variant's run is fetched (``fetch_variant``) and placed instead
    (:func:`_variant_record`). Returns the line it logged."""
    started = time.monotonic()
    handoff = Handoff.from_environment()
    staged = handoff.compile_cache
    run = handoff.warm_state_run or "?"
    target = Path(path)
    where = f"rank {pod.rank}" + (f", cuda:{pod.device_index}" if pod.device_index is not None else "")
    if target.exists():
        return _said(f"compile cache: an AOT artifact is in place at {target} already, vLLM loads it ({where})")
    unpacked = _unpacked(staged) if staged is not None else None
    if unpacked is None or not (unpacked / AOT_RECORD_FILE).is_file():
        return _said(f"compile cache not installed, vLLM will compile: run {run} holds no AOT artifact this vLLM "
                     f"{pod.vllm_version} loads (a tuner of another release, or without the AOT compile) ({where})")
    record = AotArtifacts.model_validate_json((unpacked / AOT_RECORD_FILE).read_bytes())
    record, variant_dir, run, variant = _variant_record(staged, record, pod, run, fetch_variant)
    if record is None:
        return _said(f"compile cache not installed, vLLM will compile: {variant} ({where})")
    unpacked = variant_dir or unpacked
    reasons = refusals(record, pod)
    if reasons:
        return _said(f"compile cache not installed, vLLM will compile: run {run}'s AOT artifact is not this "
                     f"worker's: {'; '.join(reasons)} ({where})")
    member, entry = record.rank_member(pod.rank, pod.dp_rank), record.recorded(pod.rank, pod.dp_rank)
    source = unpacked / str(member)
    if entry is None or not source.is_file() or _sha256(source) != entry.sha256:
        return _said(f"compile cache not installed, vLLM will compile: run {run}'s artifact {member} is missing or "
                     f"not the bytes its record names ({where})")
    inductor_source = source.parent.parent / INDUCTOR_DIR
    inductor_target = target.parent.parent / INDUCTOR_DIR
    placed = 0
    if inductor_source.is_dir():
        inductor_target.mkdir(parents=True, exist_ok=True)
        for item in sorted(inductor_source.iterdir()):
            placed += _copy_atomically(item, inductor_target / item.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not _copy_atomically(source, target):
        return _said(f"compile cache: an AOT artifact appeared at {target} meanwhile, vLLM loads it ({where})")
    _, moved_model = factor_differences(record.compile_factors, pod.compile_factors)
    moved = placement_differences(record.env, pod.env) + moved_model
    how = ("its one artifact for all ranks (" + COMPILE_ON_ONE_RANK + "=1 on both sides)" if record.one_for_all_ranks
           else f"the artifact rank {entry.rank} compiled on cuda:{entry.device_index}")
    note = f"; placed under this pod's own name although these differ: {'; '.join(moved)}" if moved else ""
    return _said(f"compile cache from run {run}{variant}: {how} placed at {target}, {placed} Inductor cache entries "
                 f"beside it ({where}, {time.monotonic() - started:.2f} s){note}")


def _said(line: str) -> str:
    log.info("tunecache: %s", line)
    return line
