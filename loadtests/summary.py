"""Per-endpoint figures of one target's samples: counts by outcome, throughput, latency percentiles, server times.

Latency percentiles are over *accepted* (ok) requests, measured on the client from send to full answer;
`all_latency_ms` also counts rejected and failed ones. Throughput is over the measurement window: from the
end of the warm-up to the last answer. Percentiles are numpy's linear interpolation of the raw samples (no
histogram buckets). Server times are the service's own queue and inference times from its response headers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtests.samples import Sample

ALL = "all"
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 3)


def latency_figures(values: Sequence[float], full: bool = True) -> dict[str, float | None]:
    """p50/p90/p95/p99/max/mean (or only p50/p99/max) in ms; None when there is no value."""
    chosen = PERCENTILES if full else (50, 99)
    if not values:
        figures: dict[str, float | None] = {f"p{q}": None for q in chosen}
        figures["max"] = None
        if full:
            figures["mean"] = None
        return figures
    array = np.asarray(values, dtype=float)
    figures = {f"p{q}": _rounded(float(np.percentile(array, q))) for q in chosen}
    figures["max"] = _rounded(float(array.max()))
    if full:
        figures["mean"] = _rounded(float(array.mean()))
    return figures


def _server_figures(values: Iterable[float]) -> dict[str, float | None]:
    present = [v for v in values if not math.isnan(v)]
    if not present:
        return {"mean": None, "p50": None, "p99": None, "count": 0}
    array = np.asarray(present, dtype=float)
    return {
        "mean": _rounded(float(array.mean())),
        "p50": _rounded(float(np.percentile(array, 50))),
        "p99": _rounded(float(np.percentile(array, 99))),
        "count": len(present),
    }


def endpoint_figures(samples: Sequence[Sample], window_s: float) -> dict[str, Any]:
    """The figures of one endpoint (or of all of them) over a window of `window_s` seconds."""
    counts = {outcome: 0 for outcome in ("ok", "rejected", "timeout", "error")}
    for sample in samples:
        counts[sample.outcome] = counts.get(sample.outcome, 0) + 1
    requests = len(samples)
    ok = [s for s in samples if s.outcome == "ok"]
    failures = requests - len(ok)
    window = max(window_s, 1e-9)
    return {
        "requests": requests,
        "ok": len(ok),
        "failures": failures,
        "rejected": counts["rejected"],
        "timeouts": counts["timeout"],
        "errors": counts["error"],
        "error_rate": round(failures / requests, 6) if requests else 0.0,
        "rps": round(requests / window, 3),
        "ok_rps": round(len(ok) / window, 3),
        "latency_ms": latency_figures([s.latency_ms for s in ok]),
        "all_latency_ms": latency_figures([s.latency_ms for s in samples], full=False),
        "server_queue_ms": _server_figures(s.queue_ms for s in ok),
        "server_inference_ms": _server_figures(s.inference_ms for s in ok),
    }


@dataclass
class Window:
    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return max(self.end_s - self.start_s, 0.0)


def measurement_window(samples: Sequence[Sample], warmup_s: float) -> Window:
    """From the end of the warm-up to the last answer (the whole run when the warm-up saw every answer)."""
    if not samples:
        return Window(warmup_s, warmup_s)
    last = max(s.t_end for s in samples)
    start = warmup_s if last > warmup_s else 0.0
    return Window(start, last)


def summarize(samples: Sequence[Sample], warmup_s: float) -> dict[str, Any]:
    """{"window_s", "warmup_s", "endpoints": {name: figures, ..., "all": figures}} of the measured samples."""
    window = measurement_window(samples, warmup_s)
    measured = [s for s in samples if s.t_end >= window.start_s]
    names = sorted({s.endpoint for s in measured})
    endpoints = {name: endpoint_figures([s for s in measured if s.endpoint == name], window.length_s) for name in names}
    endpoints[ALL] = endpoint_figures(measured, window.length_s)
    return {
        "window_s": round(window.length_s, 3),
        "warmup_s": window.start_s,
        "samples": len(samples),
        "endpoints": endpoints,
    }


def stage_figures(samples: Sequence[Sample], stages: Sequence[tuple[float, int]], settle_s: float = 2.0) -> list[dict]:
    """Per stage of a multi-stage profile ((end second, users) pairs): ok/s, p50 and p99 of accepted requests,
    rejections and failures, over the stage minus its first `settle_s` seconds (users still arriving)."""
    rows = []
    start = 0.0
    for end, users in stages:
        begin = min(start + settle_s, end)
        inside = [s for s in samples if begin <= s.t_end < end]
        ok = [s.latency_ms for s in inside if s.outcome == "ok"]
        figures = latency_figures(ok, full=False)
        rows.append(
            {
                "users": users,
                "start_s": start,
                "end_s": end,
                "ok_rps": round(len(ok) / max(end - begin, 1e-9), 3),
                "p50": figures["p50"],
                "p99": figures["p99"],
                "rejected": sum(s.outcome == "rejected" for s in inside),
                "failed": sum(s.outcome in ("timeout", "error") for s in inside),
            }
        )
        start = end
    return rows


def timeseries(samples: Sequence[Sample], bucket_s: float = 1.0) -> dict[str, list[float]]:
    """Per bucket of completion time (at its middle): ok/s, rejected/s, failed/s, p50/p95/p99 of ok latencies."""
    if not samples:
        return {key: [] for key in ("t", "ok_rps", "rejected_rps", "failed_rps", "p50", "p95", "p99")}
    buckets = math.floor(max(s.t_end for s in samples) / bucket_s) + 1
    latencies: list[list[float]] = [[] for _ in range(buckets)]
    rejected = [0] * buckets
    failed = [0] * buckets
    for sample in samples:
        index = int(sample.t_end // bucket_s)
        if sample.outcome == "ok":
            latencies[index].append(sample.latency_ms)
        elif sample.outcome == "rejected":
            rejected[index] += 1
        else:
            failed[index] += 1
    if buckets > 1:  # the last bucket is cut short by the end of the test: it would read as a drop
        buckets -= 1
        latencies, rejected, failed = latencies[:buckets], rejected[:buckets], failed[:buckets]
    series: dict[str, list[float]] = {
        "t": [(i + 0.5) * bucket_s for i in range(buckets)],
        "ok_rps": [len(values) / bucket_s for values in latencies],
        "rejected_rps": [count / bucket_s for count in rejected],
        "failed_rps": [count / bucket_s for count in failed],
    }
    for q in (50, 95, 99):
        series[f"p{q}"] = [float(np.percentile(values, q)) if values else math.nan for values in latencies]
    return series
