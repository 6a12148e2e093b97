"""Identity of a tuning: the key a pod asks for and the environment a tuning is valid in.

A stored tuning is usable by a pod when

* its :class:`TuningKey` equals the pod's (same GPU SKU, arch, model,
  ``max_num_batched_tokens`` and the fields that change the set of shapes: dtype,
  quantization, tensor-parallel size), and
* its :class:`EnvironmentMetadata` equals the pod's field by field. These are exactly the
  fields of FlashInfer's ``_metadata`` block (``flashinfer.autotuner._collect_metadata``),
  which ``AutoTuner.load_configs`` compares before it accepts a cache file: matching on
  anything less would hand a pod a file that FlashInfer then rejects.

This module is pure Python (pydantic only): both the pod-side client and the service
import it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

#: The fields of FlashInfer 0.7's ``_metadata`` block, in the order
#: ``flashinfer.autotuner._collect_metadata`` writes them.
ENVIRONMENT_FIELDS: tuple[str, ...] = (
    "flashinfer_version",
    "cuda_version",
    "cublas_version",
    "cudnn_version",
    "cudnn_frontend_version",
    "cutlass_dsl_version",
    "gpu",
)

#: Values FlashInfer writes when it cannot detect a field (``"unknown"``) or that older
#: files lack. ``load_configs`` treats them as a (soft) mismatch, so a tuning recorded
#: with one can never be loaded: the service refuses to store it.
INDETERMINATE_VALUES: frozenset[str] = frozenset({"unknown", ""})

KEY_FIELDS: tuple[str, ...] = (
    "gpu_name",
    "arch",
    "model",
    "max_num_batched_tokens",
    "dtype",
    "quantization",
    "tensor_parallel_size",
)

#: Fallback GPU name -> arch table, used only where no CUDA device can be queried
#: (``tunecache push`` of a file on a laptop). On a GPU the arch comes from
#: ``torch.cuda.get_device_capability`` (see :func:`arch_from_capability`). The names are
#: what ``torch.cuda.get_device_name()`` returns; the longest matching prefix wins.
_KNOWN_GPU_ARCHES: dict[str, str] = {
    "NVIDIA A100": "sm80",
    "NVIDIA A10": "sm86",
    "NVIDIA L4": "sm89",
    "NVIDIA L40": "sm89",
    "NVIDIA H100": "sm90",
    "NVIDIA H200": "sm90",
    "NVIDIA H20": "sm90",
    "NVIDIA GH200": "sm90",
    "NVIDIA B200": "sm100",
    "NVIDIA GB200": "sm100",
    "NVIDIA B300": "sm103",
}


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


#: A string without NUL characters (PostgreSQL text cannot hold them).
Text = Annotated[str, AfterValidator(_no_nul)]


class EnvironmentMetadata(BaseModel):
    """FlashInfer's environment metadata: the fields ``AutoTuner.load_configs`` checks.

    Source: ``flashinfer.autotuner._collect_metadata`` (FlashInfer 0.7.4). Every value
    is a string as FlashInfer writes it, e.g. ``cudnn_version="91900"``,
    ``gpu="NVIDIA H200"``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    flashinfer_version: Text = Field(min_length=1, max_length=64)
    cuda_version: Text = Field(min_length=1, max_length=64)
    cublas_version: Text = Field(min_length=1, max_length=64)
    cudnn_version: Text = Field(min_length=1, max_length=64)
    cudnn_frontend_version: Text = Field(min_length=1, max_length=64)
    cutlass_dsl_version: Text = Field(min_length=1, max_length=4096)
    gpu: Text = Field(min_length=1, max_length=128)

    @classmethod
    def from_flashinfer_metadata(cls, metadata: dict[str, Any]) -> "EnvironmentMetadata":
        """Build from a ``_metadata`` dict as FlashInfer writes it.

        Keys FlashInfer may add in later versions are ignored; a missing field becomes
        ``"unknown"``, which FlashInfer itself treats as indeterminate.

        Raises:
            ValueError: ``metadata`` is not a JSON object, or a field is not a string or
                number, empty, too long or holds NUL (the message names the field).
        """
        if not isinstance(metadata, dict):
            raise ValueError("FlashInfer _metadata must be a JSON object")
        values = {}
        for field in ENVIRONMENT_FIELDS:
            value = metadata.get(field, "unknown")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"_metadata.{field} must be a string, not {type(value).__name__}")
            values[field] = str(value)
        try:
            return cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ValueError(f"_metadata.{error['loc'][0]}: {error['msg']}") from None

    def environment_hash(self) -> str:
        """sha256 (64 hex chars) of the canonical JSON of the fields; stable across runs."""
        canonical = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def indeterminate_fields(self) -> list[str]:
        """Names of fields FlashInfer could not detect (``"unknown"``)."""
        return [f for f in ENVIRONMENT_FIELDS if getattr(self, f) in INDETERMINATE_VALUES]


class TuningKey(BaseModel):
    """What a pod asks for. Two pods with equal keys (and environments) tune the same shapes.

    * ``gpu_name``: ``torch.cuda.get_device_name()``, e.g. ``"NVIDIA H200"`` (the SKU:
      H100 and H200 differ even though both are ``sm90``).
    * ``arch``: ``sm`` + compute capability, e.g. ``"sm90"``.
    * ``model``: the model name a pod passes to vLLM (``--model``).
    * ``max_num_batched_tokens``: vLLM's scheduler limit; FlashInfer tunes token buckets
      up to it.
    * ``dtype``: vLLM's ``--dtype`` (``"auto"``: as the checkpoint says).
    * ``quantization``: vLLM's ``--quantization`` (``"auto"``: as the checkpoint says).
    * ``tensor_parallel_size``: divides the GEMM shapes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_name: Text = Field(min_length=1, max_length=128)
    arch: str = Field(pattern=r"^sm[0-9]{2,3}[a-z]?$", max_length=16)
    model: Text = Field(min_length=1, max_length=512)
    max_num_batched_tokens: int = Field(gt=0, le=1 << 24, strict=True)
    dtype: Text = Field(default="auto", min_length=1, max_length=32)
    quantization: Text = Field(default="auto", min_length=1, max_length=32)
    tensor_parallel_size: int = Field(default=1, gt=0, le=1024, strict=True)


class FieldDifference(BaseModel):
    """One field in which a stored tuning differs from what was asked for."""

    field: str
    stored: str
    yours: str

    def __str__(self) -> str:
        return f"{self.field}: stored {self.stored}, yours {self.yours}"


def differences(
    stored_key: TuningKey,
    stored_environment: EnvironmentMetadata,
    key: TuningKey,
    environment: EnvironmentMetadata,
) -> list[FieldDifference]:
    """Every key and environment field in which a stored tuning differs from a request.

    Key fields come first (in :data:`KEY_FIELDS` order), then environment fields (in
    :data:`ENVIRONMENT_FIELDS` order). An empty list means the tuning is usable.
    """
    found: list[FieldDifference] = []
    for stored, yours, fields in (
        (stored_key, key, KEY_FIELDS),
        (stored_environment, environment, ENVIRONMENT_FIELDS),
    ):
        for name in fields:
            a, b = str(getattr(stored, name)), str(getattr(yours, name))
            if a != b:
                found.append(FieldDifference(field=name, stored=a, yours=b))
    return found


def arch_from_capability(major: int, minor: int) -> str:
    """``(9, 0)`` -> ``"sm90"``, as vLLM's ``DeviceCapability.to_int`` names it."""
    return f"sm{major}{minor}"


def arch_for_gpu_name(gpu_name: str) -> str | None:
    """The arch of a known GPU name (longest-prefix match), or ``None`` if unknown."""
    matches = [p for p in _KNOWN_GPU_ARCHES if gpu_name.startswith(p)]
    return _KNOWN_GPU_ARCHES[max(matches, key=len)] if matches else None
