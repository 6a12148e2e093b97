"""The tuner's harvesters: what a warmup wrote, as artifacts, one class per artifact kind,
registered against the contract's kinds (:data:`tunecache.contract.KINDS`).

A harvester is one kind's tuner-side half: where the vLLM warmup points the tool that writes
the kind (:meth:`Harvester.environment`: the variable and the directory under the warmup's
scratch, :func:`tunecache.service.tuner.vllm_warmup.vllm_command`), and how what it wrote
becomes artifacts in the run's output directory
(:class:`~tunecache.service.tuner.result.HarvestedArtifact`: kind, name, media type and
``path`` relative to it; :meth:`Harvester.artifact`).
A kind that is one directory stored as one tarball is a :class:`DirectoryTarball` with its
directory and variable; the warm-state kinds harvest alike (:meth:`Harvester.harvest`), so
the vLLM warmup iterates them (:func:`tunecache.service.tuner.vllm_warmup.harvest_warm_state`).
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tunecache.contract import ArtifactKind
from tunecache.engines import engine_for
from tunecache.engines.vllm.compile_cache import AOT_DIR, FACTORS_FILE, CompileFactors, file_digests, node_dir_names
from tunecache.engines.vllm.compile_paths import node_path_files
from tunecache.service.tuner.result import HarvestedArtifact
from tunecache.engines.vllm.startup_plan import MAX_PLAN_BYTES, PLAN_DIR, plan_fingerprint

#: The engine whose warmup the tuner runs: where it points the engine's caches is its adaptor's.
ENGINE = engine_for("vllm")

#: What a harvester returns for each artifact it wrote.
Artifact = HarvestedArtifact


class Harvester:
    """Base of every harvester: its kind, and where the vLLM warmup points what writes it."""

    kind: ClassVar[ArtifactKind]

    def environment(self, scratch: Path) -> dict[str, str]:
        """The variables that point the writing tool into ``scratch`` (``{}``: another
        kind's variable does, or the tool writes where tunecache asks it in-process)."""
        return {}

    def artifact(self, name: str | None = None, path: str | None = None) -> Artifact:
        """An artifact of this kind named ``name`` (default: the kind's ``artifact_name``),
        its bytes at ``path`` in the output directory (default: ``name``)."""
        name = name or self.kind.facts.artifact_name
        return HarvestedArtifact(kind=self.kind, name=name, media_type=self.kind.media_type, path=path or name)

    def harvest(self, scratch: Path, out_dir: Path) -> tuple[list[Artifact], dict[str, Any]]:
        """What the vLLM warmup's tool wrote under ``scratch``, as artifacts written to
        ``out_dir``, and the run summary's fields this kind adds (``{}``: none)."""
        raise NotImplementedError(f"{self.kind} is harvested by its warmup's own steps")


#: The harvester class of each artifact kind.
HARVESTERS: dict[ArtifactKind, type[Harvester]] = {}

H = TypeVar("H", bound=type[Harvester])


def harvests(kind: ArtifactKind) -> Callable[[H], H]:
    """Class decorator: the class harvests ``kind``.

    Raises:
        ValueError: ``kind`` has a harvester already.
    """

    def register(cls: H) -> H:
        if kind in HARVESTERS:
            raise ValueError(f"{kind} has a harvester already: {HARVESTERS[kind].__name__}")
        cls.kind = kind
        HARVESTERS[kind] = cls
        return cls

    return register


def tar_directory(directory: Path) -> bytes:
    """Every file under ``directory`` (paths relative to it, sorted) as a gzipped tarball."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                tar.add(str(path), arcname=str(path.relative_to(directory)))
    return raw.getvalue()


def has_files(directory: Path) -> bool:
    """``directory`` exists and holds a file somewhere under it."""
    return directory.is_dir() and any(p.is_file() for p in directory.rglob("*"))


class DirectoryTarball(Harvester):
    """A kind that is one directory its tool wrote, stored as one tarball (the kind's
    ``artifact_name``), none when the tool wrote nothing there."""

    #: Where the vLLM warmup has the tool write, under its scratch directory.
    scratch_dir: ClassVar[str]
    #: The variable that points the tool there (``None``: it lies under another kind's directory).
    variable: ClassVar[str | None] = None

    def environment(self, scratch: Path) -> dict[str, str]:
        return {self.variable: str(scratch / self.scratch_dir)} if self.variable else {}

    def harvest_directory(self, directory: Path, out_dir: Path) -> list[Artifact]:
        """``directory`` as this kind's one artifact in ``out_dir``; ``[]`` when it holds no file."""
        if not has_files(directory):
            return []
        (out_dir / self.kind.facts.artifact_name).write_bytes(tar_directory(directory))
        return [self.artifact()]

    def harvest(self, scratch: Path, out_dir: Path) -> tuple[list[Artifact], dict[str, Any]]:
        return self.harvest_directory(scratch / self.scratch_dir, out_dir), {}


@harvests(ArtifactKind.FLASHINFER_AUTOTUNE)
class FlashInferFileHarvester(Harvester):
    """FlashInfer's autotune file: written into the output directory by FlashInfer itself
    (the stages warmup's ``flashinfer.autotune(True, cache=...)``) or copied there from the
    lowest rank's file (the vLLM warmup); described by :meth:`artifact` with its name."""


@harvests(ArtifactKind.VLLM_RANK_FILE)
class VllmRankFilesHarvester(Harvester):
    """vLLM's per-rank v1 files ``<VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR>/<hash>/autotune_configs_dp{dp}_rank{rank}.json``,
    each an artifact named ``vllm/<hash>/<file>`` (:func:`tunecache.service.tuner.vllm_warmup.harvest_vllm_cache`
    picks the run's FlashInfer file among them)."""

    variable = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)

    def environment(self, scratch: Path) -> dict[str, str]:
        return {self.variable: str(scratch / self.scratch_dir)}


@harvests(ArtifactKind.FLASHINFER_JIT_MODULE)
class FlashInferJitHarvester(Harvester):
    """FlashInfer's JIT modules, one tarball each
    (:func:`tunecache.service.tuner.jit_artifacts.harvest_flashinfer_jit`: which modules is the
    warmup's to say); each named ``flashinfer-jit/<module>.tar.gz``."""

    def module_artifact(self, module: str) -> Artifact:
        """Module ``module``'s tarball (at ``jit/<module>.tar.gz``), with its ``module``."""
        return self.artifact(f"flashinfer-jit/{module}.tar.gz", f"jit/{module}.tar.gz").model_copy(
            update={"module": module})


@harvests(ArtifactKind.DEEP_GEMM_JIT_CACHE)
class DeepGemmCacheHarvester(DirectoryTarball):
    """DeepGEMM's JIT cache directory (``DG_JIT_CACHE_DIR``; the stages warmup points it into
    its output directory, :meth:`harvest_directory` of that)."""

    variable = "DG_JIT_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)


@harvests(ArtifactKind.FLASHINFER_V2_STORE)
class FlashInferV2StoreHarvester(DirectoryTarball):
    """FlashInfer's v2 store, ``<VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR>/v2/``."""

    scratch_dir = f"{VllmRankFilesHarvester.scratch_dir}/v2"


#: Where the vLLM warmup's script writes its engine's compile facts (in its scratch directory).
COMPILE_FACTS_FILE = "compile-facts.json"


@harvests(ArtifactKind.VLLM_COMPILE_CACHE)
class CompileCacheHarvester(Harvester):
    """vLLM's torch.compile cache (``$VLLM_CACHE_ROOT/torch_compile_cache/``) with, at the
    tarball's root, :data:`tunecache.engines.vllm.compile_cache.FACTORS_FILE`: the node's
    :class:`~tunecache.engines.vllm.compile_cache.CompileFactors` (from the backbone's
    ``cache_key_factors.json``, as vLLM wrote it when it compiled, and the engine's
    :func:`tunecache.service.tuner.vllm_warmup.compile_facts`), so that what decides where a
    pod puts it is signed with it, with where the cache was on the node and which of its files
    name the node's paths (:func:`tunecache.engines.vllm.compile_paths.node_path_files`). Adds
    the run summary's ``vllm_compile``: the factors, with
    ``names_checked`` (whether they give the directory names vLLM made). For vLLM 0.33/0.34 (the
    mega AOT artifact, loaded alone) the tarball holds instead, at its root,
    :data:`tunecache.engines.vllm.aot.AOT_RECORD_FILE` (each rank's artifact, the device index it
    compiled on: :mod:`tunecache.service.tuner.aot_harvest`), and the summary's
    ``vllm_compile`` is ``{"vllm_version", "aot", "variant_factors"}`` (the engine variant the
    service keeps a current run of, as for 0.25-0.32)."""

    cache_root = ENGINE.harvest_dir("VLLM_CACHE_ROOT")

    def environment(self, scratch: Path) -> dict[str, str]:
        return {"VLLM_CACHE_ROOT": str(scratch / self.cache_root)}

    def harvest(self, scratch: Path, out_dir: Path) -> tuple[list[Artifact], dict[str, Any]]:
        compiled = scratch / self.cache_root / "torch_compile_cache"
        if not has_files(compiled):
            return [], {}
        with tempfile.TemporaryDirectory() as staged:
            tree = Path(staged) / "tree"
            shutil.copytree(compiled, tree, symlinks=True)
            aot = self._aot_record(scratch, tree)  # vLLM 0.33/0.34: the mega AOT artifact, loaded alone
            factors = None if aot is not None else self._factors(scratch, compiled)
            if factors is not None:  # where the cache was, and which files name it or a traced source
                factors = factors.model_copy(update={"cache_dir": str(compiled), "node_paths": node_path_files(
                    compiled, [str(compiled), *factors.traced_files])})
                (tree / FACTORS_FILE).write_text(factors.model_dump_json(indent=1))
            (out_dir / self.kind.facts.artifact_name).write_bytes(tar_directory(tree))
        if aot is not None:
            variant = {"variant_factors": aot.variant_factors} if aot.variant_factors else {}
            return [self.artifact()], {"vllm_compile": {"vllm_version": aot.vllm_version,
                                                        "aot": aot.model_dump(mode="json"), **variant}}
        if factors is None:
            return [self.artifact()], {}
        checked = node_dir_names(factors)
        return [self.artifact()], {"vllm_compile": {**factors.model_dump(mode="json"), "names_checked": {
            "backbone": checked.get("backbone") == factors.backbone_dir,
            "aot": checked.get("aot") == factors.aot_dir}}}

    @staticmethod
    def _aot_record(scratch: Path, tree: Path):
        """vLLM 0.33/0.34's record of its AOT artifacts (:func:`tunecache.service.tuner.aot_harvest.aot_record`),
        when the engine's compile facts name its ranks; ``None`` otherwise (0.25-0.32)."""
        from tunecache.service.tuner.aot_harvest import aot_record

        try:
            facts = json.loads((scratch / COMPILE_FACTS_FILE).read_text())
        except (OSError, ValueError):
            return None
        return aot_record(tree, facts) if isinstance(facts, dict) and facts.get("aot_ranks") else None

    @staticmethod
    def _factors(scratch: Path, compiled: Path) -> CompileFactors | None:
        """The node's :class:`CompileFactors`: the backbone directory's ``cache_key_factors.json``
        (rank 0's) and the engine's compile facts (:data:`COMPILE_FACTS_FILE`); ``None`` when
        either is missing."""
        metas = sorted(p for p in compiled.glob("*/rank_*/*/cache_key_factors.json") if p.parts[-4] != AOT_DIR)
        aot = sorted(p.name for p in (compiled / AOT_DIR).iterdir() if p.is_dir()) if (compiled / AOT_DIR).is_dir() else []
        try:
            facts = json.loads((scratch / COMPILE_FACTS_FILE).read_text())
            meta = json.loads(metas[0].read_text()) if metas else None
        except (OSError, ValueError):
            return None
        if meta is None or "error" in facts:
            print(f"tunecache: compile factors not recorded: {facts.get('error', 'no cache_key_factors.json')}",
                  file=sys.stderr)
            return None
        return CompileFactors(
            vllm_version=facts["vllm_version"], env=meta["env"], config_hash=meta["config_hash"],
            config_hashes=facts.get("config_hashes", {}), model=facts["model"], code_hash=meta.get("code_hash"),
            compiler_hash=meta.get("compiler_hash"),
            traced_files={p: d for p, d in file_digests(facts.get("traced_files", [])).items() if d is not None},
            aot_extra=facts.get("aot_extra", []), aot_extra_repr=facts.get("aot_extra_repr"),
            model_hash_key=facts.get("model_hash_key"),
            backbone_dir=metas[0].parts[-4], aot_dir=aot[0] if len(aot) == 1 else None,
            variant_factors=facts.get("variant_factors"),
        )


@harvests(ArtifactKind.VLLM_MODELINFOS)
class ModelInfosHarvester(DirectoryTarball):
    """vLLM's model-inspection cache, ``$VLLM_CACHE_ROOT/modelinfos/`` (the compile cache's
    harvester points ``VLLM_CACHE_ROOT``)."""

    scratch_dir = f"{CompileCacheHarvester.cache_root}/modelinfos"


@harvests(ArtifactKind.VLLM_STARTUP_PLAN)
class StartupPlanHarvester(DirectoryTarball):
    """vLLM 0.33/0.34's startup plans, ``$VLLM_CACHE_ROOT/startup_plan/`` (written where the
    fleet sets ``VLLM_ENABLE_STARTUP_PLAN=1``): only the files vLLM would load under their name
    (:func:`tunecache.engines.vllm.startup_plan.plan_fingerprint`), each named by its fingerprint."""

    scratch_dir = f"{CompileCacheHarvester.cache_root}/{PLAN_DIR}"

    def harvest(self, scratch: Path, out_dir: Path) -> tuple[list[Artifact], dict[str, Any]]:
        found = scratch / self.scratch_dir
        plans = sorted(p for p in found.iterdir() if p.is_file()) if found.is_dir() else []
        kept = {p.name: p.read_bytes() for p in plans if p.stat().st_size <= MAX_PLAN_BYTES}
        kept = {name: data for name, data in kept.items() if plan_fingerprint(name, data)}
        if not kept:
            return [], {}
        with tempfile.TemporaryDirectory() as staged:
            for name, data in kept.items():
                (Path(staged) / name).write_bytes(data)
            return self.harvest_directory(Path(staged), out_dir), {}


@harvests(ArtifactKind.TRITON_CACHE)
class TritonCacheHarvester(DirectoryTarball):
    """Triton's kernel cache (``TRITON_CACHE_DIR``)."""

    variable = "TRITON_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)


@harvests(ArtifactKind.TILELANG_CACHE)
class TileLangCacheHarvester(DirectoryTarball):
    """TileLang's kernel cache (``TILELANG_CACHE_DIR``: ``tilelang.env.Environment.TILELANG_CACHE_DIR``,
    default ``~/.tilelang/cache``), which vLLM 0.33/0.34's JIT warmup fills
    (``vllm/model_executor/warmup/jit_warmup_tilelang_helper.py::compile_tilelang``)."""

    variable = "TILELANG_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)


@harvests(ArtifactKind.CUTE_DSL_CACHE)
class CuteDslCacheHarvester(DirectoryTarball):
    """The CuTe DSL's file cache (``CUTE_DSL_CACHE_DIR``: ``cutlass.base_dsl.cache_helpers.
    get_default_generated_ir_path("CUTE_DSL")``; ``cute_dsl_<module hash>.mlir`` files written by
    ``compile_backend``'s ``dump_cache_to_path``), which vLLM 0.33/0.34's CuTe DSL warmups fill
    (``cutedsl_warmup.py``, ``jit_warmup_cutedsl_helper.py::compile_cutedsl``)."""

    variable = "CUTE_DSL_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)


@harvests(ArtifactKind.FA4_CUTE_DSL_CACHE)
class Fa4CuteDslCacheHarvester(DirectoryTarball):
    """FlashAttention 4's CuTe DSL kernel cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``;
    ``vllm/vllm_flash_attn/cute/cache_utils.py::get_jit_cache``: ``<dir>/<source fingerprint>/
    [<name>/]<key sha256>.o``), filled only where ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``."""

    variable = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)


@harvests(ArtifactKind.TVM_FFI_CACHE)
class TvmFfiCacheHarvester(DirectoryTarball):
    """TVM-FFI's build cache (``TVM_FFI_CACHE_DIR``, default ``~/.cache/tvm-ffi``: one
    ``<name>_<source hash>/`` build directory per extension, ``tvm_ffi.cpp.extension.build``/``load``)."""

    variable = "TVM_FFI_CACHE_DIR"
    scratch_dir = ENGINE.harvest_dir(variable)
