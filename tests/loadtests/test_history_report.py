"""Run-over-run comparison (previous run or named baseline), regression verdicts, and the peer table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtests.history import (
    append_history,
    check_baseline,
    compare,
    find_reference,
    history_record,
    read_history,
)
from loadtests.report import peer_rows, peer_table
from loadtests.runner import EXIT_CHECKS, EXIT_OK, EXIT_REGRESSION, _exit_code


def _figures(ok_rps: float, p99: float, ok: int = 1000) -> dict[str, Any]:
    return {"all": {"ok": ok, "ok_rps": ok_rps, "p99": p99}, "/classify": {"ok": ok, "ok_rps": ok_rps, "p99": p99}}


def test_compare_flags_p99_and_throughput_regressions() -> None:
    before = _figures(100.0, 50.0)
    assert not any(c.regression for c in compare(_figures(90.0, 60.0), before, 0.25, 0.15))
    changes = compare(_figures(80.0, 70.0), before, 0.25, 0.15)
    flagged = {(c.endpoint, c.metric) for c in changes if c.regression}
    assert flagged == {("all", "ok_rps"), ("all", "p99"), ("/classify", "ok_rps"), ("/classify", "p99")}
    rps = next(c for c in changes if c.metric == "ok_rps")
    assert rps.change == pytest.approx(-0.2)
    assert "REGRESSION" in rps.describe() and "-20.0%" in rps.describe()
    assert not any(c.regression for c in compare(_figures(300.0, 5.0), before, 0.25, 0.15))  # faster is fine


def test_p99_needs_enough_samples() -> None:
    changes = compare(_figures(100.0, 500.0, ok=20), _figures(100.0, 50.0, ok=20), 0.25, 0.15)
    assert {c.metric for c in changes} == {"ok_rps"}


def test_the_rate_of_a_lone_probe_request_is_not_judged() -> None:
    assert compare(_figures(50.0, 20.0, ok=1), _figures(90.0, 5.0, ok=1), 0.25, 0.15) == []


def test_the_previous_run_is_taken_from_the_same_cpu_and_a_named_baseline_from_any() -> None:
    xeon, epyc = "Intel Xeon, 2 cores", "AMD EPYC (Zen 3), 2 cores"
    history = [_record("r1", tag="v1"), _record("r2"), _record("r3")]
    history[0]["machine"], history[1]["machine"], history[2]["machine"] = {"cpu": epyc}, {"cpu": xeon}, {"cpu": epyc}
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", cpu=xeon)["run_id"] == "r2"
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", cpu=epyc)["run_id"] == "r3"
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", cpu="ARM Neoverse") is None
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", baseline="v1", cpu=xeon)["run_id"] == "r1"


def _record(run_id: str, profile: str = "smoke", target: str = "ours-batching", tag: str | None = None) -> dict:
    summary = {
        "endpoints": {
            "all": {
                "requests": 10,
                "ok": 10,
                "ok_rps": 5.0,
                "error_rate": 0.0,
                "latency_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0},
            }
        }
    }
    return history_record(run_id, "2026-01-01T00:00:00+00:00", profile, target, "/classify=1", tag, summary, {})


def test_history_file_and_reference_lookup(tmp_path: Path) -> None:
    path = tmp_path / "h" / "history.jsonl"
    assert read_history(path) == []
    append_history(path, [_record("r1", tag="v1"), _record("r2", profile="steady"), _record("r3")])
    append_history(path, [_record("r4", target="naive")])
    history = read_history(path)
    assert [r["run_id"] for r in history] == ["r1", "r2", "r3", "r4"]
    assert find_reference(history, "smoke", "ours-batching", "/classify=1")["run_id"] == "r3"
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", exclude_run="r3")["run_id"] == "r1"
    assert find_reference(history, "smoke", "ours-batching", "/qa=1") is None
    assert find_reference(history, "ramp", "ours-batching", "/classify=1") is None
    history[2]["shape"] = "4@15"
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", shape="4@15")["run_id"] == "r3"
    assert find_reference(history, "smoke", "ours-batching", "/classify=1", shape="4@5") is None
    assert find_reference(history, "steady", "ours-batching", "/qa=1", baseline="v1")["run_id"] == "r1"
    check_baseline(history, "v1", path)
    check_baseline(history, "r2", path)
    with pytest.raises(ValueError, match=r"baseline 'v9' is neither a tag nor a run id .* \(known tags: v1\)"):
        check_baseline(history, "v9", path)
    path.write_text(path.read_text() + "{broken\n")
    with pytest.raises(ValueError, match="line 5 is not JSON"):
        read_history(path)


def _target(ok_rps: float, p50: float, p99: float, error_rate: float = 0.0) -> dict[str, Any]:
    figures = {"ok_rps": ok_rps, "error_rate": error_rate, "latency_ms": {"p50": p50, "p99": p99}}
    return {"summary": {"endpoints": {"/classify": figures, "all": figures}}}


def test_peer_rows_ratios_and_table() -> None:
    targets = {
        "naive": _target(50.0, 400.0, 900.0),
        "ours-no-batching": _target(100.0, 200.0, 450.0),
        "ours-batching": _target(200.0, 100.0, 300.0, error_rate=0.001),
    }
    rows = peer_rows(targets)
    assert [r["target"] for r in rows] == list(targets)
    assert rows[0]["rps_vs_naive"] == 1.0
    assert rows[2]["rps_vs_naive"] == 4.0 and rows[2]["p99_vs_naive"] == pytest.approx(0.333, abs=1e-3)
    table = peer_table(rows)
    assert "| ours-batching | /classify | 200.0 | 100.0 | 300.0 | 0.10% | 4.00× | 0.33× |" in table
    assert "triton" not in table  # no triton peer in the run: no columns for it
    alone = peer_rows({"external": _target(10.0, 1.0, 2.0)})
    assert alone[0]["rps_vs_naive"] is None and "–" in peer_table(alone)


def test_peer_rows_compare_with_the_triton_peer_too() -> None:
    targets = {
        "naive": _target(50.0, 400.0, 900.0),
        "triton": _target(160.0, 150.0, 400.0),
        "ours-batching": _target(240.0, 100.0, 300.0),
    }
    rows = peer_rows(targets)
    assert rows[1]["rps_vs_naive"] == 3.2 and rows[1]["rps_vs_triton"] == 1.0
    assert rows[2]["rps_vs_triton"] == 1.5 and rows[2]["p99_vs_triton"] == 0.75
    assert rows[0]["rps_vs_triton"] == pytest.approx(0.3125, abs=1e-3)
    table = peer_table(rows)
    assert "throughput vs naive | p99 vs naive | throughput vs triton | p99 vs triton |" in table
    assert "| ours-batching | /classify | 240.0 | 100.0 | 300.0 | 0.00% | 4.80× | 0.33× | 1.50× | 0.75× |" in table


def test_only_our_targets_regressions_decide_the_exit() -> None:
    def summary(regressed: set[str]) -> dict:
        labels = ("naive", "triton", "ours-batching")
        return {
            "checks": [{"passed": True}],
            "regression": {label: {"regression": label in regressed} for label in labels},
        }

    assert _exit_code(summary({"naive", "triton"})) == EXIT_OK  # the peers slower: the machine, not our code
    assert _exit_code(summary({"ours-batching"})) == EXIT_REGRESSION
    failed = summary(set())
    failed["checks"] = [{"passed": False}]
    assert _exit_code(failed) == EXIT_CHECKS
