"""The formats both sides of tunecache read and write, pure: FlashInfer's v1 autotune file
(:mod:`~tunecache.formats.autotune_file`) and its entry keys
(:mod:`~tunecache.formats.file_key`), a FlashInfer JIT module's tarball
(:mod:`~tunecache.formats.jit_module`) and GPU arch names (:mod:`~tunecache.formats.arch`).
What an engine names (vLLM's compile-cache directories among it) is its adaptor's
(:mod:`tunecache.engines`).

The tuner (``tunecache.service``) writes them, the service reads them, a pod
(``tunecache.client``) reads and installs them. Nothing here does I/O beyond the bytes it is
given, speaks HTTP or knows a pod's workspace: it imports the standard library, pydantic and
:mod:`tunecache.contract` only (FlashInfer and vLLM lazily, inside the functions that ask them).
"""
