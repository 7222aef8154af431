"""docker-compose.scale.yml over docker-compose.yml, resolved without a Docker engine (`make scale-test` runs it).

The replicas must publish no host port (N of them would collide), the balancer and Prometheus publish on
loopback only, and the balancer's configuration must parse (HAProxy's own check runs in its image's build).
"""

from __future__ import annotations

import json
import re

from tests.service.server import REPO
from tests.service.test_compose import compose

HAPROXY_CFG = (REPO / "docker" / "haproxy" / "haproxy.cfg").read_text()


def test_the_scale_override_leaves_the_replicas_without_host_ports() -> None:
    result = compose("-f", str(REPO / "docker-compose.scale.yml"), "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert not services["api"].get("ports"), services["api"].get("ports")
    for name in ("balancer", "prometheus"):
        ports = services[name]["ports"]
        assert ports and all(port["host_ip"] == "127.0.0.1" for port in ports), (name, ports)
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    balancer = {port["target"] for port in services["balancer"]["ports"]}
    assert balancer == {8000, 50051, 8404}


def test_the_balancer_checks_readiness_and_finds_every_replica_through_docker_dns() -> None:
    backends = dict(re.findall(r"^backend (\w+)\n((?:    .*\n|\n)*?)(?=^\S|\Z)", HAPROXY_CFG, flags=re.M))
    assert set(backends) == {"api_rest", "api_grpc"}
    for body in backends.values():
        assert "option httpchk GET /health/ready" in body
    assert "server-template api 8 api:8000" in backends["api_rest"]
    grpc_line = r"^    server (api\d) api:50051 proto h2 check-proto h1 port 8000$"  # checked over HTTP/1.1
    grpc_servers = re.findall(grpc_line, backends["api_grpc"], re.M)
    assert grpc_servers == [f"api{i}" for i in range(1, 9)]
    assert re.search(r"^    nameserver \w+ 127\.0\.0\.11:53$", HAPROXY_CFG, re.M)  # Docker's embedded DNS
    assert re.search(r"^    bind :50051 proto h2$", HAPROXY_CFG, re.M)  # h2c in front: gRPC balanced per call
    retry = re.search(r"^    retry-on (.+)$", HAPROXY_CFG, re.M)
    assert retry and set(retry.group(1).split()) == {"conn-failure", "empty-response", "503"}
