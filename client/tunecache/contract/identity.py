"""The key's and the environment's identity: what a pod asks for and where it runs.

* :class:`TuningKey` (what a pod asks for): the key's fields are declared here once, as
  :class:`GpuKey` (the GPU) and :class:`DeploymentKey` (what a vLLM deployment's options
  give: model, ``max_num_batched_tokens``, dtype, quantization, parallel sizes);
  :data:`KEY_FIELDS` is read from the model;
* :class:`EnvironmentMetadata` (FlashInfer's ``_metadata`` fields), :func:`differences`
  between two keys and environments, :func:`expert_parallel_size`;
* the validators every model of the contract shares (:data:`Text`, :data:`WholeNumber`,
  free-form JSON that both databases store).
"""

from __future__ import annotations

import enum
import hashlib
import unicodedata
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

try:
    from enum import StrEnum
except ImportError:  # Python 3.10

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """``enum.StrEnum`` of Python 3.11: members are their values as strings."""

        def __str__(self) -> str:
            return str(self.value)


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

#: What tunecache records for a field the writing FlashInfer does not track at all (absent
#: from its ``_metadata``: FlashInfer 0.6.13's ``_collect_metadata()`` has no
#: ``cutlass_dsl_version``). ``AutoTuner.load_configs`` compares only the fields its own
#: ``_collect_metadata()`` returns (0.6.13: ``load_configs``; 0.7.4:
#: ``_classify_metadata_mismatches``), so a file without the field loads under a FlashInfer
#: that does not track it either and never under one that does: equal markers match, the
#: marker never equals a detected value.
NOT_TRACKED = "(not tracked)"

#: Largest ``max_num_batched_tokens`` accepted (16 Mi tokens).
MAX_NUM_BATCHED_TOKENS = 1 << 24
#: Largest id and offset accepted (PostgreSQL's integer).
MAX_ID = 2**31 - 1
#: A lowercase hex sha256.
SHA256_PATTERN = r"^[0-9a-f]{64}$"
#: Query strings must not hold NUL (PostgreSQL text cannot).
NO_NUL = r"^[^\x00]*$"


def _no_nul(value: str) -> str:
    """Text both databases store: no NUL, and valid Unicode (a lone surrogate such as
    ``"\ud800"``, which JSON can spell, encodes to no UTF-8 and answered 500)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    _valid_unicode(value)
    return value


def _valid_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it holds a lone surrogate such as \\ud800)") from None


def _whole_number(value: Any) -> Any:
    """Integers only: ``8192`` or ``8192.0`` (JSON Schema's integer), never ``"8192"``,
    ``true`` or ``8192.5``."""
    if isinstance(value, bool) or isinstance(value, str):
        raise ValueError("must be a whole number, not " + type(value).__name__)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _model_name(value: str) -> str:
    """A model name as vLLM takes it: no control characters (tab, newline, ...), no space at
    either end, not blank."""
    if not value.strip():
        raise ValueError("must not be blank")
    if value != value.strip():
        raise ValueError("must not start or end with whitespace")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError("must not contain control characters (tab, newline, ...)")
    return value


#: A model name (:func:`_model_name`).
ModelName = Annotated[str, AfterValidator(_model_name), Field(json_schema_extra={"pattern": r"^\S(.*\S)?$"})]

#: vLLM's ``--dtype`` choices (``vllm/config/model.py::ModelDType``, vLLM 0.25 and 0.33).
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
#: vLLM's ``--quantization`` choices (``vllm.model_executor.layers.quantization.QUANTIZATION_METHODS``,
#: vLLM 0.25), with ``auto`` (as the checkpoint says).
VLLM_QUANTIZATIONS = (
    "auto", "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "bitsandbytes", "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4",
    "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "mxfp8",
)


#: The engines a key can name (:attr:`DeploymentKey.engine`): each is one adaptor of
#: :data:`tunecache.engines.ENGINES`, which names exactly these (a test checks). The contract
#: keeps the names so that it stays pure; a second engine adds its name here and its adaptor
#: package there.
ENGINE_NAMES: tuple[str, ...] = ("vllm",)
#: The engine of every key that names none (all keys recorded before keys named their engine).
DEFAULT_ENGINE = "vllm"
#: An engine's name, one of :data:`ENGINE_NAMES`.
EngineName = Literal[ENGINE_NAMES]  # type: ignore[valid-type]


#: A whole number as JSON Schema means it (no strings, booleans or fractions).
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]

#: A string without NUL characters (PostgreSQL text cannot hold them); the OpenAPI schema
#: says so with a pattern, the validator with a clear message.
Text = Annotated[str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": NO_NUL})]


#: An engine variant's id (:class:`tunecache.engines.vllm.compile_cache.VariantFactors`): the first
#: 16 hex digits of a sha256 over what makes vLLM compile the same key differently (another
#: ``max_model_len``, compilation setting, KV-cache dtype, vLLM version or environment factor).
VARIANT_PATTERN = r"^[0-9a-f]{16}$"
#: A variant id (``None`` where a run has no compile cache, or a pod does not know its own).
Variant = Annotated[str, Field(pattern=VARIANT_PATTERN, description="an engine variant's id (16 hex digits)")]

#: At most this many vLLM engine arguments name a variant's engine (``engine_args``).
MAX_ENGINE_ARGS = 32
#: An engine argument's JSON value is at most this many characters.
MAX_ENGINE_ARG_CHARS = 256


#: ``vllm.LLM`` arguments a variant cannot name: the key's own and those the vLLM warmup sets
#: (the allowed ones: :data:`tunecache.contract.engine_args.ALLOWED`).
KEY_ENGINE_ARGS = frozenset({"model", "load_format", "skip_tokenizer_init", "max_num_batched_tokens",
                             "tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "dtype",
                             "quantization", "served_model_name"})


#: Deepest nesting of lists and objects accepted in free-form JSON (``summary``, ``hf_config``).
MAX_JSON_DEPTH = 64


def _depth(value: Any) -> int:
    """Nesting depth of lists and objects (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _storable_json(value: Any) -> str:
    """``value`` as JSON, refusing what neither database stores (NaN, Infinity, NUL) and
    nesting deeper than :data:`MAX_JSON_DEPTH`."""
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        encoded = json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError("must not contain NaN or Infinity") from None
    if "\\u0000" in encoded:
        raise ValueError("must not contain NUL characters")
    _valid_unicode(json.dumps(value, ensure_ascii=False))
    return encoded


class EnvironmentMetadata(BaseModel):
    """FlashInfer's environment metadata: the fields ``AutoTuner.load_configs`` checks.

    Source: ``flashinfer.autotuner._collect_metadata`` (FlashInfer 0.7.4; 0.6.13 has no
    ``cutlass_dsl_version``: :data:`NOT_TRACKED`). Every value
    is a string as FlashInfer writes it, e.g. ``cudnn_version="91900"``,
    ``gpu="NVIDIA H200"``. A stored tuning is usable by a pod only when every field is
    equal: matching on less would hand a pod a file that FlashInfer then rejects.
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

        Keys FlashInfer may add in later versions are ignored; a field the writing
        FlashInfer does not track (absent: ``cutlass_dsl_version`` before FlashInfer 0.7)
        becomes :data:`NOT_TRACKED`.

        Raises:
            ValueError: ``metadata`` is not a JSON object, or a field is not a string or
                number, empty, too long or holds NUL (the message names the field).
        """
        if not isinstance(metadata, dict):
            raise ValueError("FlashInfer _metadata must be a JSON object")
        values = {}
        for field in ENVIRONMENT_FIELDS:
            value = metadata.get(field, NOT_TRACKED)
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


class GpuKey(BaseModel):
    """The GPU a key is for: the fields of :class:`TuningKey` a pod detects rather than
    configures (see there)."""

    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    gpu_name: Text = Field(min_length=1, max_length=128)
    arch: str = Field(pattern=r"^sm[0-9]{2,3}[a-z]?$", max_length=16)


class DeploymentKey(BaseModel):
    """The fields of :class:`TuningKey` a vLLM deployment's options give: everything but the
    GPU (see there). What the tuner tunes (``TuneSpec.deployment``) before it knows its GPU;
    :meth:`on_gpu` makes the key of it."""

    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    model: ModelName = Field(min_length=1, max_length=512)
    max_num_batched_tokens: WholeNumber = Field(gt=0, le=MAX_NUM_BATCHED_TOKENS)
    dtype: Text = Field(default="auto", min_length=1, max_length=32)
    quantization: Text = Field(default="auto", min_length=1, max_length=32)
    tensor_parallel_size: WholeNumber = Field(default=1, gt=0, le=1024)
    data_parallel_size: WholeNumber = Field(default=1, gt=0, le=1024)
    expert_parallel_size: WholeNumber = Field(default=1, gt=0, le=1 << 20)
    engine: EngineName = DEFAULT_ENGINE

    @model_validator(mode="after")
    def _expert_parallel_spans_tp_and_dp(self):
        """vLLM splits experts over every tp x dp rank (``FusedMoEParallelConfig``), so an
        expert-parallel size that is not a multiple of that cannot come from vLLM."""
        ranks = self.tensor_parallel_size * self.data_parallel_size
        if self.expert_parallel_size != 1 and self.expert_parallel_size % ranks:
            raise ValueError(f"expert_parallel_size {self.expert_parallel_size} must be 1 or a multiple of "
                             f"tensor_parallel_size x data_parallel_size ({ranks}), as vLLM's --enable-expert-parallel makes it")
        return self

    def unmatchable(self) -> list[str]:
        """Why no vLLM pod could ever ask for this deployment (a ``dtype`` or ``quantization``
        vLLM does not take), one line per field; ``[]``: none. Checked where runs and jobs are
        made, not on lookups (a pod that asks for something else simply misses)."""
        problems = []
        if self.dtype not in VLLM_DTYPES:
            problems.append(f"dtype {self.dtype!r} is not one of vLLM's --dtype choices ({', '.join(VLLM_DTYPES)})")
        if self.quantization not in VLLM_QUANTIZATIONS:
            problems.append(f"quantization {self.quantization!r} is not one of vLLM's --quantization methods "
                            f"(auto, fp8, awq, gptq, compressed-tensors, ...)")
        return problems

    def on_gpu(self, gpu_name: str, arch: str) -> "TuningKey":
        """The key of this deployment on a GPU named ``gpu_name`` of ``arch``."""
        return TuningKey(gpu_name=gpu_name, arch=arch, **{f: getattr(self, f) for f in DeploymentKey.model_fields})


# The key's fields are declared once, in GpuKey and DeploymentKey; TuningKey has them in
# that order (KEY_FIELDS), its own docstring (the API's schema of the key) describes them.
class TuningKey(DeploymentKey, GpuKey):
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
    * ``data_parallel_size``: vLLM's ``--data-parallel-size``. vLLM shards a MoE layer over
      tp x dp ranks (``vllm/config/parallel.py::ParallelConfig.data_parallel_size``; the
      fused-MoE "flattened" tp), so it changes the tuned MoE shapes.
    * ``expert_parallel_size``: 1, or with vLLM's ``--enable-expert-parallel`` the
      number of ranks the experts are split over, tp x dp (x prefill-context parallel
      size): each rank then runs whole experts, a share of them.
    * ``engine``: the inference engine the pod runs, one of :data:`ENGINE_NAMES` (default
      ``"vllm"``); its adaptor (:data:`tunecache.engines.ENGINES`) knows the rest.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    def _unnamed(self) -> set[str]:
        """The fields a key's identity leaves out: ``engine`` where it is :data:`DEFAULT_ENGINE`,
        so that every hash, file name and signed manifest of a key made before keys named their
        engine stays what it was."""
        return {"engine"} if self.engine == DEFAULT_ENGINE else set()

    def identity(self) -> dict[str, Any]:
        """The key's fields as JSON values, less ``engine`` where it is the default
        (:meth:`_unnamed`): what :meth:`key_hash` and a run's signed manifest
        (:func:`tunecache.signing.canonical_manifest`) are over."""
        return self.model_dump(mode="json", exclude=self._unnamed())

    def identity_json(self) -> str:
        """:meth:`identity` as pydantic's compact JSON, in field order (file names hash it)."""
        return self.model_dump_json(exclude=self._unnamed())

    def key_hash(self) -> str:
        """sha256 (64 hex chars) of the canonical JSON of the key's :meth:`identity`: how pod
        reports and the fleet view name a key without a row in the service's key table."""
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def deployment(self) -> DeploymentKey:
        """The key's fields but the GPU."""
        return DeploymentKey(**{f: getattr(self, f) for f in DeploymentKey.model_fields})


#: The fields of :class:`TuningKey`, in order (read from the model, where they are
#: declared). The service's ``tuning_keys`` unique constraint is built from this list.
KEY_FIELDS: tuple[str, ...] = tuple(TuningKey.model_fields)


def expert_parallel_size(tensor_parallel_size: int, data_parallel_size: int = 1,
                         enable_expert_parallel: bool = False, prefill_context_parallel_size: int = 1) -> int:
    """The key's ``expert_parallel_size`` for a vLLM deployment: tp x dp x pcp with
    ``--enable-expert-parallel`` (vLLM's ``FusedMoEParallelConfig.make``: ``ep_size``), else 1."""
    if not enable_expert_parallel:
        return 1
    return tensor_parallel_size * data_parallel_size * prefill_context_parallel_size


assert KEY_FIELDS[:2] == tuple(GpuKey.model_fields) and KEY_FIELDS[2:] == tuple(DeploymentKey.model_fields)
assert tuple(EnvironmentMetadata.model_fields) == ENVIRONMENT_FIELDS


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
