"""One pod boot of a vLLM engine, as one pipeline: the vLLM plugin's.

vLLM loads the plugin (:func:`tunecache.client.boot.hooks.register`, the ``tunecache`` entry
point of the ``vllm.general_plugins`` group) in the engine's main process and again in each
worker it starts. The hooks it sets (:mod:`~tunecache.client.boot.hooks`) run the boot's
phases in the order vLLM reaches them:

1. **main process**, in ``EngineArgs.create_engine_config``, before vLLM inspects the model:
   the run's warm state installed, its compile cache staged
   (:mod:`~tunecache.client.boot.main_process`);
2. **each worker**, in ``load_model`` and ``determine_available_memory``: FlashInfer pointed at
   the staged JIT modules, the compile cache put under the names the worker's own config gives,
   or its engine variant's fetched (:mod:`~tunecache.client.boot.staged`);
3. **each worker**, in ``kernel_warmup`` (or ``flashinfer_autotune``): the tactics installed
   once for the whole pod, every rank alike (:mod:`~tunecache.client.boot.coordination`);
4. **each worker**, after ``compile_or_warm_up_model``: what the boot still compiled counted
   off the critical path (:mod:`tunecache.client.attestation`), and the install reports sent
   with it (:mod:`~tunecache.client.boot.reporting`).

What vLLM tells about the engine (its key, each worker's place, compile factors, engine
variant) is read by :mod:`~tunecache.client.boot.engine`; the main process hands its results to
the workers in the environment they inherit, as one typed record
(:mod:`~tunecache.client.boot.handoff`). Each phase logs one line under vLLM's logger and never
raises into vLLM: on any failure vLLM boots as it would without tunecache.
"""
