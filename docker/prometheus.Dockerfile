# Prometheus 2.42 (Debian bookworm's package) scraping every api replica and evaluating the autoscaling rules of
# deploy/prometheus/bertserve.rules.yml: docker-compose.scale.yml.
# Build from the repository root:  docker build -f docker/prometheus.Dockerfile -t bertserve-prometheus .
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && prometheus --version
COPY docker/prometheus/prometheus.yml /etc/prometheus/prometheus.yml
COPY deploy/prometheus/bertserve.rules.yml /etc/prometheus/bertserve.rules.yml
RUN promtool check config /etc/prometheus/prometheus.yml
USER prometheus
EXPOSE 9090
ENTRYPOINT ["prometheus", "--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/tmp/prometheus", \
            "--storage.tsdb.retention.time=1d", "--web.listen-address=:9090"]
