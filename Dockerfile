# tunecache's two images, one target each (docs/kubernetes.md builds both; the manifests in
# deploy/kubernetes/ and docker-compose.yml name exactly these):
#
#   docker build --target server -t tunecache:latest .
#   docker build --target tuner --build-arg BASE_IMAGE=vllm/vllm-openai:v0.33.0 -t tunecache-tuner:v0.33.0 .
#
# server: the service's replicas (lookups, artifacts, the API, the dashboard), the `db upgrade`
#   init container, and any pod command (`tunecache pull` in an init container, `import`):
#   no GPU, no vLLM, on a slim Python image (PYTHON_IMAGE).
# tuner: a GPU tuning node, on the fleet's own vLLM image (BASE_IMAGE: the image and tag the
#   fleet's vLLM pods run), so that `tunecache tune --warmup vllm` and the job worker's tunings
#   run the vLLM, FlashInfer, torch, Triton and DeepGEMM the pods run: what a pod installs was
#   built by the same code. Pods need not share anything else with the tuner (HOME, user, cache
#   directories, where the Python packages live): the plugin installs the warm state under the
#   pod's own paths. One vLLM release for the tuner and the pods (a vLLM upgrade builds a new
#   tuner image: docs/operator-guide.md).
#   TUNER_EXTRA=[tuner] adds torch and FlashInfer 0.7.4 for a base without them (the stages
#   warmup only; --warmup vllm then refuses in one line that vLLM is not importable).
ARG PYTHON_IMAGE=python:3.12-slim
ARG BASE_IMAGE=vllm/vllm-openai:v0.33.0

FROM ${PYTHON_IMAGE} AS server
WORKDIR /opt/tunecache
COPY pyproject.toml README.md ./
COPY client ./client
COPY service ./service
COPY migrations ./migrations
# the client with its oci extra: `tunecache import` of a bundle can run in a server pod
RUN python3 -m pip install --no-cache-dir "./client[oci]" .
ENV TUNECACHE_HOST=0.0.0.0 \
    TUNECACHE_PORT=8321 \
    TUNECACHE_DATA_DIR=/var/lib/tunecache
EXPOSE 8321
CMD ["tunecache", "serve"]

FROM ${BASE_IMAGE} AS tuner
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
