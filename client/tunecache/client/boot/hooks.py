"""The vLLM plugin's hooks: each wraps one vLLM function and calls one phase of the boot
(:mod:`tunecache.client.boot` lists them in order): ``EngineArgs.create_engine_config`` (the
main process's warm state, :mod:`~tunecache.client.boot.main_process`), the worker's
``load_model`` and ``determine_available_memory`` (what the main process staged,
:mod:`~tunecache.client.boot.staged`), ``kernel_warmup`` and ``flashinfer_autotune`` (the tactics
once per pod, :mod:`~tunecache.client.boot.coordination`) and ``compile_or_warm_up_model`` (the
attestation, then the held reports, :mod:`~tunecache.client.boot.reporting`).

Registered in the ``vllm.general_plugins`` entry-point group, which vLLM loads in every
worker process (``vllm/plugins/__init__.py::load_general_plugins``, called from
``WorkerWrapperBase.init_worker`` before the worker class ``vllm.v1.worker.gpu_worker`` is
imported). With ``TUNECACHE_URL`` set, :func:`register` wraps vLLM's (0.25 to 0.33)
``vllm.model_executor.warmup.kernel_warmup.kernel_warmup(worker)`` (and re-binds that name
in any module that imported it already), which ``Worker.compile_or_warm_up_model`` calls and
which runs, in order, DeepGEMM warmup, ``flashinfer_autotune(runner)`` and FlashInfer's
attention warmup; ``flashinfer_autotune`` is wrapped too, as a fallback. The install runs
once per worker process, in whichever hook comes first, so before DeepGEMM warmup:

* **One lookup per pod boot** (:mod:`tunecache.client.boot.coordination`). The workers of one engine
  (vLLM's world group: ``pp * tp`` processes) share ``vllm_config.instance_id`` (the parent
  process when it is absent). Under an exclusive lock on ``<root>/.tunecache/<hash>.lock``
  (``<root>`` and ``<hash>`` from vLLM's ``flashinfer_autotune_root()`` and
  ``flashinfer_autotune_cache_hash(runner)``), the first worker of the boot looks up the
  current tuning for the pod's key (GPU, model, max_num_batched_tokens, parallelism) and its
  FlashInfer environment, fetches and verifies it within the install deadline
  (``TUNECACHE_INSTALL_DEADLINE``, counted from its hook), installs it for every rank and
  records the outcome (installed, miss or error; the run; the file's sha256) for its
  instance in ``<root>/.tunecache/<hash>.json``. The other workers wait for the lock (never
  longer than the install deadline plus ``tunecache.client.boot.coordination.INSTALL_WAIT_MARGIN_S``),
  read that record and look nothing up: every worker of the pod gets the same run, or the
  same miss or error. A record of another instance (an earlier boot on a persistent volume)
  means a fresh lookup.
* **Each release's layout.** The releases tunecache knows, 0.25 to 0.34, each with its
  autotune layout, are :mod:`tunecache.engines.vllm.releases`'s (an unknown one: one line, and
  vLLM boots as without tunecache). vLLM 0.33 and 0.34 read one v1 file per rank,
  ``<root>/<hash>/autotune_configs_dp{dp}_rank{rank}.json``; 0.32 the same names beside
  ``resolve_flashinfer_autotune_file``'s; 0.27 to 0.31 that one ``autotune_configs.json``, rank 0
  reading it for all; 0.25 and 0.26 (0.25 pins torch 2.11 and FlashInfer 0.6.13) that file in a
  single-process engine only, tuning every rank of a larger one itself: there the plugin says
  so and installs nothing (:meth:`VllmWorker.pod`).
* **The served model.** The key's model is vLLM's ``served_model_name`` (``model`` when
  none is given), so a pod loading weights from a directory asks for the model it serves.
* **All ranks or none.** The run's bytes become every rank's v1 file at once
  (:func:`tunecache.client.install.install`, through
  :func:`tunecache.client.layouts.install_vllm_rank_files`: staged, then the whole
  ``<hash>`` directory renamed into place), so a full disk or any failure leaves no partial
  rank set; or FlashInfer's v2 store when vLLM uses it (``use_flashinfer_autotune_v2()``:
  single rank). Each other worker checks that its own rank file holds the recorded bytes.
* **Before DeepGEMM warmup.** The run's FlashInfer JIT modules go into the FlashInfer
  workspace, as its own FlashInfer names it, and every worker's FlashInfer loads them from
  there through its AOT path, without ninja, whatever this pod's HOME, workspace, package
  prefix or CUDA directory (:func:`tunecache.client.jit_install.build_aot_dir`; modules built
  for another FlashInfer version, arch or CUDA version are skipped; ``TUNECACHE_JIT=0`` turns
  that off), and a
  DeepGEMM JIT cache, when the run has one, has its kernels merged into this pod's DeepGEMM
  cache directory (``DG_JIT_CACHE_DIR``, else vLLM's ``$VLLM_CACHE_ROOT/deep_gemm``:
  :func:`tunecache.engines.vllm.paths.deep_gemm_cache_dir`), which every worker then sets as
  ``DG_JIT_CACHE_DIR`` in its own process before DeepGEMM reads it.

vLLM then loads the files and skips tuning; on a miss it tunes as it always does. Each
worker logs one line: what it installed, what the pod's first worker installed or found, or
why nothing was installed. Each worker also reports its own outcome to the server
(:mod:`tunecache.client.report`: in the background, one attempt within
``TUNECACHE_REPORT_TIMEOUT``, never delaying the boot; ``TUNECACHE_REPORT=0`` turns it off):
the first worker's report says what its lookup found (``looked_up``) and how long the pod's
install took; each other worker's, for the key and environment the first recorded, whether
its own rank file holds the run (its seconds: its wait for the first worker and its check). Nothing here ever raises into vLLM; on any failure vLLM boots as
without tunecache. With ``TUNECACHE_PUSH_BACK=1``, after a miss, rank 0 uploads its locally
tuned rank file as a ``pod`` run (stored unverified; never made current). On a release whose
``vllm preload`` takes warmup-cache stores (0.34), :func:`register` also makes tunecache one
(:func:`tunecache.client.preload_store.register_store`).

Settings: :class:`tunecache.client.settings.ClientSettings` (``TUNECACHE_URL``,
``TUNECACHE_DTYPE`` / ``TUNECACHE_QUANTIZATION`` for the key, ``TUNECACHE_JIT``,
``TUNECACHE_PUSH_BACK``, ``TUNECACHE_ENVIRONMENT_FILE``, the token, timeouts and attempts,
the install deadline), read once per worker when its install runs.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from tunecache.client.boot.engine import (VllmWorker, config_key, cuda_answered_by_nvml, engine_args_key, engine_args_of,
                                         main_process_environment, pod_compile_factors)
from tunecache.engines import engine_for

if TYPE_CHECKING:  # the pod's settings, imported only where it is booted (not with the plugin)
    from tunecache.client.boot.coordination import PodInstall
    from tunecache.client.boot.main_process import WarmBoot
    from tunecache.client.boot.staged import VariantFetch
    from tunecache.client.settings import ClientSettings
    from tunecache.engines.vllm.objects import CompiledModel, EngineArgs, GpuWorker, Hooked, ModelRunner, VllmConfig
    from tunecache.engines.vllm.releases import VllmRelease

#: Under vLLM's own ``vllm`` logger, whose handler vLLM configures (``vllm/logger.py``:
#: ``DEFAULT_LOGGING_CONFIG``, ``propagate: False``; the root logger has none), so the
#: plugin's lines appear in vLLM's log, in its format, at ``VLLM_LOGGING_LEVEL``.
log = logging.getLogger("vllm.plugins.tunecache")

#: This process's install (:class:`tunecache.client.boot.coordination.PodInstall`, ``False``: none), once it ran.
_installed: PodInstall | bool | None = None
#: The vLLM release of this process (:class:`tunecache.engines.vllm.releases.VllmRelease`), set by :func:`register`.
_release: VllmRelease | None = None
_pushed_back = False
#: The engine this plugin hooks, as its adaptor tells it.
VLLM = engine_for("vllm")


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group (``load_general_plugins`` calls it
    in every worker). With ``TUNECACHE_URL`` set, hooks vLLM 0.33's ``kernel_warmup``; an
    other vLLM layout is logged and vLLM boots as without tunecache. Never raises."""
    settings = _settings_safely()
    if settings is None or not settings.url:
        return
    global _release
    try:
        version, _release = VLLM.this_release()
    except Exception as exc:  # no vLLM to ask: nothing to hook either
        log.warning("tunecache: not installing tunings: %s: %s", type(exc).__name__, exc)
        return
    if _release is None:
        log.warning("tunecache: vLLM %s is not a release tunecache knows (%s): nothing is installed, vLLM boots as "
                    "without tunecache", version or "(no version)", VLLM.known_range())
        return
    from tunecache.client.attestation import mark_boot_started
    from tunecache.client.report import boot_id

    mark_boot_started()
    boot_id()  # made here (vLLM's main process loads plugins before it starts its workers): every rank inherits it
    try:
        _wrap_warmup()
    except Exception as exc:  # another vLLM layout than 0.33's: vLLM boots as without tunecache
        log.warning("tunecache: not installing tunings: cannot hook vLLM's kernel_warmup (%s: %s)", type(exc).__name__, exc)
    try:  # vllm preload's warmup-cache stores (0.34): tunecache is one
        from tunecache.client.preload_store import register_store

        register_store(_release)
    except Exception as exc:
        log.warning("tunecache: not a warmup-cache store of vllm preload (%s: %s)", type(exc).__name__, exc)
    if settings.jit:
        try:
            _wrap_engine_config()
            _wrap_worker_compile()
        except Exception as exc:
            log.warning("tunecache: not installing the warm state: cannot hook vLLM's create_engine_config or its "
                        "worker (%s: %s)", type(exc).__name__, exc)


def _target(role: str) -> tuple[ModuleType, object, str]:
    """Where the plugin wraps ``role`` in this process's vLLM, as its adaptor names it
    (:meth:`tunecache.engines.vllm.adaptor.VllmAdaptor.hook_targets`): the module, the object
    that holds the function (the module, or the class of a method) and the function's name.

    Raises:
        ImportError, AttributeError: this vLLM has no such module or class."""
    import importlib

    target = VLLM.hook_target(_release, role)
    module = importlib.import_module(target.module)
    *owner, name = target.qualname.split(".")
    holder = module
    for part in owner:
        holder = getattr(holder, part)
    return module, holder, name


def _wrap_worker_compile() -> None:
    """Wrap ``vllm.v1.worker.gpu_worker.Worker.determine_available_memory``, whose profiling
    run is the worker's first forward pass, where vLLM's torch.compile loads or compiles:
    the compile cache the main process staged is installed just before it
    (:func:`tunecache.client.boot.staged.install_staged_compile_cache`); and ``load_model``, before
    which the worker's FlashInfer is pointed at the AOT directory of the run's JIT modules
    (:func:`tunecache.client.boot.staged.use_staged_aot_dir`). A vLLM without them: nothing."""
    import functools

    _, worker_class, name = _target("first_forward")
    original = getattr(worker_class, name, None)
    if original is None or getattr(original, "_tunecache_wrapped", False):
        return

    @functools.wraps(original)
    def determine_available_memory(self: GpuWorker, *args: object, **kwargs: object) -> object:
        from tunecache.client.boot.staged import use_staged_aot_dir

        use_staged_aot_dir()  # a vLLM whose worker has no load_model to wrap
        if _release is not None and _release.aot_artifact:
            from tunecache.client.startup_plan import place_startup_plan

            place_startup_plan(self)  # before vLLM's maybe_apply_startup_plan, its first call
            _wrap_aot_load()  # 0.33/0.34: placed where vLLM's compiled model is about to load it
        else:
            _install_compile_cache(self)
        return original(self, *args, **kwargs)

    determine_available_memory._tunecache_wrapped = True  # type: ignore[attr-defined]
    setattr(worker_class, name, determine_available_memory)
    _, worker_class, name = _target("load_model")
    load_model = getattr(worker_class, name, None)
    if load_model is not None and not getattr(load_model, "_tunecache_wrapped", False):
        from tunecache.client.boot.staged import use_staged_aot_dir

        @functools.wraps(load_model)
        def load_model_after_aot_dir(self: GpuWorker, *args: object, **kwargs: object) -> object:
            use_staged_aot_dir()  # before the model (and any FlashInfer module) loads
            return load_model(self, *args, **kwargs)

        load_model_after_aot_dir._tunecache_wrapped = True  # type: ignore[attr-defined]
        setattr(worker_class, name, load_model_after_aot_dir)
    _, worker_class, name = _target("warm_up")
    warm_up = getattr(worker_class, name, None)
    if warm_up is not None:
        from tunecache.client.boot.reporting import hold_reports

        @functools.wraps(warm_up)
        def compile_or_warm_up_model(self: GpuWorker, *args: object, **kwargs: object) -> object:
            try:
                return warm_up(self, *args, **kwargs)
            finally:
                _attest(self)

        compile_or_warm_up_model._tunecache_wrapped = True  # type: ignore[attr-defined]
        setattr(worker_class, name, compile_or_warm_up_model)
        hold_reports()


def _wrap_aot_load() -> None:
    """Wrap vLLM 0.33/0.34's ``vllm.compilation.decorators._try_load_aot_compiled_fn(model, path)``
    (the adaptor's ``aot_load`` hook target), which the compiled model's ``__call__`` looks up
    by its global name with the exact path it is about to load: the run's artifact for this
    rank is placed there first (:func:`tunecache.client.boot.aot.before_aot_load`). Never raises."""
    import functools

    try:
        _module, decorators, name = _target("aot_load")
    except Exception as exc:
        log.warning("tunecache: compile cache not installed: cannot hook vLLM's AOT load (%s: %s)", type(exc).__name__, exc)
        return
    original = getattr(decorators, name, None)
    if original is None or getattr(original, "_tunecache_wrapped", False):
        return

    @functools.wraps(original)
    def _try_load_aot_compiled_fn(model: CompiledModel, aot_compilation_path: str, *args: object, **kwargs: object) -> object:
        from tunecache.client.boot.aot import before_aot_load

        before_aot_load(model, aot_compilation_path, _variant_fetch(getattr(model, "vllm_config", None)))
        return original(model, aot_compilation_path, *args, **kwargs)

    _try_load_aot_compiled_fn._tunecache_wrapped = True  # type: ignore[attr-defined]
    setattr(decorators, name, _try_load_aot_compiled_fn)


def _attest(worker: GpuWorker) -> threading.Thread | None:
    """Once the worker warmed up: read what vLLM and FlashInfer counted (quick), then, off the
    boot's critical path, count the files the boot wrote before now, log what it still
    compiled and send its install report with it (:mod:`tunecache.client.attestation`). The
    count runs on a thread of its own (not a daemon: the process waits for it at exit), so the
    worker returns to vLLM at once. Never raises."""
    try:
        import time

        from tunecache.client.attestation import in_process_counts

        counted, until = in_process_counts(), time.time_ns()
        rank = getattr(getattr(getattr(worker, "vllm_config", None), "parallel_config", None), "rank", 0)
        thread = threading.Thread(target=_finish_attestation, args=(counted, until, rank), name="tunecache-attestation")
        thread.start()
        return thread
    except Exception as exc:
        log.warning("tunecache: boot not attested: %s: %s", type(exc).__name__, exc)
        return None


def _finish_attestation(counted: dict, until_ns: int, rank: object) -> None:
    """The attestation's file count and what follows it (see :func:`_attest`). Never raises."""
    try:
        from tunecache.client.attestation import boot_files
        from tunecache.client.boot.reporting import send_held_reports
        from tunecache.contract import compiled_summary

        counts = {**boot_files(until_ns), **counted}
        log.info("tunecache: this boot compiled %s (rank %s)%s", compiled_summary(counts), rank,
                 "" if any(counts.values()) else ": at the floor")
        send_held_reports({kind.value: n for kind, n in counts.items()})
    except Exception as exc:
        log.warning("tunecache: boot not attested: %s: %s", type(exc).__name__, exc)


def _variant_fetch(config: VllmConfig | None) -> VariantFetch:
    """Fetches this engine variant's own compile cache for a worker of ``config`` (its key from
    the config), when the staged run is another variant's
    (:func:`tunecache.client.boot.staged.fetch_variant_compile_cache`)."""
    def fetch_variant(variant: str):
        from tunecache.client.boot.coordination import pod_environment
        from tunecache.client.boot.staged import fetch_variant_compile_cache

        settings = _settings_safely()
        if settings is None or config is None:
            return None
        environment = pod_environment(settings)
        return fetch_variant_compile_cache(settings, config_key(config, environment, settings), environment, variant)

    return fetch_variant


def _install_compile_cache(worker: GpuWorker) -> None:
    """This worker's install of the staged compile cache, from its own ``VllmConfig``. Never raises."""
    if _release is not None and not _release.compile_cache:
        return  # the main process staged none, and said why
    try:
        from tunecache.client.boot.staged import install_staged_compile_cache

        config = worker.vllm_config
        install_staged_compile_cache(lambda node: pod_compile_factors(config, node),
                                     int(getattr(config.parallel_config, "rank", 0)), _variant_fetch(config))
    except Exception as exc:
        log.warning("tunecache: compile cache not installed: %s: %s", type(exc).__name__, exc)


def _wrap_engine_config() -> None:
    """Wrap ``vllm.engine.arg_utils.EngineArgs.create_engine_config``, which the engine's main
    process calls once (``LLM(...)``, ``vllm serve``) before it inspects the model and long
    before the engine core compiles: the boot's warm state is installed around it
    (:class:`tunecache.client.boot.main_process.WarmBoot`). Workers never call it."""
    import functools

    _, engine_args_class, name = _target("engine_config")
    original = getattr(engine_args_class, name)
    if getattr(original, "_tunecache_wrapped", False):
        return

    @functools.wraps(original)
    def create_engine_config(self: EngineArgs, *args: object, **kwargs: object) -> object:
        with cuda_answered_by_nvml():
            boot = _warm_boot_before(self)
        config = original(self, *args, **kwargs)
        if boot is not None and boot.key is None:
            with cuda_answered_by_nvml():
                _warm_boot_after(boot, config)
        return config

    create_engine_config._tunecache_wrapped = True  # type: ignore[attr-defined]
    setattr(engine_args_class, name, create_engine_config)


def _warm_boot_before(engine_args: EngineArgs) -> WarmBoot | None:
    """The boot's :class:`~tunecache.client.boot.main_process.WarmBoot`, its warm state (but the compile
    cache) installed when ``engine_args`` give the whole key (``max_num_batched_tokens``
    set); ``None`` when it cannot run here. Never raises."""
    try:
        from tunecache.client.boot.handoff import Handoff
        from tunecache.client.boot.main_process import WarmBoot

        settings = _settings_safely()
        if settings is None or Handoff.from_environment().warm_state_run:
            return None
        _note_engine_args(engine_args)
        key = environment = None
        if getattr(engine_args, "max_num_batched_tokens", None):
            environment = main_process_environment(settings)
            key = engine_args_key(engine_args, environment, settings)
        return WarmBoot.before(settings, key, environment,
                               no_compile_cache=_release.not_supported if _release and not _release.compile_cache else None)
    except Exception as exc:
        log.warning("tunecache: no warm state installed: %s: %s", type(exc).__name__, exc)
        return None


def _note_engine_args(engine_args: EngineArgs) -> None:
    """Hand the pod's variant engine arguments (:func:`tunecache.client.boot.engine.engine_args_of`) to
    the workers vLLM starts (:attr:`tunecache.client.boot.handoff.Handoff.engine_args`), for their
    reports. Never raises."""
    from tunecache.client.boot.handoff import Handoff

    try:
        Handoff(engine_args=engine_args_of(engine_args)).hand_over()
    except Exception as exc:
        log.debug("tunecache: engine arguments not noted: %s: %s", type(exc).__name__, exc)


def _warm_boot_after(boot: WarmBoot, config: VllmConfig) -> None:
    """``boot`` with the key from vLLM's config, when ``EngineArgs`` did not give it. Never raises."""
    try:
        environment = main_process_environment(boot.settings)
        boot.after(config_key(config, environment, boot.settings), environment)
    except Exception as exc:
        log.warning("tunecache: no warm state installed: %s: %s", type(exc).__name__, exc)


def _wrap_warmup() -> None:
    """Wrap ``kernel_warmup.kernel_warmup`` (the earliest warmup step, before DeepGEMM's) and
    ``kernel_warmup.flashinfer_autotune`` (fallback, and push-back after vLLM tuned)."""
    import functools

    module, _, autotune_name = _target("flashinfer_autotune")
    if getattr(module, "_tunecache_wrapped", False):
        return
    original_autotune = getattr(module, autotune_name)  # AttributeError: another vLLM layout
    warmup_module, _, warmup_name = _target("kernel_warmup")
    original_warmup = getattr(warmup_module, warmup_name, None)

    @functools.wraps(original_autotune)
    def flashinfer_autotune(runner: ModelRunner, *args: object, **kwargs: object) -> object:
        installed = _install_once(runner)
        result = original_autotune(runner, *args, **kwargs)
        _push_back_once(runner, installed)
        return result

    setattr(module, autotune_name, flashinfer_autotune)
    if callable(original_warmup):

        @functools.wraps(original_warmup)
        def kernel_warmup(worker: GpuWorker, *args: object, **kwargs: object) -> object:
            runner = getattr(worker, "model_runner", None)
            if runner is not None:
                _install_once(runner)
            return original_warmup(worker, *args, **kwargs)

        setattr(warmup_module, warmup_name, kernel_warmup)
        _rebind(original_warmup, kernel_warmup)
    module._tunecache_wrapped = True


def _rebind(original: Hooked, replacement: Hooked) -> None:
    """Point every already-imported ``vllm`` module's global that holds ``original`` (e.g.
    ``vllm.v1.worker.gpu_worker.kernel_warmup``, bound by its ``from ... import``) at
    ``replacement``."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "vllm" or name.startswith("vllm.")):
            continue
        namespace = getattr(module, "__dict__", {})
        for attribute, value in list(namespace.items()):
            if value is original:
                setattr(module, attribute, replacement)


def _install_once(runner: ModelRunner) -> PodInstall | bool:
    """This process's install (:func:`tunecache.client.boot.coordination.install_for_pod`, a
    :class:`~tunecache.client.boot.coordination.PodInstall`), run on the first call (from whichever hook
    comes first); ``False`` when none ran (invalid settings or tunecache's own modules
    cannot load here: logged). Never raises."""
    global _installed
    if _installed is None:
        settings = _settings_safely()
        _installed = False
        if settings is not None:
            try:
                from tunecache.client.boot.coordination import install_for_pod
            except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
                log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
            else:
                _installed = install_for_pod(VllmWorker(runner, settings, _release), settings)
    return _installed


def _push_back_once(runner: ModelRunner, installed: PodInstall | bool) -> None:
    """After vLLM's own tuning on a miss: rank 0 pushes its rank file back, once."""
    global _pushed_back
    if not installed or _pushed_back or installed.outcome != "miss" or installed.rank != 0 or not installed.settings.push_back:
        return
    _pushed_back = True
    _push_back_safely(runner, installed.settings)


def _settings_safely():
    """This worker's :class:`ClientSettings`, or ``None`` (logged) when a variable is invalid."""
    from tunecache.client.settings import load_client_settings

    try:
        return load_client_settings()
    except ValueError as exc:
        log.warning("tunecache: no tuning installed, vLLM will tune: %s", exc)
        return None


def _push_back_safely(runner: ModelRunner, settings: ClientSettings) -> None:
    """Upload this worker's locally tuned rank file (vLLM wrote it after tuning on a miss) as an
    unverified ``pod`` run. Never raises."""
    from tunecache.client.autotune_file import pushed_run
    from tunecache.formats.autotune_file import parse_autotune_file
    from tunecache.store.http import TunecacheClient

    try:
        worker = VllmWorker(runner, settings, _release)
        path = worker.pod().rank_file
        data = path.read_bytes()
        parsed = parse_autotune_file(data, source=str(path))
        key = worker.key(parsed.environment)
        with TunecacheClient.from_settings(settings) as client:
            stored = client.upload_artifact(data)
            run = client.record_run(pushed_run(key, parsed, stored.sha256, "pod", socket.gethostname()))
        log.info("tunecache: pushed this pod's tuning back as unverified run %s", run.id)
    except Exception as exc:
        log.warning("tunecache: push-back failed: %s: %s", type(exc).__name__, exc)
