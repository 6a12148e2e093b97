"""Before a boot: what of a stored run will load on this pod, kind by kind (``tunecache doctor``).

Each verdict compares what the run recorded with this pod's own paths and values, by the
same checks the install makes (nothing is fetched or written):

* the tactics: the lookup matched this pod's key and FlashInfer environment exactly, which is
  what FlashInfer's ``AutoTuner.load_configs`` checks;
* FlashInfer JIT modules: this pod's FlashInfer workspace subdirectory (version, arch) and CUDA
  version against the node's (:func:`tunecache.client.jit_install.jit_mismatches`); through the
  vLLM plugin they load through FlashInfer's AOT path, so the workspace, package and CUDA paths
  may differ; installed by ``tunecache pull --jit`` they must not (ninja's files name them);
* the compile cache: this pod's vLLM version and environment factors (``vllm.envs.compile_factors()``,
  the placement factors left out) and each traced source file where this pod imports it from,
  its bytes against the node's (:func:`tunecache.formats.vllm_compile.traced_files_here`: the
  prefix the packages live under is no difference). The engine's arguments decide the rest,
  which only vLLM's config tells: the run's engine variant and the engine arguments it was
  tuned with are named;
* DeepGEMM, Triton and vLLM's model-inspection cache: where they go on this pod;
* the package versions the executable kinds were built with against this pod's
  (:mod:`tunecache.formats.dependencies`): a kind built with another torch, Triton or TVM-FFI
  will not load.

Executable kinds (everything but the tactics) install only from a run signed by a trusted key
(``TUNECACHE_TRUSTED_KEYS``): checked here as the install checks it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunecache.contract import ArtifactKind, EnvironmentMetadata, TuningKey, TuningRunRead


@dataclass(frozen=True)
class Verdict:
    """What will become of one kind of the run's artifacts on this pod: ``loads`` (``None``:
    cannot be told before vLLM builds its config) and why, in one line."""

    kind: ArtifactKind
    loads: bool | None
    detail: str

    def __str__(self) -> str:
        said = {True: "loads", False: "will not load", None: "depends on the engine"}[self.loads]
        return f"{self.kind}: {said}: {self.detail}"


def _jit(run: TuningRunRead, count: int) -> list[Verdict]:
    from tunecache.client.jit_install import flashinfer_workspace, jit_mismatches, shown
    from tunecache.formats.jit_module import jit_environment

    kind = ArtifactKind.FLASHINFER_JIT_MODULE
    own = flashinfer_workspace()
    if own is None:
        return [Verdict(kind, False, f"{count} modules: FlashInfer is not importable here")]
    recorded = run.summary.get("flashinfer_jit")
    recorded = recorded if isinstance(recorded, dict) else {}
    here = jit_environment()
    subdir = str(recorded.get("workspace_subdir") or "")
    differ = ([f"workspace_subdir: node {shown(subdir)}, here {own.subdir}"] if subdir and subdir != own.subdir else [])
    as_aot = differ + jit_mismatches(recorded, here, placement=False)
    if as_aot:
        return [Verdict(kind, False, f"{count} modules built for another FlashInfer or CUDA: " + "; ".join(as_aot))]
    placed = jit_mismatches(recorded, here, placement=True)
    without = ("; installed without the plugin (tunecache pull --jit) ninja would rebuild them: "
               + "; ".join(placed)) if placed else ""
    return [Verdict(kind, True, f"{count} modules, through the vLLM plugin from this pod's workspace "
                                f"{own.path} (FlashInfer's AOT path){without}")]


def _vllm_here() -> tuple[str | None, dict[str, Any] | None]:
    """This pod's vLLM version and its compile factors (``None`` each: no vLLM here)."""
    try:
        import vllm

        found = str(vllm.__version__)
    except Exception:
        return None, None
    try:
        import vllm.envs as envs

        return found, json.loads(json.dumps(envs.compile_factors(), default=str))
    except Exception:
        return found, None


def _compile_cache(run: TuningRunRead) -> Verdict:
    from tunecache.formats.vllm_compile import PLACEMENT_ENV_FACTORS, CompileFactors, traced_files_here

    kind = ArtifactKind.VLLM_COMPILE_CACHE
    recorded = run.summary.get("vllm_compile")
    try:
        node = CompileFactors.model_validate(recorded)
    except Exception:
        return Verdict(kind, False, "the run records no compile factors (a tuner before this version)")
    version, env = _vllm_here()
    differ = []
    if version is None:
        differ.append("vLLM is not installed here")
    elif version != node.vllm_version:
        differ.append(f"vLLM version: node {node.vllm_version}, pod {version}")
    if env is not None:
        for name in sorted((set(env) | set(node.env)) - set(PLACEMENT_ENV_FACTORS)):
            if env.get(name, "(unset)") != node.env.get(name, "(unset)"):
                differ.append(f"environment {name}: node {node.env.get(name, '(unset)')!r}, pod {env.get(name, '(unset)')!r}")
    digests, moved, _ = traced_files_here(dict(node.traced_files))
    for path, digest in sorted(node.traced_files.items()):
        if digests.get(path) is None:
            differ.append(f"traced source {path}: not on this pod")
        elif digests[path] != digest:
            differ.append(f"traced source {moved.get(path, path)}: its content differs")
    if differ:
        return Verdict(kind, False, "vLLM would compute other directory names: " + "; ".join(differ))
    variant = run.variant or "unknown"
    args = run.summary.get("engine_args")
    tuned = f"tuned with engine arguments {json.dumps(args, sort_keys=True)}" if args else "tuned with the node's engine arguments"
    where = (f"; {len(moved)} traced sources found under this pod's own package prefix, with the node's bytes"
             if moved else "")
    return Verdict(kind, None, f"vLLM version, environment and traced sources match{where}; engine variant {variant} "
                               f"({tuned}): a pod booted with the same engine arguments loads it, one with others gets "
                               "its own variant's run or compiles (the plugin says which)")


def preflight(run: TuningRunRead, key: TuningKey, environment: EnvironmentMetadata,
              trusted_keys: Mapping[str, Any] | None) -> list[Verdict]:
    """A :class:`Verdict` for each kind of ``run``'s artifacts, for this pod (``key`` and
    ``environment`` as it asked; ``trusted_keys``: its ``TUNECACHE_TRUSTED_KEYS``, loaded)."""
    from tunecache.client.layouts import deep_gemm_cache_dir
    from tunecache.client.warm_state import triton_cache_dir, vllm_cache_root
    from tunecache.signing import UntrustedRun, verify_run

    kinds = {a.kind for a in run.artifacts}
    tactics = Verdict(ArtifactKind.FLASHINFER_AUTOTUNE, True,
                      f"{run.entries if run.entries is not None else '?'} entries, for this pod's key and FlashInfer "
                      "environment")
    refused = None
    if not trusted_keys:
        refused = "installs only from a run signed by a trusted key, and TUNECACHE_TRUSTED_KEYS is not set"
    else:
        try:
            verify_run(run.signature, key, environment, run.artifacts, trusted_keys, run.summary)
            if run.signature is not None and run.signature.manifest < 2:
                refused = "the run's signature (manifest format 1) is undated: code installs only from a dated one"
        except UntrustedRun as exc:
            # a pod that trusts keys installs nothing of a run they do not sign, the tactics neither
            refused = f"the run is refused, nothing of it installs: {exc}"
            tactics = Verdict(ArtifactKind.FLASHINFER_AUTOTUNE, False, refused)
    verdicts = [tactics]
    executable: list[Verdict] = []
    jit = run.artifacts_of(ArtifactKind.FLASHINFER_JIT_MODULE)
    if jit:
        executable += _jit(run, len(jit))
    if ArtifactKind.DEEP_GEMM_JIT_CACHE in kinds:
        executable.append(Verdict(ArtifactKind.DEEP_GEMM_JIT_CACHE, True, f"merged into {deep_gemm_cache_dir()}"))
    if ArtifactKind.TRITON_CACHE in kinds:
        executable.append(Verdict(ArtifactKind.TRITON_CACHE, True, f"merged into {triton_cache_dir()}, its group files "
                                                                  "pointed at this pod's paths"))
    if ArtifactKind.VLLM_MODELINFOS in kinds:
        executable.append(Verdict(ArtifactKind.VLLM_MODELINFOS, True, f"into {vllm_cache_root() / 'modelinfos'}"))
    if ArtifactKind.VLLM_COMPILE_CACHE in kinds:
        executable.append(_compile_cache(run))
    from tunecache.formats.dependencies import drift, installed_versions

    differs = drift(run.summary.get("dependencies"), installed_versions())
    executable = [Verdict(v.kind, False, f"built with other packages: {differs[v.kind]}") if v.kind in differs else v
                  for v in executable]
    if refused:
        executable = [Verdict(v.kind, False, refused) for v in executable]
    return verdicts + executable
