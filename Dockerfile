# tunecache's image for a GPU tuning node: the fleet's own vLLM image with tunecache added, so
# that `tunecache tune --warmup vllm` (and the job worker's tunings) run the vLLM, FlashInfer,
# torch, Triton and DeepGEMM that the fleet's pods run: what a pod installs was built by the
# same code. BASE_IMAGE: the image (and tag) of the fleet's vLLM pods.
# Pods need not share anything else with the tuner (HOME, user, cache directories, where the
# Python packages live): the plugin installs the warm state under the pod's own paths.
#   docker build --build-arg BASE_IMAGE=vllm/vllm-openai:v0.25.0 -t tunecache-tuner:v0.25.0 .
# The server replicas need no GPU or vLLM: build them on a plain Python image,
#   docker build --build-arg BASE_IMAGE=python:3.12-slim -t tunecache:latest .
# TUNER_EXTRA=[tuner] adds torch and FlashInfer 0.7.4 for a base without them (the stages
# warmup only; --warmup vllm then refuses in one line that vLLM is not importable).
ARG BASE_IMAGE=vllm/vllm-openai:v0.25.0
FROM ${BASE_IMAGE}
ARG TUNER_EXTRA=

WORKDIR /opt/tunecache
COPY pyproject.toml README.md ./
COPY client ./client
COPY service ./service
COPY migrations ./migrations
# FlashInfer, torch and vLLM stay the base image's (no [tuner] extra by default: its FlashInfer
# pin would replace the one the fleet's vLLM runs with)
RUN python3 -m pip install --no-cache-dir ./client ".${TUNER_EXTRA}"

ENV TUNECACHE_HOST=0.0.0.0 \
    TUNECACHE_PORT=8321 \
    TUNECACHE_DATA_DIR=/var/lib/tunecache
EXPOSE 8321
# vLLM's images start `vllm serve`; this one starts the service
ENTRYPOINT []
CMD ["tunecache", "serve"]
