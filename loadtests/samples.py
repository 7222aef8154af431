"""One row per request: when it ended, how long it took, how it ended, and the server's own timings.

Outcomes: `ok`; `rejected` (HTTP 429 / gRPC RESOURCE_EXHAUSTED: the queue was full, the service said so at
once); `timeout` (HTTP 504 / gRPC DEADLINE_EXCEEDED / the client's network timeout); `error` (anything else).
Server timings come from the `x-queue-time-ms` / `x-inference-time-ms` response headers (REST) or trailing
metadata (gRPC); empty when the server sent none. `stage_times` reads every stage the service reports that way.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

OUTCOMES: tuple[str, ...] = ("ok", "rejected", "timeout", "error")
STAGES: tuple[str, ...] = ("tokenize", "queue", "inference", "postprocess")
"""The stages of a request the service times and reports, each as an `x-<stage>-time-ms` header (REST) or trailing
metadata entry (gRPC)."""
_STAGE_HEADERS = {f"x-{stage}-time-ms": stage for stage in STAGES}
TIMEOUT_WORDS = ("timeout", "timed out")
WORKER_ENV = "BERTSERVE_LOADTEST_WORKER"
"""Set to a locust worker's index (1, 2, ...) in distributed mode: it writes its own samples and progress files."""


@dataclass
class Sample:
    t_end: float
    """Seconds from the start of the test to the end of the request."""
    endpoint: str
    latency_ms: float
    outcome: str
    status: str
    """HTTP status code or gRPC status name (`0` when no response arrived)."""
    queue_ms: float = math.nan
    inference_ms: float = math.nan


def rest_outcome(status_code: int, exception: BaseException | None) -> str:
    if status_code == 429:
        return "rejected"
    if status_code in (408, 504):
        return "timeout"
    if exception is None and 200 <= status_code < 300:
        return "ok"
    if status_code == 0 and exception is not None and _looks_like_timeout(exception):
        return "timeout"
    return "error"


def grpc_outcome(code_name: str) -> str:
    return {"OK": "ok", "RESOURCE_EXHAUSTED": "rejected", "DEADLINE_EXCEEDED": "timeout"}.get(code_name, "error")


def _looks_like_timeout(exception: BaseException) -> bool:
    text = f"{type(exception).__name__} {exception}".lower()
    return any(word in text for word in TIMEOUT_WORDS)


def stage_times(headers: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> dict[str, float]:
    """stage -> ms from response headers or gRPC metadata pairs: stages the server did not send are left out,
    garbled ones NaN."""
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    found: dict[str, float] = {}
    for key, value in items:
        stage = _STAGE_HEADERS.get(str(key).lower())
        if stage is not None:
            try:
                found[stage] = float(value)
            except (TypeError, ValueError):
                found[stage] = math.nan
    return found


def server_times(headers: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> tuple[float, float]:
    """(queue ms, inference ms) from response headers or gRPC metadata pairs; NaN where absent or garbled."""
    times = stage_times(headers)
    return times.get("queue", math.nan), times.get("inference", math.nan)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Sample))


def worker_path(path: str | Path, worker: str | int) -> Path:
    """Where worker `worker` writes the file a run's config names `path`: `x_samples.csv` -> `x_samples.worker1.csv`."""
    path = Path(path)
    return path.with_name(f"{path.stem}.worker{worker}{path.suffix}")


def write_samples(path: Path, samples: Iterable[Sample]) -> int:
    count = 0
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for sample in samples:
            writer.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in astuple(sample)])
            count += 1
    return count


def _float(value: Any) -> float:
    return float(value) if value not in ("", None) else math.nan


def read_samples(path: Path) -> list[Sample]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or tuple(reader.fieldnames) != COLUMNS:
            raise ValueError(f"{path} is not a samples file: columns {reader.fieldnames}, expected {COLUMNS}")
        return [
            Sample(
                t_end=float(row["t_end"]),
                endpoint=row["endpoint"],
                latency_ms=float(row["latency_ms"]),
                outcome=row["outcome"],
                status=row["status"],
                queue_ms=_float(row["queue_ms"]),
                inference_ms=_float(row["inference_ms"]),
            )
            for row in reader
        ]
