"""Engine arguments by allow-list: the ``vllm.LLM`` arguments that may name an engine variant.

An engine variant's arguments (:data:`EngineArgs`: a tuning job's ``engine_args``, a pod
report's, ``tune --engine-args``) reach ``vllm.LLM(**args)`` on a tuning node, and the run that
engine makes is signed with the node's key for every pod. So only arguments that name an engine
variant and load nothing are taken: :data:`ALLOWED` (each with its type, bounds and why it is
safe), and inside ``compilation_config`` only :data:`ALLOWED_COMPILATION`, field by field. Every
other name, top level or nested, is refused naming it; :data:`REFUSED` and
:data:`REFUSED_COMPILATION` say why for each field vLLM's releases have (tests/contract reads
every supported release's ``EngineArgs`` and ``CompilationConfig`` from its wheel and fails on a
field neither table decides: a new field of a new release is refused until someone writes the
decision down).

:func:`check_engine_args` is the one check (the :data:`EngineArgs` type runs it at every door:
the jobs and reports APIs, the CLI, the tuner right before ``vllm.LLM``);
:func:`allowed_engine_args` keeps of a stored or observed dict what the check would take.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping

from pydantic import AfterValidator

from tunecache.contract.identity import KEY_ENGINE_ARGS, MAX_ENGINE_ARG_CHARS, MAX_ENGINE_ARGS, _storable_json

#: Largest CUDA graph capture size, compile size or token count taken in a list (64 Ki).
MAX_CAPTURE_SIZE = 1 << 16
#: Most entries of a list argument (``cudagraph_capture_sizes``, ``custom_ops``, ...).
MAX_LIST_ITEMS = 128


@dataclass(frozen=True)
class Allowed:
    """One allowed argument: its JSON type (``bool``, ``int``, ``float``, ``choice``, ``name``:
    a string matching ``pattern``, ``ints``: a list of ints, ``names``: a list of strings matching
    ``pattern``, ``object``: the fields of ``fields``), its bounds, and why it is safe."""

    kind: str
    reason: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()
    pattern: str | None = None
    refused_values: tuple[str, ...] = ()
    nullable: bool = False
    fields: Mapping[str, "Allowed"] = field(default_factory=dict)
    #: The first vLLM minor release that has the argument (``(0, 34)``; ``None``: every supported
    #: one); an older vLLM refuses it (``vllm.LLM``'s ``TypeError`` fails the job).
    since: tuple[int, int] | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not one this argument takes (``None``: it is). Nested objects are
        :func:`_object_problem`'s."""
        if value is None:
            return None if self.nullable else "must not be null"
        kind = self.kind
        if kind == "bool":
            return None if isinstance(value, bool) else "must be true or false"
        if kind in ("int", "float"):
            return self._number_problem(value, kind == "int")
        if kind == "choice":
            return None if value in self.choices and type(value) is not bool else \
                "must be one of " + ", ".join(map(_json_text, self.choices))
        if kind == "name":
            return self._name_problem(value)
        if kind in ("ints", "names"):
            if not isinstance(value, list):
                return "must be a list"
            if len(value) > MAX_LIST_ITEMS:
                return f"has {len(value)} entries; at most {MAX_LIST_ITEMS}"
            for item in value:
                found = self._number_problem(item, True) if kind == "ints" else self._name_problem(item)
                if found and not (item in self.choices and isinstance(item, str)):
                    return f"entry {_json_text(item)[:40]} {found}"
            return None
        return None if isinstance(value, dict) else "must be an object"

    def _number_problem(self, value: Any, whole: bool) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "must be a whole number" if whole else "must be a number"
        if isinstance(value, float) and (whole or not math.isfinite(value)):
            # 8192.0 is refused too: vllm.LLM would get a float where its argument is an int
            return "must be a whole number" if whole else "must be a finite number"
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            return f"is {value}: must be {_bounds(self)}"
        return None

    def _name_problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or not re.fullmatch(self.pattern or "", value) or value in self.refused_values:
            return f"must be {self.describe()}"
        return None

    def describe(self) -> str:
        """The values it takes, in words (the operator guide's table)."""
        kind, null = self.kind, " or null" if self.nullable else ""
        if kind == "bool":
            return "true or false" + null
        if kind in ("int", "float"):
            return ("a whole number " if kind == "int" else "a number ") + _bounds(self) + null
        if kind == "choice":
            return "one of " + ", ".join(map(_json_text, self.choices)) + null
        if kind == "name":
            but = f", not {', '.join(self.refused_values)}" if self.refused_values else ""
            return f"a name matching `{self.pattern}`{but}" + null
        if kind == "ints":
            also = f" or {', '.join(map(_json_text, self.choices))}" if self.choices else ""
            return f"a list of at most {MAX_LIST_ITEMS} whole numbers {_bounds(self)}{also}" + null
        if kind == "names":
            return f"a list of at most {MAX_LIST_ITEMS} names matching `{self.pattern}`" + null
        return "an object of the fields below" + null


def _bounds(spec: Allowed) -> str:
    low = "" if spec.low is None else f"{spec.low:g}"
    high = "" if spec.high is None else f"{spec.high:,}" if float(spec.high).is_integer() else f"{spec.high:g}"
    if spec.kind == "float" and spec.low == 0:
        return f"over 0 and at most {high}"
    return f"from {low} to {high}" if low and high else f"at least {low}" if low else f"at most {high}"


def _json_text(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


_SIZES = dict(low=1, high=MAX_CAPTURE_SIZE)
_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")

#: ``compilation_config`` fields an engine variant may set: numbers, booleans and choices of
#: vLLM's own (``vllm/config/compilation.py::CompilationConfig``).
ALLOWED_COMPILATION: dict[str, Allowed] = {
    "mode": Allowed("choice", "how vLLM compiles the model (CompilationMode: 0-3 or its name)",
                    choices=(0, 1, 2, 3, *_MODES), nullable=True),
    "cudagraph_mode": Allowed("choice", "which CUDA graphs vLLM captures (CUDAGraphMode's names)",
                              choices=("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"),
                              nullable=True),
    "cudagraph_capture_sizes": Allowed("ints", "the batch sizes CUDA graphs are captured for", **_SIZES, nullable=True),
    "max_cudagraph_capture_size": Allowed("int", "the largest CUDA graph capture size", **_SIZES, nullable=True),
    "compile_sizes": Allowed("ints", "the sizes Inductor compiles for (or vLLM's \"cudagraph_capture_sizes\")",
                             **_SIZES, choices=("cudagraph_capture_sizes",), nullable=True),
    "compile_ranges_endpoints": Allowed("ints", "where the compiled token ranges split", **_SIZES, nullable=True),
    "backend": Allowed("choice", "the torch.compile backend; any other value is a qualified name vLLM imports "
                       "(resolve_obj_by_qualname)", choices=("", "inductor", "eager")),
    "custom_ops": Allowed("names", "vLLM's own custom ops switched on (+name) or off (-name), by name",
                          pattern=r"[+-]?[a-z][a-z0-9_]{0,63}"),
    "use_inductor_graph_partition": Allowed("bool", "Inductor's graph partition on or off", nullable=True),
    "cudagraph_num_of_warmups": Allowed("int", "warmup runs before a CUDA graph is captured", low=0, high=64),
    "cudagraph_copy_inputs": Allowed("bool", "CUDA graphs copy their inputs"),
    "cudagraph_specialize_lora": Allowed("bool", "CUDA graphs specialised for LoRA"),
    "compile_mm_encoder": Allowed("bool", "the multimodal encoder is compiled too"),
    "cudagraph_mm_encoder": Allowed("bool", "the multimodal encoder is captured in CUDA graphs too"),
    "fast_moe_cold_start": Allowed("bool", "vLLM's faster MoE compile on a cold start", nullable=True),
    "compile_cache_save_format": Allowed("choice", "how the compile cache is written (it is the warm state)",
                                         choices=("binary", "unpacked")),
    "ir_enable_torch_wrap": Allowed("bool", "vLLM IR ops wrapped for torch.compile", nullable=True),
    "use_breakable_cudagraph": Allowed("bool", "breakable CUDA graphs", nullable=True, since=(0, 34)),
}

#: vLLM's KV-cache dtypes present in every supported release (``vllm/config/cache.py::CacheDType``).
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                   "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                   "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4")
_MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")

#: ``vllm.LLM`` arguments an engine variant may set (``vllm/engine/arg_utils.py::EngineArgs``).
ALLOWED: dict[str, Allowed] = {
    "max_model_len": Allowed("int", "the context length: the KV cache's size and the compiled ranges",
                             low=1, high=1 << 24),
    "max_num_seqs": Allowed("int", "the most sequences a step runs: the CUDA graph sizes", low=1, high=MAX_CAPTURE_SIZE),
    "block_size": Allowed("int", "the KV-cache block size: the attention kernels' page size", low=1, high=1024,
                          nullable=True),
    "kv_cache_dtype": Allowed("choice", "the KV cache's dtype: which attention kernels run", choices=KV_CACHE_DTYPES),
    "enable_prefix_caching": Allowed("bool", "prefix caching on or off", nullable=True),
    "enforce_eager": Allowed("bool", "no torch.compile and no CUDA graphs"),
    "gpu_memory_utilization": Allowed("float", "the share of GPU memory the engine takes: the KV cache's size",
                                      low=0, high=1),
    "enable_chunked_prefill": Allowed("bool", "chunked prefill: the scheduler's step shapes", nullable=True),
    "attention_backend": Allowed("name", "one of vLLM's own attention backends, by its AttentionBackendEnum name "
                                 "(each names a class of vLLM's; CUSTOM is one registered by other code)",
                                 pattern=r"[A-Z][A-Z0-9_]{0,63}", refused_values=("CUSTOM",), nullable=True),
    "async_scheduling": Allowed("bool", "asynchronous scheduling", nullable=True),
    "disable_cascade_attn": Allowed("bool", "cascade attention off", nullable=True),
    "disable_sliding_window": Allowed("bool", "sliding-window attention off"),
    "enable_flashinfer_autotune": Allowed("bool", "FlashInfer's autotune at boot (what the tuner stores)"),
    "num_gpu_blocks_override": Allowed("int", "a fixed number of KV-cache blocks", low=1, high=1 << 24, nullable=True),
    "kv_cache_memory_bytes": Allowed("int", "a fixed KV-cache size in bytes", low=1, high=1 << 48, nullable=True),
    "long_prefill_token_threshold": Allowed("int", "when a prefill counts as long", low=0, high=1 << 24),
    "enable_lora": Allowed("bool", "LoRA kernels in the engine (no adapter is loaded)"),
    "max_loras": Allowed("int", "LoRA slots per batch", low=1, high=1024),
    "max_lora_rank": Allowed("int", "the largest LoRA rank", low=1, high=1024),
    "enable_dbo": Allowed("bool", "dual-batch overlap"),
    "optimization_level": Allowed("int", "vLLM's -O level (OptimizationLevel)", low=0, high=3),
    "performance_mode": Allowed("choice", "vLLM's performance mode", choices=("balanced", "interactivity", "throughput")),
    "mamba_cache_dtype": Allowed("choice", "the Mamba state cache's dtype", choices=_MAMBA_DTYPES),
    "mamba_ssm_cache_dtype": Allowed("choice", "the Mamba SSM cache's dtype", choices=_MAMBA_DTYPES),
    "mamba_block_size": Allowed("int", "the Mamba cache's block size", low=1, high=1 << 20, nullable=True),
    "cudagraph_capture_sizes": ALLOWED_COMPILATION["cudagraph_capture_sizes"],
    "max_cudagraph_capture_size": ALLOWED_COMPILATION["max_cudagraph_capture_size"],
    "compilation_config": Allowed("object", "how vLLM compiles: only the fields of the compilation_config table",
                                  fields=ALLOWED_COMPILATION),
}

_KEY = "the tuning key's or the vLLM warmup's own (the key says it; the warmup sets it)"
_LAYOUT = "a parallel layout or quantization the tuning key does not name: it contradicts the key"
_CODE = "imports or runs code (a class, module, plugin or model code by name), or loads another model"
_PATH = "reads or writes a path or fetches files on the tuning node"
_NETWORK = "a credential, address, port or remote endpoint"
_NESTED = "a nested config of many fields (some load code or paths); not decided field by field"
_SERVING = "serving, scheduling, logging or multimodal behaviour: names no engine variant tunecache stores"
_STATE = "vLLM's own state, not an argument"


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _reasons(groups: tuple[tuple[str, tuple[str, ...]], ...]) -> dict[str, str]:
    """``{name: reason}`` of ``(reason, names)`` groups; a name in two groups is a mistake."""
    found: dict[str, str] = {}
    for reason, names in groups:
        for name in names:
            assert name not in found, f"{name} is refused twice"
            found[name] = reason
    return found


#: Why each other ``EngineArgs`` field of the supported releases is refused (names not here
#: are refused too, as unknown).
REFUSED: dict[str, str] = _reasons((
    (_KEY, sorted(KEY_ENGINE_ARGS)),
    (_LAYOUT, _names("""pipeline_parallel_size prefill_context_parallel_size decode_context_parallel_size
        quantization_config data_parallel_size_local data_parallel_rank data_parallel_start_rank data_parallel_backend
        data_parallel_external_lb data_parallel_hybrid_lb data_parallel_multi_port_external_lb nnodes node_rank
        enable_eplb eplb_config enable_elastic_ep elastic_ep_max_dp_size expert_placement_strategy all2all_backend
        dcp_comm_backend dcp_kv_cache_interleave_size dcp_q_replicate cp_kv_cache_interleave_size enable_hc_sp
        enable_ep_weight_filter allow_deprecated_quantization kv_cache_dtype_skip_layers override_attention_dtype
        device_ids""")),
    (_CODE, _names("""trust_remote_code hf_overrides model_impl worker_cls worker_extension_cls scheduler_cls
        distributed_executor_backend model_class_overrides logits_processors io_processor_plugin kv_transfer_config
        ec_transfer_config reasoning_parser_plugin speculative_config spec_method spec_model spec_tokens
        tokenizer_mode additional_config logging_config kv_events_config weight_transfer_config pooler_config
        structured_outputs_config reasoning_parser offload_backend runner convert diffusion_config
        mm_encoder_attn_backend kv_offloading_backend ir_op_priority engram_config""")),
    (_PATH, _names("""download_dir tokenizer hf_config_path model_weights generation_config allowed_local_media_path
        log_config_file mm_encoder_fp8_scale_path mm_encoder_fp8_scale_save_path config_format ignore_patterns
        pt_load_map_location model_loader_extra_config revision code_revision tokenizer_revision profiler_config
        safetensors_load_strategy checkpoint_prepare_on_startup""")),
    (_NETWORK, _names("""hf_token otlp_traces_endpoint master_addr master_port data_parallel_address
        data_parallel_rpc_port allowed_media_domains""")),
    (_NESTED, _names("""attention_config kernel_config mamba_config reasoning_config aux_output_config
        ec_manager_config fault_tolerance_config watchdog_config watermark_config""")),
    (_STATE, _names("_api_process_count _api_process_rank")),
    (_SERVING, _names("""aggregate_engine_logging cache_aware_admission_threshold cache_aware_admission_window
        calculate_kv_scales collect_detailed_traces cpu_distributed_timeout_seconds cpu_offload_gb cpu_offload_params
        cudagraph_metrics custom_histogram_buckets dbo_decode_token_threshold dbo_prefill_token_threshold
        default_mm_loras disable_chunked_mm_input disable_custom_all_reduce disable_hybrid_kv_cache_manager
        disable_log_stats disable_nccl_for_dp_synchronization distributed_timeout_seconds dp_sync_interval
        enable_batch_sharded_sampling enable_cumem_allocator enable_extensible_kv_cache enable_fault_tolerance
        enable_layerwise_nvtx_tracing enable_logging_iteration_details enable_mamba_cache_stochastic_rounding
        enable_mamba_shared_prefix_checkpoint enable_mfu_metrics enable_mixed_moe_lora_format enable_mm_embeds
        enable_mm_processor_stats enable_moe_shared_loras enable_nccl_comm_suspend enable_prompt_embeds
        enable_return_routed_experts enable_shm_tensor_arena enable_sleep_mode enable_tower_connector_lora
        enable_trace_replay fail_on_environ_validation fully_sharded_loras gdn_prefill_backend interleave_mm_strings
        jit_monitor_mode jit_monitor_verbose kda_decode_backend kda_prefill_backend kv_cache_metrics
        kv_cache_metrics_sample kv_offloading_size kv_sharing_fast_prefill language_model_only limit_mm_per_prompt
        linear_backend log_level logprobs_mode long_prefill_token_threshold_adaptive lora_dtype lora_target_modules
        mamba_backend mamba_cache_mode mamba_cache_philox_rounds mamba_ssu_algorithm max_cpu_loras max_logprobs
        max_long_partial_prefills max_lora_cls_labels max_num_active_seqs max_num_inflight_kv_loads
        max_num_partial_prefills max_num_queued_reqs max_num_queued_tokens max_num_scheduled_tokens
        max_parallel_loading_workers media_io_kwargs mm_device_do_normalize mm_encoder_attn_dtype
        mm_encoder_fp8_scale_save_margin mm_encoder_only mm_encoder_tp_mode mm_hasher_algorithm mm_ipc_gpu_memory_gb
        mm_processor_cache_gb mm_processor_cache_type mm_processor_device mm_processor_kwargs
        mm_shm_cache_max_object_size_mb mm_tensor_ipc moe_backend monokernel numa_bind numa_bind_cpus numa_bind_nodes
        offload_group_size offload_num_in_group offload_params offload_prefetch_step override_generation_config
        per_request_spec_decode_metrics prefill_schedule_interval prefix_cache_retention_interval
        prefix_caching_hash_algo prefix_match_unit ray_workers_use_nsight renderer_num_workers replayssm_buffer_len
        return_sampling_mask safetensors_prefetch_block_size safetensors_prefetch_num_threads scheduler_reserve_full_isl
        scheduling_policy seed show_hidden_metrics_for_version shuffle_safetensors_files shutdown_timeout
        skip_mm_profiling sleep_mode_backend sleep_mode_offload_cudagraph sleep_preserve_parameter_names
        sparse_indexer_topk_backend specialize_active_lora stream_interval swa_bounded_replay tokens_only ubatch_size
        use_fp64_gumbel use_replayssm use_tqdm_on_load video_pruning_method video_pruning_rate watermark""")),
))

#: Why each other ``CompilationConfig`` field of the supported releases is refused.
REFUSED_COMPILATION: dict[str, str] = _reasons((
    ("imports a module by name (__import__)", _names("inductor_passes")),
    ("a path on the tuning node", _names("cache_dir debug_dump_path local_cache_dir")),
    ("Inductor's own options, free-form: some take callables, hooks or paths", _names("inductor_compile_config")),
    ("torch ops named by qualified name; not decided", _names("splitting_ops")),
    (_NESTED, _names("pass_config dynamic_shapes_config")),
    (_STATE, _names("""_attention_ops compilation_time encoder_compilation_time disabled_custom_ops enabled_custom_ops
        static_all_moe_layers static_forward_context traced_files""")),
    ("a capture schedule of the newer releases or of multimodal encoders; not decided", _names("""
        cudagraph_decoder_replay decode_cudagraph_capture_request_sizes decoder_replay_cudagraph_capture_sizes
        decoder_replay_trim_threshold encoder_cudagraph_max_frames_per_batch encoder_cudagraph_max_token_budget
        encoder_cudagraph_max_vision_items_per_batch encoder_cudagraph_token_budgets
        max_decode_cudagraph_capture_requests max_decode_cudagraph_capture_tokens max_prefill_cudagraph_capture_tokens
        prefill_cudagraph_capture_token_sizes""")),
))

assert not set(ALLOWED) & set(REFUSED) and not set(ALLOWED_COMPILATION) & set(REFUSED_COMPILATION)


class EngineArgRefused(ValueError):
    """An engine argument the allow-list does not take; ``path`` names it (``compilation_config.cache_dir``)."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def _refusal(path: str, reason: str | None) -> EngineArgRefused:
    why = reason or "not one tunecache knows; only arguments that name an engine variant and load nothing are taken"
    return EngineArgRefused(path, f"engine_args.{path} is not an allowed engine argument: {why} "
                                  f"(the allowed ones: the operator guide's engine arguments table)")


def _object_problem(value: dict[str, Any], table: Mapping[str, Allowed], refused: Mapping[str, str],
                    prefix: str = "") -> EngineArgRefused | None:
    """The first problem of an object's fields against ``table``, by name (sorted), or ``None``."""
    for name in sorted(value, key=str):
        path = prefix + str(name)[:64]
        spec = table.get(name) if isinstance(name, str) else None
        if spec is None:
            return _refusal(path, refused.get(name) if isinstance(name, str) else None)
        if spec.kind == "object" and isinstance(value[name], dict):
            nested = _object_problem(value[name], spec.fields, REFUSED_COMPILATION, path + ".")
            if nested:
                return nested
            continue
        problem = spec.problem(value[name])
        if problem:
            return EngineArgRefused(path, f"engine_args.{path} {problem}")
    return None


def check_engine_args(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` when every argument, and every field of a nested one, is allowed with a value it
    takes; at most :data:`MAX_ENGINE_ARGS`, each JSON of at most :data:`MAX_ENGINE_ARG_CHARS`.

    Raises:
        EngineArgRefused: the first problem (arguments by name), naming the argument.
    """
    if not isinstance(args, dict):
        raise EngineArgRefused("", "engine_args must be a JSON object of vllm.LLM arguments")
    if len(args) > MAX_ENGINE_ARGS:
        raise EngineArgRefused("", f"engine_args has {len(args)} arguments; at most {MAX_ENGINE_ARGS}")
    problem = _object_problem(args, ALLOWED, REFUSED)
    if problem:
        raise problem
    for name, value in args.items():
        try:
            text = _storable_json(value)
        except ValueError as exc:
            raise EngineArgRefused(name, f"engine_args.{name} {exc}") from None
        if len(text) > MAX_ENGINE_ARG_CHARS:
            raise EngineArgRefused(name, f"engine_args.{name}'s value is over {MAX_ENGINE_ARG_CHARS} characters as JSON")
    return args


def allowed_engine_args(args: Any) -> dict[str, Any]:
    """What :func:`check_engine_args` takes of ``args``: each allowed argument whose value it
    takes (of a nested object, its allowed fields; an object left empty is dropped), by name,
    at most :data:`MAX_ENGINE_ARGS`. Pure: for a stored row or what a pod was booted with
    (``{}`` for anything but an object)."""
    if not isinstance(args, dict):
        return {}
    kept: dict[str, Any] = {}
    for name in sorted((n for n in args if isinstance(n, str) and n in ALLOWED)):
        spec, value = ALLOWED[name], args[name]
        if spec.kind == "object":
            if not isinstance(value, dict):
                continue
            value = {f: v for f, v in sorted(value.items(), key=lambda item: str(item[0]))
                     if isinstance(f, str) and f in spec.fields and spec.fields[f].problem(v) is None}
            if not value:
                continue
        elif spec.problem(value) is not None:
            continue
        try:
            if len(_storable_json(value)) > MAX_ENGINE_ARG_CHARS:
                continue
        except ValueError:
            continue
        if len(kept) < MAX_ENGINE_ARGS:
            kept[name] = value
    return kept


#: vLLM engine arguments (``vllm.LLM`` keywords, e.g. ``{"max_model_len": 8192}``) that name
#: an engine variant of a key: what a tuning gives its engine beyond the key, and what a pod
#: of that variant was booted with. Only :data:`ALLOWED` (:func:`check_engine_args`).
EngineArgs = Annotated[dict[str, Any], AfterValidator(check_engine_args)]
