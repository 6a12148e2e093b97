"""Import check for the vLLM bundle of scripts/gpu_vllm_bundle.sh.

Run it with a Python that has torch 2.11 and nothing else, the unpacked bundle on PYTHONPATH:

    PYTHONPATH=/tmp/site python3 scripts/gpu_vllm_check.py [MODEL_DIR]

It imports what vLLM 0.25's offline engine (engine core, GPU worker, both model runners, the
Llama model, the FlashInfer attention backend, kernel warmup), FlashInfer 0.6.13 and every
tunecache module import, checks that tunecache's vllm.general_plugins entry point is found, and, given MODEL_DIR
(a folder with a Llama config.json), builds an engine config (attention backend FLASHINFER).
Exit status 0 when nothing failed to import.

On a machine without a GPU, FAKE_CUDA=1 makes vLLM take the CUDA platform (an H200, sm90), so
that imports guarded by current_platform.is_cuda() run too. vLLM's extensions need
libcuda.so.1: point LD_LIBRARY_PATH at a folder holding an empty stub of it
(`echo 'int x;' | gcc -shared -x c -o DIR/libcuda.so.1 -Wl,-soname,libcuda.so.1 -`).
"""

import importlib
import json
import os
import sys
import traceback

cfg_dir = sys.argv[1] if len(sys.argv) > 1 else None
bad = []

if os.environ.get("FAKE_CUDA"):
    # Bind lazily so that the extensions load against the stub libcuda.so.1 (their torch ops
    # are registered as on a GPU machine).
    sys.setdlopenflags(os.RTLD_LAZY)
    # An empty CUDA_VISIBLE_DEVICES makes vLLM keep Triton with no active driver (HAS_TRITON),
    # as on a GPU machine (model runner V2, Triton kernels).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import vllm.platforms as P
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    def _has_cap(cls, cap, device_id=0):
        cap = divmod(cap, 10) if isinstance(cap, int) else tuple(cap)
        return (9, 0) >= cap

    CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(9, 0))
    CudaPlatform.has_device_capability = classmethod(_has_cap)
    CudaPlatform.get_device_name = classmethod(lambda cls, device_id=0: "NVIDIA H200")
    CudaPlatform.device_count = classmethod(lambda cls: 1)
    P._current_platform = CudaPlatform()
    print("FAKE_CUDA: current_platform =", type(P.current_platform).__name__)

MODULES = """
vllm vllm.entrypoints.llm vllm.v1.engine.core vllm.v1.engine.core_client vllm.v1.engine.llm_engine
vllm.v1.executor.multiproc_executor vllm.v1.executor.uniproc_executor
vllm.v1.worker.gpu_worker vllm.v1.worker.gpu_model_runner
vllm.v1.worker.gpu.model_runner vllm.v1.worker.gpu.warmup vllm.v1.worker.gpu.sample.sampler
vllm.model_executor.models.llama vllm.model_executor.model_loader vllm.model_executor.model_loader.dummy_loader
vllm.model_executor.warmup.kernel_warmup vllm.v1.sample.sampler
vllm.model_executor.layers.quantization.auto_awq vllm.model_executor.layers.quantization.fp8 vllm.utils.deep_gemm
vllm.v1.attention.backends.flashinfer vllm.v1.attention.backends.triton_attn
vllm.v1.attention.backends.flex_attention vllm.v1.attention.backends.flash_attn
flashinfer flashinfer.prefill flashinfer.decode flashinfer.jit flashinfer.page flashinfer.sampling
flashinfer.norm flashinfer.activation flashinfer.rope flashinfer.autotuner
tunecache.cli tunecache.cli_kit tunecache.client.boot.hooks tunecache.service.app tunecache.service.cli
""".split()

for name in MODULES:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        bad.append((name, repr(e)))

import pkgutil  # noqa: E402

import tunecache  # noqa: E402

for info in pkgutil.walk_packages(tunecache.__path__, "tunecache."):  # every tunecache module
    if info.name.rsplit(".", 1)[-1] != "__main__" and info.name not in MODULES:
        try:
            importlib.import_module(info.name)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            bad.append((info.name, repr(e)))

from importlib.metadata import entry_points  # noqa: E402

plugins = entry_points(group="vllm.general_plugins")
if not any(e.name == "tunecache" for e in plugins):
    bad.append(("entry point vllm.general_plugins:tunecache", "missing"))
if not any(e.name == "server" for e in entry_points(group="tunecache.cli")):
    bad.append(("entry point tunecache.cli:server", "missing"))
for e in plugins:
    try:
        e.load()
    except Exception as exc:  # noqa: BLE001
        bad.append((f"load {e.name}", repr(exc)))

if cfg_dir:
    from vllm.engine.arg_utils import EngineArgs

    try:
        vc = EngineArgs(
            model=cfg_dir, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
            attention_config={"backend": "FLASHINFER"},
        ).create_engine_config()
        print("create_engine_config: OK; use_v2_model_runner =", vc.use_v2_model_runner)
    except ImportError as e:
        traceback.print_exc()
        bad.append(("create_engine_config", repr(e)))
    except Exception as e:  # noqa: BLE001
        print("create_engine_config failed, not on an import (expected without a GPU):",
              type(e).__name__, str(e)[:300])

if os.environ.get("DUMP_MODULES"):
    with open(os.environ["DUMP_MODULES"], "w") as f:
        json.dump(sorted(sys.modules), f)
print("FAILED:" if bad else "IMPORT CHECK OK", *bad, sep="\n  ")
sys.exit(1 if bad else 0)
