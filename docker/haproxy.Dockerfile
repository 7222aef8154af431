# HAProxy 2.6 (Debian bookworm's package) in front of the api replicas: docker-compose.scale.yml.
# Build from the repository root:  docker build -f docker/haproxy.Dockerfile -t bertserve-haproxy .
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/* \
 && haproxy -v
COPY docker/haproxy/haproxy.cfg /etc/haproxy/haproxy.cfg
RUN haproxy -c -f /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8000 50051 8404
# -W master-worker (a reload without dropping connections: `docker kill -s USR2`), -db stays in the foreground
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
