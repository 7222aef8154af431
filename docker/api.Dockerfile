# syntax=docker/dockerfile:1
# The serving image: FastAPI + grpc.aio + ONNX Runtime (or the Triton client), no torch.
# Dependencies are installed before the sources are copied, so code changes rebuild only the last layers.
# Build from the repository root:  docker build -f docker/api.Dockerfile -t bertserve-api .
# GPU image (ONNX Runtime CUDA):     docker build -f docker/api.Dockerfile --build-arg ORT_PACKAGE=onnxruntime-gpu==1.32.* .

# ---- stage 1: generate the gRPC stubs (grpcio-tools is a build-time tool only) ----------------------------
FROM python:3.11-slim AS stubs
WORKDIR /src
RUN pip install --no-cache-dir grpcio-tools==1.81.1
COPY proto/ proto/
RUN python -m grpc_tools.protoc -Iproto/gen=proto --python_out=. --pyi_out=. --grpc_python_out=. proto/bert/v1/bert.proto

# ---- stage 2: the runtime -----------------------------------------------------------------------------------
FROM python:3.11-slim
ARG ORT_PACKAGE=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app \
    BERTSERVE_BUNDLES_DIR=/models BERTSERVE_HOST=0.0.0.0 BERTSERVE_HTTP_PORT=8000 BERTSERVE_GRPC_PORT=50051
WORKDIR /app

# 1. dependencies: the base dependencies (serving) + the otel and openvino extras, read from pyproject.toml
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['otel'] + p['optional-dependencies']['openvino']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && if [ -n "$ORT_PACKAGE" ]; then pip uninstall -y onnxruntime && pip install "$ORT_PACKAGE"; fi \
 && python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"

# 2. sources and the generated stubs. Every stage's package is copied because `bertserve` composes all
#    subcommands; they import torch only inside command bodies, and this image has none.
COPY bert_model/ bert_model/
COPY bertserve/ bertserve/
COPY export/ export/
COPY service/ service/
COPY loadtests/ loadtests/
COPY proto/__init__.py proto/
COPY proto/bert/ proto/bert/
COPY --from=stubs /src/proto/gen/ proto/gen/
RUN python -c "import sys; sys.modules['torch'] = None; from bertserve.cli import build_app; build_app(); import service.runner"

RUN useradd --system --uid 10001 bertserve
USER bertserve
EXPOSE 8000 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-m", "service.healthcheck", "http://127.0.0.1:8000/health/ready"]
ENTRYPOINT ["python", "-m", "bertserve", "serve"]
