"""Where the test data is: the checkout and tests/fixtures/ (real FlashInfer files written on
an H200, Hugging Face model configs)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
H200_FILES = FIXTURES / "flashinfer-0.7.4-h200"
CUDNN_FILE = H200_FILES / "mm_bf16-cudnn.json"
CUBLASLT_FILE = H200_FILES / "mm_bf16-cublaslt.json"
LLAMA_CONFIG = FIXTURES / "models" / "llama-3.1-8b" / "config.json"
QWEN3_CONFIG = FIXTURES / "models" / "qwen3-30b-a3b" / "config.json"
