"""The Kubernetes manifests as rendered by `kubectl kustomize`: the stop arithmetic, probes, the hardened pod, the
autoscalers' schema and signal. `make deploy-check` validates the same renders against Kubernetes' own schemas."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import jsonschema_rs
import pytest
import yaml

from service.http_api.app import create_app
from service.serve import QUIET_MAX_S, UVICORN_MARGIN_S
from service.settings import ServiceSettings
from tests.deploy.keda_schema import SCALED_OBJECT
from tests.service.server import REPO

KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES / "overlays").iterdir() if path.is_dir())
RULES = REPO / "deploy" / "prometheus" / "bertserve.rules.yml"
ADAPTER_RULES = KUBERNETES / "components" / "hpa" / "prometheus-adapter-rules.yaml"
Objects = dict[tuple[str, str], dict[str, Any]]


def render(overlay: str) -> Objects:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the overlays cannot be rendered (it ships kustomize)")
    out = subprocess.run(
        ["kubectl", "kustomize", str(KUBERNETES / "overlays" / overlay)], capture_output=True, text=True, check=True
    ).stdout
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(out) if doc}


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> Objects:
    return render(request.param)


def api_pod(objects: Objects) -> dict[str, Any]:
    return objects[("Deployment", "bertserve-api")]["spec"]["template"]["spec"]


def settings_of(objects: Objects, monkeypatch: pytest.MonkeyPatch) -> ServiceSettings:
    """The api's settings as the pod gets them: its ConfigMap over the defaults (this process's env left out)."""
    for name in [name for name in __import__("os").environ if name.startswith("BERTSERVE_")]:
        monkeypatch.delenv(name)
    (container,) = api_pod(objects)["containers"]
    (source,) = container["envFrom"]
    data = objects[("ConfigMap", source["configMapRef"]["name"])]["data"]
    return ServiceSettings(**{key.removeprefix("BERTSERVE_").lower(): value for key, value in data.items()})


def test_every_overlay_is_rendered() -> None:
    assert set(OVERLAYS) >= {"cpu", "gpu"}


def test_the_grace_period_covers_prestop_drain_and_the_shutdown_wait(
    rendered: Objects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """preStop, then SIGTERM: drain, the listener's quiet close, in-flight requests of both front doors together
    for the grace period, then what remains answered 503 and the last running batch finished (service/serve.py)."""
    settings = settings_of(rendered, monkeypatch)
    pod = api_pod(rendered)
    pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + settings.drain_s + QUIET_MAX_S + settings.shutdown_grace_s + UVICORN_MARGIN_S
    assert pod["terminationGracePeriodSeconds"] >= needed, (pod["terminationGracePeriodSeconds"], needed)
    assert pre_stop >= 3  # endpoints and every node's kube-proxy need a few seconds to drop the pod
    # the drain outlasts the readiness probe's detection, so a balancer that probes takes the pod out first
    readiness = pod["containers"][0]["readinessProbe"]
    assert settings.drain_s > readiness["periodSeconds"] * readiness["failureThreshold"]
    assert settings.grpc_max_connection_age_grace_s >= settings.request_timeout_s


def test_probes_use_the_servers_health_routes(rendered: Objects) -> None:
    (container,) = api_pod(rendered)["containers"]
    probes = ("startupProbe", "readinessProbe", "livenessProbe")
    paths = [container[probe]["httpGet"]["path"] for probe in probes]
    assert paths == ["/health/ready", "/health/ready", "/health/live"]
    routes = {getattr(route, "path", None) for route in create_app(ServiceSettings(models=["unused"])).routes}
    assert {"/health/ready", "/health/live", "/metrics"} <= routes
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # loading and warm-up of four models
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container["args"][2:] == ["--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"])]


def test_the_pod_is_hardened_and_runs_as_the_images_user(rendered: Objects) -> None:
    dockerfile = (REPO / "docker" / "api.Dockerfile").read_text()
    uid = int(re.search(r"useradd .*--uid (\d+) (\w+)", dockerfile).group(1))  # type: ignore[union-attr]
    pod = api_pod(rendered)
    assert pod["securityContext"]["runAsUser"] == uid and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    key = next(env for env in container["env"] if env["name"] == "BERTSERVE_API_KEY")
    assert set(key["valueFrom"]) == {"secretKeyRef"}
    assert container["resources"]["requests"].keys() >= {"cpu", "memory"}


def test_services_disruption_budget_and_network_policy(rendered: Objects) -> None:
    service = rendered[("Service", "bertserve-api")]["spec"]
    protocols = {port["name"]: port.get("appProtocol") for port in service["ports"]}
    assert protocols == {"http": "http", "grpc": "kubernetes.io/h2c"}
    headless = rendered[("Service", "bertserve-api-grpc")]["spec"]
    assert headless["clusterIP"] == "None" and [p["appProtocol"] for p in headless["ports"]] == ["kubernetes.io/h2c"]
    assert rendered[("PodDisruptionBudget", "bertserve-api")]["spec"]["maxUnavailable"] == 1
    policy = rendered[("NetworkPolicy", "bertserve-api")]["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert {port["port"] for rule in policy["ingress"] for port in rule["ports"]} == {8000, 50051}


def test_the_gpu_overlay_puts_triton_on_gpu_nodes_behind_the_api() -> None:
    objects = render("gpu")
    pod = objects[("Deployment", "triton")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--model-repository=/models" in container["args"]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    claims = {name for kind, name in objects if kind == "PersistentVolumeClaim"}
    assert models["persistentVolumeClaim"]["claimName"] in claims
    (source,) = api_pod(objects)["containers"][0]["envFrom"]
    data = objects[("ConfigMap", source["configMapRef"]["name"])]["data"]
    assert data["BERTSERVE_BACKEND"] == "triton"
    host, port = data["BERTSERVE_TRITON_URL"].split(":")
    assert int(port) in {p["port"] for p in objects[("Service", host)]["spec"]["ports"]}
    egress = objects[("NetworkPolicy", "bertserve-api")]["spec"]["egress"]
    assert any(rule.get("to") and {p["port"] for p in rule["ports"]} == {int(port)} for rule in egress)


# ---- autoscaling ----------------------------------------------------------------------------------------
def scaled_objects(objects: Objects) -> list[dict[str, Any]]:
    return [doc for (kind, _), doc in objects.items() if kind == "ScaledObject"]


def schema_errors(document: dict[str, Any]) -> list[str]:
    return [error.message for error in jsonschema_rs.Draft202012Validator(SCALED_OBJECT).iter_errors(document)]


def recorded_series() -> set[str]:
    return {rule["record"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}


def test_the_keda_scaled_objects_match_keda_s_schema() -> None:
    found = [doc for overlay in OVERLAYS for doc in scaled_objects(render(overlay))]
    assert found, "no overlay scales with KEDA"
    for document in found:
        assert schema_errors(document) == []


def test_the_schema_refuses_a_misspelled_or_mistyped_field() -> None:
    (document,) = scaled_objects(render("cpu"))
    misspelled = copy.deepcopy(document)
    misspelled["spec"]["minReplicas"] = misspelled["spec"].pop("minReplicaCount")
    numeric = copy.deepcopy(document)
    numeric["spec"]["triggers"][0]["metadata"]["threshold"] = 8
    unknown_parameter = copy.deepcopy(document)
    unknown_parameter["spec"]["triggers"][0]["metadata"]["serverAdress"] = "http://x"
    for broken in (misspelled, numeric, unknown_parameter):
        assert schema_errors(broken), broken["spec"]


def test_the_autoscalers_query_recorded_series_of_the_target_and_agree_on_thresholds(rendered: Objects) -> None:
    recorded = recorded_series()
    thresholds: dict[str, float] = {}
    for document in scaled_objects(rendered):
        assert document["spec"]["scaleTargetRef"]["name"] == "bertserve-api"
        for trigger in document["spec"]["triggers"]:
            series = set(re.findall(r"model:[a-z_]+:[a-z_]+", trigger["metadata"]["query"]))
            assert series and series <= recorded, (trigger["metadata"]["query"], recorded)
            assert f'namespace="{document["metadata"]["namespace"]}"' in trigger["metadata"]["query"]
            thresholds[next(iter(series))] = float(trigger["metadata"]["threshold"])
    adapter = {rule["name"]["as"]: rule for rule in yaml.safe_load(ADAPTER_RULES.read_text())["externalRules"]}
    for (kind, _), hpa in rendered.items():
        if kind != "HorizontalPodAutoscaler":
            continue
        for metric in hpa["spec"]["metrics"]:
            rule = adapter[metric["external"]["metric"]["name"]]
            (series,) = re.findall(r"model:[a-z_]+:[a-z_]+", rule["seriesQuery"])
            assert series in recorded
            target = metric["external"]["target"]
            thresholds[series] = float(target.get("averageValue") or target["value"])
    keda = {s: t for d in scaled_objects(render("cpu")) for s, t in _thresholds(d).items()}
    assert thresholds and all(keda[series] == value for series, value in thresholds.items()), (thresholds, keda)


def _thresholds(document: dict[str, Any]) -> dict[str, float]:
    found = {}
    for trigger in document["spec"]["triggers"]:
        (series,) = set(re.findall(r"model:[a-z_]+:[a-z_]+", trigger["metadata"]["query"]))
        found[series] = float(trigger["metadata"]["threshold"])
    return found


def test_deploy_check_is_wired_to_every_overlay() -> None:
    script = (REPO / "deploy" / "check").read_text()
    assert "deploy/kubernetes/overlays/*/" in script and "--strict" in script and "checkov" in script
    config = yaml.safe_load((KUBERNETES / "checkov.yaml").read_text())
    lines = (KUBERNETES / "checkov.yaml").read_text().splitlines()
    for check in config["skip-check"]:  # each skip is justified on the line above it
        above = lines[lines.index(f"  - {check}") - 1].strip()
        assert above.startswith("#") and len(above) > 20, check
