#!/usr/bin/env bash
# On the H200 machine (docs/gpu.md): FlashInfer 0.6.13 (the version vLLM 0.25 pins) through
# tunecache's tuner, store and pull, and DeepGEMM (the copy vLLM 0.25 ships) through the
# deep_gemm stage and a pod's install. Needs .gpu/site.tar.xz (scripts/gpu_bundle.sh) and
# .gpu/extra.tar.xz (docs/gpu.md, "FlashInfer 0.6.13 and DeepGEMM"): site0613/ = the
# flashinfer-python 0.6.13 wheel unpacked, dg/deep_gemm = vllm/third_party/deep_gemm of the
# vllm 0.25.0 wheel (cp312 _C only). Results under $OUT (default results/gpu/fi0613-deep-gemm).
set -uo pipefail
out=${OUT:-results/gpu/fi0613-deep-gemm}
mkdir -p "$out" /tmp/site /tmp/extra
tar -C /tmp/site -xJf .gpu/site.tar.xz
tar -C /tmp/extra -xJf .gpu/extra.tar.xz
export PYTHONUNBUFFERED=1
base=/tmp/site:$PWD/client:$PWD/service
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"

# 1. FlashInfer 0.6.13 first on the path: tune (gemm: cudnn, and cublaslt, which 0.6.13
#    refuses on sm90), serve, pull, 0 misses.
PYTHONPATH=/tmp/extra/site0613:$base python -c 'import flashinfer, json; from flashinfer.autotuner import _collect_metadata; from flashinfer.jit import env; print(json.dumps({"version": flashinfer.__version__, "metadata": _collect_metadata(), "workspace": str(env.FLASHINFER_WORKSPACE_DIR)}))' \
  > "$out/fi0613-environment.json" 2> "$out/fi0613-environment.err"
PYTHONPATH=/tmp/extra/site0613:$base timeout 300 python scripts/gpu_e2e.py --stages gemm \
  --max-num-batched-tokens 1024 --out "$out/fi0613" --work /tmp/fi0613 > "$out/fi0613.out" 2>&1
echo "fi0613 exit $?" >> "$out/exits.txt"
cp /tmp/fi0613/installed/*.json "$out/fi0613/" 2>/dev/null

# 2. DeepGEMM (vLLM 0.25's copy) with FlashInfer 0.7.4: the deep_gemm stage, a signed run,
#    a pod's install, a warm replay in a fresh process.
PYTHONPATH=/tmp/extra/dg:$base timeout 280 python scripts/gpu_deep_gemm.py --max-num-batched-tokens 512 \
  --out "$out/deep_gemm" --work /tmp/dg-work > "$out/deep_gemm.out" 2>&1
echo "deep_gemm exit $?" >> "$out/exits.txt"
find /tmp/dg-work/tune -maxdepth 3 | head -50 > "$out/deep_gemm/tune-dir.txt" 2>/dev/null
cat "$out/exits.txt"
