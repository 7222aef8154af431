# The load-test image: locust + the project's load-test runner (`bertserve loadtest`) and the gRPC stubs; no
# torch, no onnx. Build from the repository root:  docker build -f docker/loadtest.Dockerfile -t bertserve-loadtest .

# ---- stage 1: the gRPC stubs (grpcio-tools is a build-time tool only) ---------------------------------------
FROM python:3.11-slim AS stubs
WORKDIR /src
RUN pip install --no-cache-dir grpcio-tools==1.81.1
COPY proto/ proto/
RUN python -m grpc_tools.protoc -Iproto/gen=proto --python_out=. --pyi_out=. --grpc_python_out=. proto/bert/v1/bert.proto

# ---- stage 2: the runtime ------------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app
WORKDIR /app

# 1. dependencies: base + loadtest extra from pyproject.toml (no torch)
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['loadtest']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('torch', 'onnx')))"

# 2. sources and the generated stubs; every module `bertserve loadtest` and its locust users import is
#    imported once here, without torch and onnx
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
RUN python docker/import_check.py loadtest

# Runs as root: it writes its results into a bind-mounted host folder (compose: ./loadtests/results), which
# another uid could not write to. It serves nothing.
ENTRYPOINT ["python", "-m", "bertserve"]
