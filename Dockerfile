# tunecache service image for a GPU node: the service, the client and the tuner
# (torch from the base image, FlashInfer from the [tuner] extra).
# BASE_IMAGE must carry a CUDA build of torch that flashinfer-python 0.7.4 supports.
ARG BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

WORKDIR /opt/tunecache
COPY pyproject.toml README.md ./
COPY client ./client
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir ./client '.[tuner]'

ENV TUNECACHE_HOST=0.0.0.0 \
    TUNECACHE_PORT=8321 \
    TUNECACHE_DATA_DIR=/var/lib/tunecache
EXPOSE 8321
CMD ["tunecache", "serve"]
