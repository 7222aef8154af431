# syntax=docker/dockerfile:1
# The load-test image: locust + the project's load-test runner (`bertserve loadtest`), no torch.
# Build from the repository root:  docker build -f docker/loadtest.Dockerfile -t bertserve-loadtest .
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app
WORKDIR /app

# 1. dependencies: base + loadtest extra from pyproject.toml (no torch)
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['loadtest']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt

# 2. sources (stubs are generated on first import when missing; grpcio-tools is not needed by locust users)
COPY bert_model/ bert_model/
COPY bertserve/ bertserve/
COPY export/ export/
COPY service/ service/
COPY loadtests/ loadtests/
COPY proto/ proto/
ENTRYPOINT ["python", "-m", "bertserve"]
