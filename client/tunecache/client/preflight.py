"""Before a boot: what of a stored run will load on this pod, kind by kind (``tunecache doctor``).

Each verdict compares what the run recorded with this pod's own paths and values, by the
same checks the install makes (nothing is fetched or written):

* the tactics: the lookup matched this pod's key and FlashInfer environment exactly, which is
  what FlashInfer's ``AutoTuner.load_configs`` checks;
* every other kind the run has, in :data:`tunecache.contract.KINDS`' order: its destination's
  ``preflight`` (:mod:`tunecache.client.destinations`), with this pod's own directories:
  FlashInfer JIT modules (:meth:`tunecache.client.jit_install.JitWorkspace.preflight`: the workspace
  subdirectory and CUDA version against the node's, through FlashInfer's AOT path or ninja's),
  the compile cache (:func:`tunecache.client.warm_state.compile_cache_verdict`: vLLM version,
  environment factors and traced sources; the engine's arguments decide the rest, which only
  vLLM's config tells), DeepGEMM, Triton and vLLM's model-inspection cache (where they go);
* the package versions the executable kinds were built with against this pod's
  (:mod:`tunecache.formats.dependencies`): a kind built with another torch, Triton or TVM-FFI
  will not load.

Executable kinds (``executable`` in :data:`tunecache.contract.KINDS`: everything but the
tactics) install only from a run signed by a trusted key (``TUNECACHE_TRUSTED_KEYS``) with a
dated signature: checked here as the install checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tunecache.client.aot_verdict import POD_GPU_NAME
from tunecache.client.run_trust import trusted_signer
from tunecache.signing import UntrustedRun
from tunecache.contract import ArtifactKind, EnvironmentMetadata, TuningKey, TuningRunRead, kinds_where


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


class Preflight(NamedTuple):
    """What :func:`preflight` found: a verdict per kind, and the refusal of the whole run
    (``None``: the pod takes it), which ``pull`` would exit with."""

    verdicts: list[Verdict]
    refused: UntrustedRun | None


def preflight(run: TuningRunRead, key: TuningKey, environment: EnvironmentMetadata,
              trusted_keys: Mapping[str, Any] | None) -> Preflight:
    """A :class:`Verdict` for each kind of ``run``'s artifacts, for this pod (``key`` and
    ``environment`` as it asked; ``trusted_keys``: its ``TUNECACHE_TRUSTED_KEYS``, loaded), and
    whether the pod refuses the run as a whole: the install's own decision
    (:func:`tunecache.client.run_trust.trusted_signer`), not a copy of it."""
    from tunecache.client.pipeline import destinations_of

    tactics = Verdict(ArtifactKind.FLASHINFER_AUTOTUNE, True,
                      f"{run.entries if run.entries is not None else '?'} entries, for this pod's key and FlashInfer "
                      "environment")
    refused = whole = None
    if not trusted_keys:
        refused = "installs only from a run signed by a trusted key, and TUNECACHE_TRUSTED_KEYS is not set"
    else:
        try:
            trusted_signer(run, key, environment, trusted_keys)
            if run.signature is not None and run.signature.manifest < 2:
                refused = "the run's signature (manifest format 1) is undated: code installs only from a dated one"
        except UntrustedRun as exc:
            # a pod that trusts keys installs nothing of a run they do not sign, the tactics neither
            whole, refused = exc, f"the run is refused, nothing of it installs: {exc.__cause__ or exc}"
            tactics = Verdict(ArtifactKind.FLASHINFER_AUTOTUNE, False, refused)
    verdicts = [tactics]
    executable: list[Verdict] = []
    gpu = POD_GPU_NAME.set(key.gpu_name)  # the pods' GPU, which torch's SystemInfo compares
    try:
        for kind in kinds_where(executable=True):  # each kind's destination, as this pod's own directories
            if run.artifacts_of(kind):
                executable.append(Verdict(kind, *destinations_of(kind)[0]().preflight(run, kind)))
    finally:
        POD_GPU_NAME.reset(gpu)
    from tunecache.formats.dependencies import drift, installed_versions

    differs = drift(run.summary.get("dependencies"), installed_versions())
    executable = [Verdict(v.kind, False, f"built with other packages: {differs[v.kind]}") if v.kind in differs else v
                  for v in executable]
    if refused:
        executable = [Verdict(v.kind, False, refused) for v in executable]
    return Preflight(verdicts + executable, whole)
