"""vLLM's environment factors that say where things are on a machine, not how a model compiles.

vLLM hashes ``vllm.envs.compile_factors()`` (every variable of ``vllm.envs.environment_variables``
but those its ``ignored_factors`` lists) into both names of its compile-cache directories
(:mod:`tunecache.engines.vllm.compile_cache`). A variable whose default derives from ``HOME``, the
user, the temporary directory or a path differs between a tuning node and a pod that differ
only in where things are, so where vLLM hashes one, every such pod computed other names and
compiled everything again, silently. These are all such variables of the releases tunecache
knows, read from each release's own ``vllm/envs.py`` (the wheels of 0.25.0, 0.26.0, 0.27.1,
0.28.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0 and 0.34.0):

======================== ======================================================= ===============
variable                 default                                                 hashed in
======================== ======================================================= ===============
VLLM_CONFIG_ROOT         ``$XDG_CONFIG_HOME/vllm``, else ``~/.config/vllm``      0.25, 0.26
VLLM_XLA_CACHE_PATH      ``$XDG_CACHE_HOME/vllm/xla_cache``, else under ``~``    0.25, 0.26
VLLM_RUST_FRONTEND_PATH  ``<vLLM's package directory>/vllm-rs`` where            0.25-0.34
                         ``VLLM_USE_RUST_FRONTEND=1`` (or, from 0.27,
                         ``VLLM_USE_RUST_BENCH=1``), else ``None``
VLLM_CACHE_ROOT          ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``        never
VLLM_ASSETS_CACHE        ``$XDG_CACHE_HOME/vllm/assets``, else under ``~``       never
VLLM_RPC_BASE_PATH       ``tempfile.gettempdir()``                               never
======================== ======================================================= ===============

vLLM 0.27 added ``VLLM_CONFIG_ROOT`` and ``VLLM_XLA_CACHE_PATH`` to ``ignored_factors``
(vllm#47573). ``VLLM_RPC_BASE_PATH`` is in ``ignored_factors`` in every one of these releases:
it never made a pod miss. ``VLLM_RUST_FRONTEND_PATH`` is hashed in all of them, so a pod with
vLLM's Rust frontend on and its packages under another prefix (another image, a virtual
environment) computed other names on every release. ``tests/contract/test_vllm_placement.py``
derives the table again from each release's ``envs.py`` (which defaults derive from where
things are, which are not ignored), so a new such variable fails it until it is listed here.

Variables the operator sets to a path, with no default (``CUDA_HOME``, ``VLLM_NCCL_SO_PATH``,
...), are no placement factors: what they point at can change what compiles, so a pod that
sets them otherwise is named as differing.

Pure: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlacementFactor:
    """One vLLM environment variable whose default is where something is."""

    default: str
    """What vLLM's default derives from."""
    hashed_in: tuple[tuple[int, int], ...]
    """The minor releases whose ``compile_factors()`` hash it (not in ``ignored_factors``)."""
    why: str
    """Why it cannot change the compiled graph (for a hashed one)."""


_THROUGH_0_26 = ((0, 25), (0, 26))
_ALL = tuple((0, minor) for minor in range(25, 35))

#: Every variable of the releases tunecache knows whose default derives from HOME, the user,
#: the temporary directory or a path (see the module's table).
PLACEMENT_FACTORS: dict[str, PlacementFactor] = {
    "VLLM_CONFIG_ROOT": PlacementFactor(
        "XDG_CONFIG_HOME or HOME", _THROUGH_0_26, "where vLLM reads its own config files (default ~/.config/vllm)"),
    "VLLM_XLA_CACHE_PATH": PlacementFactor(
        "XDG_CACHE_HOME or HOME", _THROUGH_0_26,
        "the TPU (XLA) compile cache (default ~/.cache/vllm/xla_cache), never read on CUDA"),
    "VLLM_RUST_FRONTEND_PATH": PlacementFactor(
        "vLLM's package directory", _ALL,
        "where the binary of vLLM's Rust API frontend is (default <vLLM's package directory>/vllm-rs), a "
        "process apart from the engine; whether the frontend is on is VLLM_USE_RUST_FRONTEND, hashed on its own"),
    "VLLM_CACHE_ROOT": PlacementFactor("XDG_CACHE_HOME or HOME", (), ""),
    "VLLM_ASSETS_CACHE": PlacementFactor("XDG_CACHE_HOME or HOME", (), ""),
    "VLLM_RPC_BASE_PATH": PlacementFactor("the temporary directory", (), ""),
}

#: The placement factors some release hashes -> why each cannot change the compiled graph. A
#: pod whose values differ from the node's gets the compile cache under the names its own values
#: give (:func:`tunecache.engines.vllm.compile_cache.pod_dir_names`); they are no part of an engine
#: variant (:func:`variant_env`).
PLACEMENT_ENV_FACTORS: dict[str, str] = {name: f.why for name, f in PLACEMENT_FACTORS.items() if f.hashed_in}


def variant_env(env: dict[str, Any]) -> dict[str, Any]:
    """``vllm.envs.compile_factors()`` as an engine variant counts it: each placement factor
    that names a place left out; one that is ``None`` (``VLLM_RUST_FRONTEND_PATH`` with the
    Rust frontend off) stays as vLLM hashes it, which keeps the variant ids of engines without
    that place those that tunecache computed before it listed the variable."""
    return {name: value for name, value in env.items() if name not in PLACEMENT_ENV_FACTORS or value is None}
