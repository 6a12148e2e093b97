"""vLLM's torch.compile cache: the factors its directory names are made of, and how a pod's
factors are compared with the tuning node's.

vLLM 0.25 keeps what torch.compile produced under ``$VLLM_CACHE_ROOT/torch_compile_cache/``
in two directories, each named by a hash vLLM computes inline (no function of its own to
call, so the two formulas are written again here, as in vLLM):

* ``<backbone>/rank_{rank}_{dp}/<prefix>/`` with ``cache_key_factors.json``, where
  ``backbone = sha256(str([env_hash, config_hash, code_hash, compiler_hash]))[:10]``
  (``vllm/compilation/backends.py::VllmBackend.__call__``);
* ``torch_aot_compile/<aot>/`` with ``inductor_cache/`` and ``rank_{rank}_{dp}/model``, where
  ``aot = sha256(str([env_hash, config_hash, *inductor_factors, model_hash_key]))``
  (``vllm/compilation/decorators.py``, ``caching.py::aot_compile_hash_factors``).

``env_hash`` is ``vllm.config.utils.hash_factors(vllm.envs.compile_factors())``,
``config_hash`` is ``VllmConfig.compute_hash()``, ``code_hash`` hashes the traced source
files' absolute paths and contents, ``compiler_hash`` the compiler's own factors (torch,
Inductor). The tuning node records its factors (:class:`CompileFactors`, inside the signed
compile-cache tarball as :data:`FACTORS_FILE`); a pod computes its own with vLLM's functions
(:class:`PodCompileFactors`, by the vLLM plugin before anything compiles) and
:func:`compare` says, one line per factor, what differs, or under which directory names the
pod's vLLM will look for the cache. What differs only by where things are on the pod is no
difference: the pod's own hashes name the directories then:

* where the model lives (``ModelConfig.model``, a path or a hub name that vLLM hashes but that
  does not change the graph): the pod's own config hash;
* the placement factors of vLLM's environment
  (:data:`tunecache.engines.vllm.placement.PLACEMENT_ENV_FACTORS`: variables whose default
  derives from ``HOME`` or vLLM's package directory, that some release hashes but that cannot
  change the compiled graph): the pod's own environment hash;
* the prefix the Python packages live under: each traced source file is looked up where this
  pod imports the same module from (:func:`locate_here`); with the same bytes there, the pod's
  own code hash (:func:`code_hash`, vLLM's formula over the pod's paths) names the backbone
  directory. vLLM's AOT artifact checks its sources under the pod's own paths already
  (``vllm/compilation/decorators.py::_verify_source_unchanged``).

An **engine variant** of a key is what makes vLLM compute other directory names for the same
model and GPU on purpose: another ``max_model_len``, compilation setting, KV-cache dtype or vLLM
environment factor (:class:`VariantFactors`: vLLM's version, its environment factors but the
placement ones, and each sub-config's ``compute_hash()`` with ``ModelConfig.model`` set to the
served model's name, so that where the model lives is no difference). Its id, :attr:`VariantFactors.variant`,
is what the service stores a warm state under; tuner and pod compute it with the same
function (:func:`variant_factors`) from the worker's ``VllmConfig``, and the differences between
two variants are named field by field where vLLM hashes fields (``vllm.config.utils.hash_factors``).

Pure: the standard library and pydantic (the functions that take a ``VllmConfig`` import
``vllm.config.utils`` where it is there).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tunecache.engines.vllm.aot import config_factor_groups
from tunecache.engines.vllm.compile_paths import MAX_NAMED
from tunecache.engines.vllm.placement import PLACEMENT_ENV_FACTORS, variant_env


#: The name of the node's :class:`CompileFactors` inside a ``vllm_compile_cache`` tarball.
FACTORS_FILE = "tunecache-compile-factors.json"
#: The directory of the AOT-compiled artifacts under ``torch_compile_cache/``.
AOT_DIR = "torch_aot_compile"

#: The length of a variant id (hex digits of a sha256; the contract's ``Variant``).
VARIANT_LENGTH = 16
#: A hashed factor's value is kept as it is up to this many characters of JSON, else as the
#: first 16 hex digits of its sha256 (``{"sha256": ...}``): enough to name a field that differs.
_FACTOR_SHOWN_MAX = 120


class VariantFactors(BaseModel):
    """What an engine variant of a key is made of: everything vLLM hashes into its compile-cache
    names but where things live (the model's path, :data:`PLACEMENT_ENV_FACTORS`, the package
    prefix of the traced sources). Equal factors, equal :attr:`variant`, the same compile cache."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vllm_version: str
    env: dict[str, Any] = Field(description="vllm.envs.compile_factors() without the placement factors")
    config_hashes: dict[str, str] = Field(
        description="compute_hash() of each sub-config, ModelConfig.model set to the served model's name")
    config_factors: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="the fields each sub-config hashed, where it hashes fields "
                                          "(vllm.config.utils.hash_factors), long values as their sha256: for naming")

    @property
    def variant(self) -> str:
        """The variant's id: the first :data:`VARIANT_LENGTH` hex digits of the sha256 of the
        version, the environment factors and the sub-config hashes (the factor values are only
        there to name a difference)."""
        canonical = json.dumps({"vllm_version": self.vllm_version, "env": self.env, "config": self.config_hashes},
                               sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:VARIANT_LENGTH]


def variant_differences(node: VariantFactors, pod: VariantFactors) -> list[str]:
    """Every factor in which the pod's variant differs from the node's, one line each, a
    sub-config's fields named where both recorded them; ``[]``: the same variant."""
    lines: list[str] = []
    if node.vllm_version != pod.vllm_version:
        lines.append(f"vLLM version: node {node.vllm_version}, pod {pod.vllm_version}")
    for name in sorted(set(node.env) | set(pod.env)):
        mine, theirs = pod.env.get(name, "(unset)"), node.env.get(name, "(unset)")
        if mine != theirs:
            lines.append(f"environment {name}: node {_shown(theirs)}, pod {_shown(mine)}")
    for name in sorted(set(node.config_hashes) | set(pod.config_hashes)):
        if node.config_hashes.get(name) == pod.config_hashes.get(name):
            continue
        theirs, mine = node.config_factors.get(name), pod.config_factors.get(name)
        fields = sorted(f for f in set(theirs or {}) | set(mine or {})
                        if (theirs or {}).get(f, "(unset)") != (mine or {}).get(f, "(unset)")) if theirs and mine else []
        if fields:
            lines.extend(f"vLLM config {name}.{f}: node {_shown(theirs.get(f, '(unset)'))}, "
                         f"pod {_shown(mine.get(f, '(unset)'))}" for f in fields)
        else:
            lines.append(f"vLLM config {name}: its hash differs (node {str(node.config_hashes.get(name))[:12]}, "
                         f"pod {str(pod.config_hashes.get(name))[:12]})")
    return lines


class CompileFactors(BaseModel):
    """What decided the names of the tuning node's compile-cache directories."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vllm_version: str
    env: dict[str, Any] = Field(description="vllm.envs.compile_factors() (the raw factors of env_hash)")
    config_hash: str = Field(description="VllmConfig.compute_hash() when vLLM compiled")
    config_hashes: dict[str, str] = Field(default_factory=dict,
                                          description="compute_hash() of each sub-config of the VllmConfig")
    model: str = Field(description="ModelConfig.model on the node (a path or a hub name)")
    code_hash: str | None = None
    compiler_hash: str | None = None
    traced_files: dict[str, str] = Field(default_factory=dict,
                                         description="each traced source file (absolute path) -> sha256 of its bytes")
    aot_extra: list[str] = Field(default_factory=list,
                                 description="factors between the config hash and the model hash key (Inductor's, "
                                             "with VLLM_USE_MEGA_AOT_ARTIFACT)")
    aot_extra_repr: list[str] | None = Field(
        default=None, description="repr() of each of those factors, as str() of vLLM's list of factors writes it "
                                  "(get_inductor_factors gives dicts and bytes, whose text in a list is not that of "
                                  "their str() in quotes; None: a tuner before this field, whose aot_extra applies)")
    model_hash_key: str | None = None
    # The names are vLLM's hex digests (sha256[:10], sha256), and nothing else: a pod that
    # cannot compute its own names installs under these, so they must never be a path
    backbone_dir: str | None = Field(default=None, pattern=r"^[0-9a-f]{10}$",
                                     description="the node's <backbone> directory name")
    aot_dir: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                description="the node's torch_aot_compile/<aot> directory name")
    variant_factors: VariantFactors | None = Field(default=None,
                                                   description="the engine variant the cache is for (None: a tuner "
                                                               "before variants)")
    cache_dir: str | None = Field(default=None, max_length=4096,
                                  description="the node's torch_compile_cache directory, absolute (None: a tuner before "
                                              "this field), whose paths a pod points at its own")
    node_paths: dict[str, Literal["text", "loads", "not relocatable"]] = Field(
        default_factory=dict, max_length=MAX_NAMED,
        description="each file under torch_compile_cache/ that names the node's paths -> what it is "
                    "(tunecache.engines.vllm.compile_paths)")


class PodCompileFactors(BaseModel):
    """The same factors as the pod's vLLM computes them (the vLLM plugin, from its ``VllmConfig``)."""

    model_config = ConfigDict(frozen=True)

    vllm_version: str
    env: dict[str, Any]
    config_hash: str
    config_hash_as_node: str = Field(description="the pod's config hash with ModelConfig.model set to the node's")
    config_hashes_as_node: dict[str, str] = Field(default_factory=dict)
    traced_files: dict[str, str | None] = Field(default_factory=dict,
                                                description="the node's traced files as found here (None: missing)")
    traced_here: dict[str, str] = Field(default_factory=dict,
                                        description="each node traced file that this pod has at another path -> "
                                                    "that path (another package prefix)")
    code_hash: str | None = Field(default=None,
                                  description="the code hash this pod's vLLM will compute over its own paths of the "
                                              "traced files, when some path differs (None: the node's applies)")
    variant_factors: VariantFactors | None = None


#: vLLM's index of the graphs compiled into a backbone directory (``rank_{r}_{dp}/<prefix>/``):
#: ``CompilerManager.cache_file_path`` in ``vllm/compilation/backends.py``, a Python literal
#: (``pprint.pformat`` of ``{(range, graph_index, compiler): {"graph_handle": (key, path),
#: "cache_key": ...}}``) that vLLM reads with ``ast.literal_eval``. The handle's path is the
#: absolute path of the compiled artifact on the node that compiled it (vllm#52154): vLLM opens
#: it as it is (``InductorStandaloneAdaptor.load``), both when it loads the AOT artifact and when
#: it compiles again, and a missing file is an error that ends the engine's start.
COMPILE_INDEX = "vllm_compile_cache.py"


def relocate_compile_index(text: str, directory: str, exists=None) -> tuple[str, int, list[str]]:
    """vLLM's compile index (:data:`COMPILE_INDEX`, its text) with every graph handle's artifact
    path pointed into ``directory`` (the index's own directory on this pod) when a file of that
    name is there (``exists``: how to ask, ``os.path.exists`` by default): ``(new text, paths
    moved, paths that exist in neither place)``. Read with ``ast.literal_eval`` and written with
    ``pprint.pformat``, as vLLM does (``CompilerManager.initialize_cache``, ``save_to_file``).

    Raises:
        ValueError: not a literal of that shape.
    """
    import ast
    import os
    import pprint

    check = exists or os.path.exists
    index = ast.literal_eval(text)
    if not isinstance(index, dict):
        raise ValueError(f"{COMPILE_INDEX} is not a dict literal")
    moved, missing = 0, []
    for value in index.values():
        handle = value.get("graph_handle") if isinstance(value, dict) else None
        if not (isinstance(handle, tuple) and len(handle) == 2 and all(isinstance(h, str) for h in handle)):
            continue
        here = os.path.join(directory, os.path.basename(handle[1]))
        if handle[1] == here:
            continue
        if check(here):
            value["graph_handle"] = (handle[0], here)
            moved += 1
        elif not check(handle[1]):
            missing.append(handle[1])
    return pprint.PrettyPrinter(indent=4).pformat(index), moved, missing


def env_hash(env: dict[str, Any]) -> str:
    """``vllm.config.utils.hash_factors`` of the environment factors (that function where vLLM
    is importable; the same formula otherwise: sha256 of the JSON with sorted keys)."""
    try:
        from vllm.config.utils import hash_factors
    except Exception:  # no vLLM here (the tuner's record is read on the service, tests)
        return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()
    return hash_factors(env)


def backbone_dir_name(env: str, config: str, code: str, compiler: str) -> str:
    """``torch_compile_cache/<name>``: vLLM's ``VllmBackend.__call__`` formula."""
    return hashlib.sha256(str([env, config, code, compiler]).encode()).hexdigest()[:10]


def aot_dir_name(env: str, config: str, extra: list[str], model_hash_key: str, extra_repr: list[str] | None = None) -> str:
    """``torch_compile_cache/torch_aot_compile/<name>``: vLLM's decorator formula,
    ``sha256(str(aot_compile_hash_factors(config) + [_model_hash_key(forward)]))``. ``extra_repr``:
    each factor past the config hash as ``repr()`` writes it (:attr:`CompileFactors.aot_extra_repr`),
    which ``str()`` of the list joins as they are; else ``extra``, taken as strings."""
    if extra_repr is None:
        return hashlib.sha256(str([env, config, *extra, model_hash_key]).encode()).hexdigest()
    text = "[" + ", ".join([repr(env), repr(config), *extra_repr, repr(model_hash_key)]) + "]"
    return hashlib.sha256(text.encode()).hexdigest()


def node_dir_names(node: CompileFactors) -> dict[str, str]:
    """The node's directory names as its own factors give them (``backbone``, ``aot``), for
    the harvest to check against the directories vLLM made."""
    names: dict[str, str] = {}
    e = env_hash(node.env)
    if node.code_hash and node.compiler_hash:
        names["backbone"] = backbone_dir_name(e, node.config_hash, node.code_hash, node.compiler_hash)
    if node.model_hash_key:
        names["aot"] = aot_dir_name(e, node.config_hash, node.aot_extra, node.model_hash_key, node.aot_extra_repr)
    return names


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def differences(node: CompileFactors, pod: PodCompileFactors) -> list[str]:
    """Every factor that makes the pod's vLLM compute other directory names than the node's
    (besides where the model lives), one line each; ``[]``: the cache will be found."""
    lines: list[str] = []
    if node.vllm_version != pod.vllm_version:
        lines.append(f"vLLM version: node {node.vllm_version}, pod {pod.vllm_version}")
    for name in sorted(set(node.env) | set(pod.env)):
        if name in PLACEMENT_ENV_FACTORS:  # the pod's own value names its directories
            continue
        mine, theirs = pod.env.get(name, "(unset)"), node.env.get(name, "(unset)")
        if mine != theirs:
            lines.append(f"environment {name}: node {_shown(theirs)}, pod {_shown(mine)}")
    if pod.config_hash_as_node != node.config_hash and node.variant_factors and pod.variant_factors:
        lines.extend(line for line in variant_differences(node.variant_factors, pod.variant_factors)
                     if line.startswith("vLLM config "))
    elif pod.config_hash_as_node != node.config_hash:
        named = [name for name in sorted(set(node.config_hashes) | set(pod.config_hashes_as_node))
                 if node.config_hashes.get(name) != pod.config_hashes_as_node.get(name)]
        lines.extend(f"vLLM config {name}: its hash differs (node {str(node.config_hashes.get(name))[:12]}, "
                     f"pod {str(pod.config_hashes_as_node.get(name))[:12]})" for name in named)
        if not named:
            lines.append(f"vLLM config hash: node {node.config_hash[:12]}, pod {pod.config_hash_as_node[:12]}")
    for path, digest in sorted(node.traced_files.items()):
        found = pod.traced_files.get(path)
        if found != digest:
            lines.append(f"traced source {path}: " + ("not on this pod (no module of this pod's packages has that "
                                                       "file)" if found is None else "its content differs"))
    return lines


def pod_dir_names(node: CompileFactors, pod: PodCompileFactors) -> dict[str, str]:
    """The node's directory names -> the names the pod's vLLM will look for, for a pod whose
    :func:`differences` are none. A directory whose name cannot be computed (a factor the
    node did not record) keeps the node's name only when the pod's hashes equal the node's."""
    e = env_hash(pod.env)
    renamed: dict[str, str] = {}
    same = pod.config_hash == node.config_hash and e == env_hash(node.env) and not pod.code_hash
    if node.backbone_dir:
        if node.code_hash and node.compiler_hash:
            renamed[node.backbone_dir] = backbone_dir_name(e, pod.config_hash, pod.code_hash or node.code_hash,
                                                           node.compiler_hash)
        elif same:
            renamed[node.backbone_dir] = node.backbone_dir
    if node.aot_dir:
        if node.model_hash_key:
            renamed[f"{AOT_DIR}/{node.aot_dir}"] = f"{AOT_DIR}/" + aot_dir_name(e, pod.config_hash, node.aot_extra,
                                                                                 node.model_hash_key,
                                                                                 node.aot_extra_repr)
        elif same:
            renamed[f"{AOT_DIR}/{node.aot_dir}"] = f"{AOT_DIR}/{node.aot_dir}"
    return renamed


def config_hashes(vllm_config: Any) -> dict[str, str]:
    """``compute_hash()`` of each sub-config of a ``VllmConfig`` (each dataclass field whose
    value has one), the parts ``VllmConfig.compute_hash`` is made of; named when they differ."""
    import dataclasses

    hashes: dict[str, str] = {}
    for field in dataclasses.fields(vllm_config):
        value = getattr(vllm_config, field.name, None)
        method = getattr(value, "compute_hash", None)
        if callable(method):
            try:
                hashes[field.name] = str(method())
            except Exception:  # a sub-config that cannot hash itself alone is left unnamed
                continue
    return hashes


@contextlib.contextmanager
def model_named(vllm_config: Any, model: str) -> Iterator[None]:
    """Within: ``vllm_config.model_config.model`` is ``model`` (the frozen dataclass's field set
    as vLLM's own ``__post_init__`` does); restored after."""
    model_config = vllm_config.model_config
    own = model_config.model
    object.__setattr__(model_config, "model", model)
    try:
        yield
    finally:
        object.__setattr__(model_config, "model", own)


def _short(value: Any) -> Any:
    text = json.dumps(value, sort_keys=True, default=str)
    return value if len(text) <= _FACTOR_SHOWN_MAX else {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def config_factors(vllm_config: Any) -> dict[str, dict[str, Any]]:
    """The fields each sub-config of a ``VllmConfig`` hashes, as its ``compute_hash()`` hands
    them to ``vllm.config.utils.hash_factors`` (caught on the way there, so vLLM's own ignored
    fields are left out), long values as their sha256 (:func:`_short`). A sub-config that
    hashes otherwise (or a vLLM without that function) has none."""
    import dataclasses

    try:
        from vllm.config import utils
    except Exception:
        return {}
    original = getattr(utils, "hash_factors", None)
    if original is None:
        return {}
    found: dict[str, dict[str, Any]] = {}
    seen: list[dict[str, Any]] = []

    def hash_factors(items: dict[str, Any]) -> str:
        if isinstance(items, dict):
            seen.append(items)
        return original(items)

    utils.hash_factors = hash_factors
    try:
        for field in dataclasses.fields(vllm_config):
            method = getattr(getattr(vllm_config, field.name, None), "compute_hash", None)
            if not callable(method):
                continue
            seen.clear()
            try:
                method()
            except Exception:
                continue
            if len(seen) == 1:
                found[field.name] = {name: _short(value) for name, value in seen[0].items()}
    finally:
        utils.hash_factors = original
    return found


def variant_factors(vllm_config: Any, env: dict[str, Any], vllm_version: str, served_model: str) -> VariantFactors:
    """The engine variant of a worker's ``VllmConfig`` (:class:`VariantFactors`): vLLM's
    ``compute_hash()`` of each sub-config (:func:`config_hashes`) and their fields
    (:func:`config_factors`), or, in a release without them (0.34), each sub-config's part of
    ``VllmConfig.compile_factors()`` field by field
    (:func:`tunecache.engines.vllm.aot.config_factor_groups`), with ``ModelConfig.model`` set to
    ``served_model`` (the key's model), ``env`` (``vllm.envs.compile_factors()``) as a variant counts it
    (:func:`tunecache.engines.vllm.placement.variant_env`: without the placement factors).
    The tuner's engine and the pod's vLLM plugin both call it in the worker."""
    with model_named(vllm_config, served_model):
        if callable(getattr(vllm_config, "compile_factors", None)):  # 0.34: compute_hash() is gone
            hashes, factors = config_factor_groups(vllm_config.compile_factors())
        else:
            hashes, factors = config_hashes(vllm_config), config_factors(vllm_config)
    return VariantFactors(vllm_version=vllm_version, env=json.loads(json.dumps(variant_env(env), default=str)),
                          config_hashes=hashes, config_factors=json.loads(json.dumps(factors, default=str)))


def file_digests(paths: list[str] | set[str]) -> dict[str, str | None]:
    """sha256 of each file's bytes (``None``: it cannot be read)."""
    digests: dict[str, str | None] = {}
    for path in sorted(paths):
        try:
            with open(path, "rb") as f:
                digests[path] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digests[path] = None
    return digests


def code_hash(paths: list[str] | set[str]) -> str:
    """The code hash vLLM computes over the traced source files (``VllmBackend.__call__`` in
    ``vllm/compilation/backends.py``, written inline there, so again here): sha256 of each
    file's path and text, joined by newlines, in path order, ``<string>`` left out."""
    content: list[str] = []
    for path in sorted(paths):
        if path == "<string>":
            continue
        content.append(path)
        try:
            with open(path) as f:
                content.append(f.read())
        except (OSError, UnicodeDecodeError):
            continue
    return hashlib.sha256("\n".join(content).encode()).hexdigest()


def locate_here(path: str) -> str | None:
    """Where this pod has the source file that was ``path`` on the tuning node: the same file
    under the directory this process imports the enclosing top-level package from, as vLLM
    will trace it here (``inspect.getfile`` of the module: ``decorators.py::
    _verify_source_unchanged``). The components of ``path`` are tried as top-level packages,
    those this process imported already first (their ``__path__``; vLLM, torch and
    transformers in a worker), then any ``importlib.util.find_spec`` finds; ``path`` itself
    when no package has the file. ``None``: no such file here. Only where to look is chosen
    here; the caller compares the file's bytes with the node's digest."""
    parts = PurePosixPath(path).parts
    names = [(i, name) for i, name in enumerate(parts[1:-1], 1) if name.isidentifier()]

    def under(i: int, locations: list[str]) -> str | None:
        for location in locations:
            candidate = Path(location, *parts[i + 1:])
            if candidate.is_file():
                return str(candidate)
        return None

    for i, name in names:
        found = under(i, list(getattr(sys.modules.get(name), "__path__", None) or []))
        if found:
            return found
    for i, name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        found = under(i, list(spec.submodule_search_locations or []) if spec else [])
        if found:
            return found
    return path if Path(path).is_file() else None


def traced_files_here(traced: dict[str, str]) -> tuple[dict[str, str | None], dict[str, str], str | None]:
    """The node's traced files (path -> sha256) as this pod has them: the digest of each file
    where :func:`locate_here` finds it (``None``: missing), the node paths found elsewhere ->
    this pod's paths, and the code hash this pod's vLLM will compute over its own paths when
    some path differs and every file has the node's bytes (``None`` otherwise)."""
    here = {path: locate_here(path) for path in traced}
    digests = {path: (file_digests([found])[found] if found else None) for path, found in here.items()}
    moved = {path: found for path, found in here.items() if found and found != path}
    same = all(digests[path] == digest for path, digest in traced.items())
    own = code_hash([found for found in here.values() if found]) if moved and same else None
    return digests, moved, own
