#!/usr/bin/env bash
# Pack what tunecache needs on a GPU machine that has torch (2.11, CUDA 13) but no network
# and none of the project's other dependencies: FlashInfer 0.7.4 with its stack and the
# client's and server's dependencies, as cp312 manylinux wheels unpacked into one tarball, with
# the metadata of tunecache's two distributions.
#
# Usage, from the repository root:  scripts/gpu_bundle.sh [EXTRA_REQUIREMENT ...]
# Output:                           .gpu/site.tar.xz (keep /.gpu/ out of git)
# On the GPU machine (see docs/gpu.md):
#   mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/site.tar.xz \
#     && export PYTHONPATH=/tmp/site:$PWD/client:$PWD/service PYTHONUNBUFFERED=1
set -euo pipefail
out=.gpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64)
# FlashInfer and the parts of its stack a torch image lacks (without dependencies: torch and
# the CUDA libraries are the machine's). nvidia-cutlass-dsl-libs-cu13 (92 MB) is left out, so
# CuTe-DSL backends (and mm_bf16's backend="auto", which checks them) are unavailable.
fi_stack=(flashinfer-python==0.7.4 apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0
          nvidia-cudnn-frontend==1.32.0 nccl4py==0.6.0 nvidia-cutlass-dsl==4.8.1
          nvidia-cutlass-dsl-libs-base==4.8.1 cuda-python)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" "${fi_stack[@]}"
# The project's own dependencies (client and server) and the GPU test's, with theirs.
project=(httpx tenacity pydantic pydantic-settings typer rich fastapi uvicorn sqlalchemy alembic cachetools limits cryptography
         jinja2 pytest pyyaml prometheus-client "$@")
python3 -m pip download -q "${plat[@]}" -d "$work/whl" "${project[@]}"
mkdir -p "$work/site" "$out"
for w in "$work"/whl/*.whl; do (cd "$work/site" && python3 -m zipfile -e "$w" .); done
# tunecache's own two distributions, their metadata only (dist-info: entry points, versions),
# so that `python -m tunecache.cli` finds the server's commands by their entry point; the code
# comes from the checkout's source roots on PYTHONPATH, never from the bundle.
python3 -m pip wheel -q --no-deps -w "$work/tc" ./client .
for w in "$work"/tc/*.whl; do (cd "$work/site" && python3 -m zipfile -e "$w" . && rm -rf tunecache); done
tar -C "$work/site" -cf - . | xz -T0 -6 > "$out/site.tar.xz"
size=$(stat -c %s "$out/site.tar.xz")
echo "$out/site.tar.xz: $((size / 1048576)) MiB ($(ls "$work/whl" | wc -l) wheels)"
[ "$size" -lt $((60 * 1048576)) ] || { echo "too large for one transfer of 64 MiB"; exit 1; }
