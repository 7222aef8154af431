"""Run-over-run tracking: one JSON line per (run, target) in a history file, and the regression check.

A run is compared with the previous run of the same profile (and shape: users and stage times), target and
mix on the same CPU (the machine's one-line CPU summary: speed differs between CPU models, so a run on another
machine is no reference), or with a named baseline (a `--tag` given to an earlier run, or its run id; compared
whatever its machine). A regression is an accepted-request p99 that grew by more than `max_p99_increase` (a
fraction: 0.25 = +25 %), or a throughput (ok/s) that fell by more than `max_rps_drop`. p99 is only judged when
both runs have at least `MIN_P99_SAMPLES` accepted requests on that endpoint (a p99 of a few dozen requests is
noise), throughput when both have at least `MIN_RPS_SAMPLES` (the rate of a single probe request is its latency).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIN_P99_SAMPLES = 100
MIN_RPS_SAMPLES = 20


def history_record(
    run_id: str, created: str, profile: str, target: str, mix: str, tag: str | None, summary: dict[str, Any], meta: dict
) -> dict[str, Any]:
    """The compact line written for one target of a run."""
    figures = {
        name: {
            "requests": f["requests"],
            "ok": f["ok"],
            "ok_rps": f["ok_rps"],
            "error_rate": f["error_rate"],
            "p50": f["latency_ms"]["p50"],
            "p95": f["latency_ms"]["p95"],
            "p99": f["latency_ms"]["p99"],
        }
        for name, f in summary["endpoints"].items()
    }
    return {
        "run_id": run_id,
        "created": created,
        "profile": profile,
        "target": target,
        "mix": mix,
        "tag": tag,
        "figures": figures,
        **meta,
    }


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every record of the history file (empty when it does not exist); ValueError on a corrupt line."""
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"history file {path} line {number} is not JSON: {error}") from None
    return records


def append_history(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


def check_baseline(history: list[dict[str, Any]], baseline: str, history_path: Path) -> None:
    """ValueError (before any load) when no record carries the tag or run id `baseline`."""
    if not any(baseline in (r.get("tag"), r.get("run_id")) for r in history):
        tags = sorted({str(r["tag"]) for r in history if r.get("tag")})
        known = f"known tags: {', '.join(tags)}" if tags else "no run there has a tag"
        raise ValueError(f"baseline {baseline!r} is neither a tag nor a run id in {history_path} ({known})")


def find_reference(
    history: list[dict[str, Any]],
    profile: str,
    target: str,
    mix: str,
    baseline: str | None = None,
    exclude_run: str | None = None,
    shape: str | None = None,
    cpu: str | None = None,
) -> dict[str, Any] | None:
    """The record to compare with: the latest of `baseline` for this target, else the latest run of the same
    profile, mix and (when given) shape and CPU (`machine.cpu`; records without one do not match)."""
    candidates = [r for r in history if r.get("run_id") != exclude_run and r.get("target") == target]
    if baseline is not None:
        candidates = [r for r in candidates if baseline in (r.get("tag"), r.get("run_id"))]
    else:
        candidates = [r for r in candidates if r.get("profile") == profile and r.get("mix") == mix]
        if shape is not None:
            candidates = [r for r in candidates if r.get("shape") == shape]
        if cpu is not None:
            candidates = [r for r in candidates if (r.get("machine") or {}).get("cpu") == cpu]
    return candidates[-1] if candidates else None


@dataclass
class Change:
    endpoint: str
    metric: str
    """`p99` (ms, lower is better) or `ok_rps` (higher is better)."""
    before: float
    after: float
    change: float
    """Relative change, after / before - 1."""
    limit: float
    regression: bool

    def describe(self) -> str:
        verdict = "REGRESSION" if self.regression else "ok"
        return (
            f"{self.endpoint} {self.metric}: {self.before:.2f} -> {self.after:.2f} "
            f"({self.change:+.1%}, limit {self.limit:+.0%}) {verdict}"
        )


def compare(
    current: dict[str, dict[str, Any]],
    reference: dict[str, dict[str, Any]],
    max_p99_increase: float,
    max_rps_drop: float,
) -> list[Change]:
    """p99 and throughput changes of every endpoint present in both runs' figures."""
    changes: list[Change] = []
    for name in [n for n in current if n in reference]:
        now, before = current[name], reference[name]
        if before.get("ok_rps") and min(now.get("ok", 0), before.get("ok", 0)) >= MIN_RPS_SAMPLES:
            change = now["ok_rps"] / before["ok_rps"] - 1.0
            changes.append(
                Change(name, "ok_rps", before["ok_rps"], now["ok_rps"], change, -max_rps_drop, change < -max_rps_drop)
            )
        enough = min(now.get("ok", 0), before.get("ok", 0)) >= MIN_P99_SAMPLES
        if enough and before.get("p99") and now.get("p99") is not None:
            change = now["p99"] / before["p99"] - 1.0
            changes.append(
                Change(name, "p99", before["p99"], now["p99"], change, max_p99_increase, change > max_p99_increase)
            )
    return changes


def changes_to_json(changes: list[Change]) -> list[dict[str, Any]]:
    return [asdict(change) for change in changes]
