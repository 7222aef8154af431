"""The recording rules (deploy/prometheus/bertserve.rules.yml) over the series the service really exports.

The rules' unit tests (`promtool test rules`) feed hand-written series; here every series they feed, and every
metric the rules read, is checked against a real /metrics scrape of a running server, name and label names, so a
renamed metric or label breaks this test instead of silently stopping the autoscaler.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.service.server import REPO, ServerProcess

PROMETHEUS = REPO / "deploy" / "prometheus"
SCRAPE_LABELS = {"namespace", "pod", "instance", "job"}
"""Labels a Prometheus adds to what it scrapes (target labels, Kubernetes relabelling), not the service's own."""


@pytest.fixture(scope="module")
def exported(deploy_server: ServerProcess) -> dict[str, set[frozenset[str]]]:
    """Sample name -> the label-name sets it is exported with, after one request through the batcher."""
    classify = httpx.post(deploy_server.url + "/classify", json={"inputs": ["a fine film"]}, timeout=30)
    assert classify.status_code == 200, classify.text
    text = httpx.get(deploy_server.url + "/metrics", timeout=10).text
    found: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return found


def _input_series() -> list[tuple[str, frozenset[str]]]:
    series = []
    for case in yaml.safe_load((PROMETHEUS / "bertserve.rules.test.yml").read_text())["tests"]:
        for entry in case["input_series"]:
            match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}", entry["series"])
            assert match, entry["series"]
            labels = frozenset(pair.split("=")[0].strip() for pair in match.group(2).split(",") if pair.strip())
            series.append((match.group(1), labels - SCRAPE_LABELS))
    return series


def test_the_rule_tests_feed_series_named_and_labelled_as_the_server_exports_them(
    exported: dict[str, set[frozenset[str]]],
) -> None:
    series = _input_series()
    assert {name for name, _ in series} >= {"bertserve_queue_depth", "bertserve_queue_seconds_sum"}
    for name, labels in series:
        assert name in exported, f"{name} is not in the server's /metrics"
        assert labels in exported[name], (name, sorted(labels), [sorted(s) for s in exported[name]])


def test_every_metric_the_rules_read_is_exported(exported: dict[str, set[frozenset[str]]]) -> None:
    rules = [
        rule
        for group in yaml.safe_load((PROMETHEUS / "bertserve.rules.yml").read_text())["groups"]
        for rule in group["rules"]
    ]
    recorded = {rule["record"] for rule in rules}
    read = {name for rule in rules for name in re.findall(r"(?<![:\w])(bertserve_[a-z_]+)(?![:\w])", rule["expr"])}
    assert read and read <= set(exported), sorted(read - set(exported))
    for rule in rules:  # by-labels of the rules are labels the series carry (or the scrape adds)
        for by in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            assert {label.strip() for label in by.split(",")} - SCRAPE_LABELS == {"model"}, rule["record"]
    for rule in rules:  # recorded series read by later rules are recorded in this file
        assert set(re.findall(r"model:[a-z_]+:[a-z_]+", rule["expr"])) <= recorded, rule["record"]


def test_promtool_runs_the_rules_unit_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (make promtool: Debian's prometheus package)")
    result = subprocess.run(
        [promtool, "test", "rules", "bertserve.rules.test.yml"], cwd=PROMETHEUS, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
