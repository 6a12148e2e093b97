"""vLLM behind tunecache's engine adaptor (:class:`tunecache.engines.vllm.adaptor.VllmAdaptor`):
its releases (:mod:`~tunecache.engines.vllm.releases`), where it keeps what tunecache installs
(:mod:`~tunecache.engines.vllm.paths`) and the names of its compile cache
(:mod:`~tunecache.engines.vllm.compile_cache`)."""
