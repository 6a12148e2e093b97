"""The GPU tuner: runs FlashInfer's autotuner for a key in a child process.

* :mod:`.model_config`: GEMM shapes from a Hugging Face ``config.json``.
* :mod:`.stages`: the warmup/autotune stages (each one unit; more slot in beside).
* :mod:`.child`: the child process that imports torch/FlashInfer and runs the stages.
* :mod:`.process`: the parent side: start the child, stream progress, enforce a timeout.
* :mod:`.vllm_warmup`: the ``vllm`` warmup: vLLM's own ``kernel_warmup``, its caches harvested.
"""
