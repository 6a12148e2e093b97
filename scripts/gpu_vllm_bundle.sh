#!/usr/bin/env bash
# Pack vLLM 0.25.0 (offline engine, FlashInfer attention backend) with FlashInfer 0.6.13 and
# everything tunecache's client and server need, for an offline GPU machine that has Python
# 3.12, torch 2.11.0+cu130 (with its own dependencies: triton, the nvidia-* CUDA libraries,
# cuda-bindings, sympy, networkx, fsspec, setuptools) and the CUDA toolkit (nvcc), and nothing
# else. cp312 manylinux wheels at pinned versions, unpacked into one site folder (dist-info
# folders kept, so that importlib.metadata finds vLLM's plugins), pruned, packed with xz and
# split into parts under 60 MiB. tunecache's own two wheels go to a separate small tarball,
# which `--tunecache-only` rebuilds alone when the source changes.
#
# Usage, from anywhere in the repository:
#   scripts/gpu_vllm_bundle.sh                    # everything (about 15 minutes on 2 cores)
#   scripts/gpu_vllm_bundle.sh --tunecache-only   # only .gpu/vllm/tunecache-site.tar.xz
# Environment: XZ_LEVEL (default 9), CHECK_PYTHON=<python with only torch 2.11> to run
#   scripts/gpu_vllm_check.py on the packed result here (FAKE_CUDA: no GPU needed).
# Output (keep /.gpu/ out of git; the script adds it to .git/info/exclude):
#   .gpu/vllm/site.tar.xz.partaa, .partab, ...  the site, split with `split -b 58M`
#   .gpu/vllm/tunecache-site.tar.xz             tunecache-client and tunecache-server
#   .gpu/vllm/MANIFEST.txt                      sha256s, sizes, distributions, what was pruned
# On the GPU machine, with the parts staged in /tmp (one part per command):
#   cat /tmp/site.tar.xz.part* > /tmp/site.tar.xz && sha256sum /tmp/site.tar.xz  # = MANIFEST
#   mkdir -p /tmp/site && tar -C /tmp/site -xJf /tmp/site.tar.xz \
#     && rm -rf /tmp/site/tunecache /tmp/site/tunecache_*.dist-info \
#     && tar -C /tmp/site -xJf /tmp/tunecache-site.tar.xz
#   export PYTHONPATH=/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
#   python3 scripts/gpu_vllm_check.py tests/fixtures/models/llama-3.1-8b   # IMPORT CHECK OK
# FlashInfer JIT-compiles its kernels there: it needs nvcc and ninja on PATH (the machine's,
# or the bundled /tmp/site/bin/ninja). PYTHONPATH must be exported: vLLM's engine core and
# workers are new processes. vLLM 0.25 no longer reads VLLM_ATTENTION_BACKEND (it warns that
# the variable is unknown and picks FLASH_ATTN on Hopper): pass attention_backend="FLASHINFER"
# (or attention_config={"backend": "FLASHINFER"}) to LLM(...).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
case "${1:-}" in
  "") ;;
  --tunecache-only) mode=tunecache ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
out=.gpu/vllm
xz_level=${XZ_LEVEL:-9}
py=${PYTHON:-python3}
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" "$out"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_vllm_bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT

# cp312 wheels for glibc >= 2.34 x86-64 (pip matches each manylinux_2_N tag exactly).
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
for n in 5 12 17 24 25 26 27 28 31 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done

# Every distribution of the site, pinned: the versions pip resolved for vllm==0.25.0 (with
# flashinfer-python==0.6.13 and apache-tvm-ffi==0.1.9, which vLLM pins) together with
# tunecache's dependencies, on Python 3.12; numpy at the GPU image's version. Downloaded without
# dependencies: torch, triton, the nvidia-* CUDA wheels, cuda-bindings, sympy, networkx, fsspec
# and setuptools are the machine's, and vLLM's optional extras are left out (see MANIFEST.txt).
pins=(
  # vLLM and what its engine, GPU worker, Llama model and attention backends import
  vllm==0.25.0 numpy==2.5.2 regex==2026.11.19 cachetools==8.0.2 psutil==7.2.2
  sentencepiece==0.2.3 requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1
  charset-normalizer==3.5.3 tqdm==4.70.1 blake3==1.0.11 py-cpuinfo==9.0.0
  transformers==5.24.0 tokenizers==0.23.3 huggingface_hub==2.4.0 httpx2==2.16.2
  httpcore2==2.16.2 truststore==0.10.5 safetensors==0.8.0 protobuf==7.36.2
  fastapi==0.136.3 starlette==1.10.0 annotated-doc==0.0.7 pydantic==2.14.4
  pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0 prometheus_client==0.26.0 pillow==13.0.0 aiohttp==3.14.5
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1
  propcache==0.5.4 yarl==1.25.1 openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 anyio==4.16.0
  httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 openai-harmony==0.0.8
  partial-json-parser==0.2.1.1.post7 msgspec==0.23.0 pyzmq==27.3.0 cbor2==6.3.0
  cloudpickle==3.1.3 pybase64==1.5.1 uvloop==0.23.0 PyYAML==6.0.4 filelock==4.3.1
  einops==0.8.2 setproctitle==1.3.8 six==1.17.0 email-validator==2.4.0 dnspython==2.9.2
  llguidance==1.7.6 xgrammar==0.2.3
  # quantized checkpoints: ModelConfig._verify_quantization imports every method's config (block fp8 too)
  compressed-tensors==0.17.0 loguru==0.7.3
  # FlashInfer and the parts of its stack a torch machine lacks
  flashinfer-python==0.6.13 apache-tvm-ffi==0.1.9 nvidia-cudnn-frontend==1.28.0
  nvidia-ml-py==13.615.71 tabulate==0.10.0 click==8.5.1 packaging==26.4 ninja==1.13.2
  # tunecache (client and server)
  tenacity==9.2.1 pydantic-settings==2.16.3 python-dotenv==1.2.4 typer==0.29.2
  shellingham==1.5.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 uvicorn==0.54.0 httptools==0.9.0
  watchfiles==1.3.0 websockets==17.4 SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3
  Jinja2==3.1.6 MarkupSafe==3.0.4 psycopg==3.3.9 psycopg-binary==3.3.9 limits==5.8.0
  Deprecated==3.0.1 wrapt==2.5.2 python-multipart==0.0.34 fastapi-offline==1.7.7
  # boto3 (the S3 artifact store) is imported only when TUNECACHE_ARTIFACT_STORE names s3://, left out
)

# Unpacks wheels into one folder as an installer would: .data/purelib and platlib merged into
# it, file modes kept (python -m zipfile -e drops the executable bits), a file that two wheels
# both carry reported.
cat > "$work/unpack.py" <<'EOF'
import os, shutil, sys, zipfile
site, owner = sys.argv[1], {}
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if info.filename.endswith("/"):
                continue
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                kind = parts[1]
                rel = ("/".join(parts[2:]) if kind in ("purelib", "platlib") else
                       "bin/" + "/".join(parts[2:]) if kind == "scripts" else
                       "_data/" + "/".join(parts[1:]))
            else:
                rel = info.filename
            if rel in owner and not rel.endswith("__init__.py"):
                print(f"unpack: {rel} in {os.path.basename(owner[rel])} and {os.path.basename(whl)}")
            owner[rel] = whl
            dest = os.path.join(site, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
            if (info.external_attr >> 16) & 0o111:
                os.chmod(dest, 0o755)
EOF

pack() {  # pack DIR FILE: a reproducible tar of DIR, xz-compressed
  tar -C "$1" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2025-01-01 00:00Z' -cf - . \
    | nice -n 10 xz -T0 "-$xz_level" > "$2"
}

tunecache_section() {
  local f=$out/tunecache-site.tar.xz
  echo "## tunecache-site.tar.xz (rebuilt alone by --tunecache-only; unpack into /tmp/site after the site)"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) from commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- client service migrations pyproject.toml || echo ' plus uncommitted changes')"
  echo "sha256: $(sha256sum "$f" | cut -d' ' -f1)  size: $(stat -c %s "$f") bytes"
  echo "wheels: $(cd "$work/tc" && ls *.whl | tr '\n' ' ')"
}

# tunecache's two distributions, from the working tree.
nice -n 10 "$py" -m pip wheel -q --no-deps ./client . -w "$work/tc"
mkdir -p "$work/tcsite"
"$py" "$work/unpack.py" "$work/tcsite" "$work"/tc/*.whl
pack "$work/tcsite" "$out/tunecache-site.tar.xz"
if [ "$mode" = tunecache ]; then
  if [ -f "$out/MANIFEST.txt" ]; then
    sed -i '/^## tunecache-site.tar.xz/,$d' "$out/MANIFEST.txt"
    tunecache_section >> "$out/MANIFEST.txt"
  fi
  echo "$out/tunecache-site.tar.xz: $(stat -c %s "$out/tunecache-site.tar.xz") bytes"
  exit 0
fi

nice -n 10 "$py" -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" "${pins[@]}"
site=$work/site
mkdir -p "$site"
nice -n 10 "$py" "$work/unpack.py" "$site" "$work"/whl/*.whl

# Pruned: what nothing on the paths above imports (each checked in vLLM's and FlashInfer's
# source; scripts/gpu_vllm_check.py passes without them).
prune=(
  "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so|flash-attention 2 kernels (182 MB, 52 MB packed): loaded in a try; _vllm_fa3_C (kept, Hopper) is enough for vllm.vllm_flash_attn to import, which vllm.model_executor.layers.attention needs on CUDA"
  "vllm/_moe_C_stable_libtorch.abi3.so|fused-MoE kernels (44 MB, 38 MB packed): imported under contextlib.suppress(ImportError) in CudaPlatform.import_kernels; only MoE layers and MoE-LoRA call torch.ops._moe_C (Llama is dense). MoE models will not run"
  "vllm/vllm-rs|the Rust frontend binary (36 MB), used only with VLLM_RUST_FRONTEND_PATH"
  "vllm/third_party/fmha_sm100|SM100 sparse FMHA sources (30 MB), imported lazily by the MiniMax-M3 model only"
  "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so|DeepGEMM for other Pythons (cp312 kept)"
  "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so|DeepGEMM for other Pythons (cp312 kept)"
  "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so|DeepGEMM for other Pythons (cp312 kept)"
  "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so|DeepGEMM for other Pythons (cp312 kept)"
  "xgrammar/lib|libxgrammar.a (63 MB), a static library for C++ builds; Python loads libxgrammar_bindings.so"
  "flashinfer/data/cutlass/examples|CUTLASS examples, not on FlashInfer's JIT include paths"
  "flashinfer/data/cutlass/test|CUTLASS tests, likewise"
  "flashinfer/data/cutlass/python|CUTLASS's Python DSL sources (FlashInfer's CuTe-DSL kernels use the nvidia-cutlass-dsl wheel, left out)"
  "flashinfer/data/cccl/benchmarks|CCCL benchmarks, not on the JIT include paths (cub, libcudacxx/include, thrust)"
  "flashinfer/data/cccl/ci|CCCL CI files, likewise"
  "flashinfer/data/cccl/docs|CCCL docs, likewise"
  "flashinfer/data/cccl/python|CCCL's Python package, likewise"
)
for entry in "${prune[@]}"; do
  path=${entry%%|*}
  [ -e "$site/$path" ] || { echo "prune: $path is not in the site (has the wheel changed?)"; exit 1; }
  rm -rf "${site:?}/$path"
done
pth=$(cd "$site" && ls *.pth 2>/dev/null || true)

pack "$site" "$work/site.tar.xz"
sha=$(sha256sum "$work/site.tar.xz" | cut -d' ' -f1)
rm -f "$out"/site.tar.xz.part*
split -b 58M "$work/site.tar.xz" "$out/site.tar.xz.part"

{
  echo "# vLLM 0.25.0 + FlashInfer 0.6.13 + tunecache dependencies, for Python 3.12 / torch 2.11.0+cu130 (x86-64)"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) by scripts/gpu_vllm_bundle.sh (xz -$xz_level)"
  echo
  echo "## site.tar.xz: join the parts (cat site.tar.xz.part* > site.tar.xz), then tar -C /tmp/site -xJf site.tar.xz"
  echo "sha256 of the joined site.tar.xz: $sha"
  echo "size: $(stat -c %s "$work/site.tar.xz") bytes packed, $(du -sb "$site" | cut -f1) bytes unpacked"
  for p in "$out"/site.tar.xz.part*; do echo "part $(basename "$p"): $(stat -c %s "$p") bytes"; done
  echo
  echo "## PYTHONPATH on the GPU machine"
  echo "PYTHONPATH=/tmp/site"
  echo "extra PYTHONPATH folders for .pth-based packages: ${pth:-none (the site has no .pth file)}"
  echo "PATH: FlashInfer's JIT runs nvcc and ninja: the machine's, else append /tmp/site/bin (ninja $(printf '%s\n' "${pins[@]}" | sed -n 's/^ninja==//p'))"
  echo "engine: vLLM 0.25 ignores VLLM_ATTENTION_BACKEND; pass attention_backend=\"FLASHINFER\" to LLM(...)"
  echo "glibc needed: $(cd "$work/whl" && ls | "$py" -c 'import re, sys
need = [min(int(n) for n in re.findall(r"manylinux_2_(\d+)", w.replace("manylinux2014", "manylinux_2_17").replace("manylinux2010", "manylinux_2_12").replace("manylinux1", "manylinux_2_5")) or [0]) for w in sys.stdin.read().split()]
print(f"2.{max(need)} or newer (the highest of the wheels\x27 lowest manylinux tags)")')"
  echo
  echo "## distributions ($(ls -d "$site"/*.dist-info | wc -l), site part)"
  (cd "$site" && ls -d *.dist-info | sed 's/\.dist-info$//; s/-\([^-]*\)$/ \1/')
  echo
  echo "## left out on purpose (the machine has them, or nothing on the engine's path imports them)"
  echo "torch, triton, nvidia-* CUDA wheels, cuda-bindings, cuda-pathfinder, sympy, networkx, fsspec, setuptools: the machine's (torch 2.11 brings them)"
  echo "flashinfer-cubin (458 MB): FlashInfer JIT-compiles with nvcc instead; without it vLLM probes NVIDIA's artifactory once (5 s timeout, offline: TRT-LLM/XQA attention off)"
  echo "nvidia-cutlass-dsl (+libs), cuda-tile, quack-kernels, humming-kernels, tilelang, tokenspeed-mla: CuTe-DSL / special kernels, imports guarded"
  echo "torchvision, torchaudio, torchcodec, PyNvVideoCodec, opencv-python-headless, mistral_common: multimodal only, imports guarded"
  echo "opentelemetry-*, grpcio: tracing, import guarded in vllm.tracing"
  echo "numba, fastsafetensors, depyf, nvtx, tiktoken, outlines_core, lm-format-enforcer, diskcache, lark: spec decoding, other loaders, compile debugging, other structured-output backends"
  echo "anthropic, mcp, model-hosting-container-standards, prometheus-fastapi-instrumentator, ray: the OpenAI/Anthropic server and Ray only"
  echo
  echo "## pruned from the unpacked wheels"
  for entry in "${prune[@]}"; do echo "${entry%%|*}: ${entry#*|}"; done
  echo
  tunecache_section
} > "$out/MANIFEST.txt"

ls -l "$out"
if [ -n "${CHECK_PYTHON:-}" ]; then  # the import check on the packed result, no GPU needed
  repo=$PWD c=$work/check
  mkdir -p "$c/site" "$c/stub"
  cat "$out"/site.tar.xz.part* | xz -dc | tar -C "$c/site" -xf -
  tar -C "$c/site" -xJf "$out/tunecache-site.tar.xz"
  echo 'int cuda_stub;' | gcc -shared -x c -o "$c/stub/libcuda.so.1" -Wl,-soname,libcuda.so.1 -
  status=0
  for fake in "" 1; do
    (cd "$c" && FAKE_CUDA=$fake LD_LIBRARY_PATH=$c/stub PYTHONPATH=$c/site nice -n 10 "$CHECK_PYTHON" \
       "$repo/scripts/gpu_vllm_check.py" "$repo/tests/fixtures/models/llama-3.1-8b" > "$c/log" 2>&1) || status=1
    grep -E '^FAKE_CUDA|^create_engine_config|^IMPORT CHECK|^FAILED|^  \(' "$c/log" || tail -20 "$c/log"
  done
  exit $status
fi
