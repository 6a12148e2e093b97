"""The GPU tuner: runs FlashInfer's autotuner for a key in a child process.

* :mod:`.model_config`: GEMM shapes from a Hugging Face ``config.json``.
* :mod:`.stages`: the warmup/autotune stages (each one unit; more slot in beside).
* :mod:`.child`: the child process that imports torch/FlashInfer and runs the stages.
* :mod:`.runner`: the parent side: start the child, stream progress, enforce a timeout.
"""
