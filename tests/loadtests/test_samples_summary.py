"""Outcome classification, server timings, the samples file, and the summary figures checked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from loadtests.samples import Sample, grpc_outcome, read_samples, rest_outcome, server_times, write_samples
from loadtests.summary import ALL, latency_figures, measurement_window, summarize, timeseries


def test_outcomes() -> None:
    assert rest_outcome(200, None) == "ok"
    assert rest_outcome(200, ValueError("bad shape")) == "error"
    assert rest_outcome(429, Exception()) == "rejected"
    assert rest_outcome(504, Exception()) == "timeout"
    assert rest_outcome(0, TimeoutError("timed out")) == "timeout"
    assert rest_outcome(0, ConnectionRefusedError()) == "error"
    assert rest_outcome(500, Exception()) == "error"
    assert grpc_outcome("OK") == "ok"
    assert grpc_outcome("RESOURCE_EXHAUSTED") == "rejected"
    assert grpc_outcome("DEADLINE_EXCEEDED") == "timeout"
    assert grpc_outcome("UNAVAILABLE") == "error"


def test_server_times_from_headers_and_metadata() -> None:
    assert server_times({"X-Queue-Time-Ms": "1.5", "x-inference-time-ms": "2.25", "x-model": "m"}) == (1.5, 2.25)
    assert server_times((("x-queue-time-ms", "0.5"), ("x-inference-time-ms", "3"))) == (0.5, 3.0)
    queue, inference = server_times({"x-queue-time-ms": "garbage"})
    assert math.isnan(queue) and math.isnan(inference)
    assert all(math.isnan(v) for v in server_times(None))


def test_samples_round_trip(tmp_path: Path) -> None:
    samples = [Sample(0.5, "/qa", 12.5, "ok", "200", 1.0, 2.0), Sample(1.0, "QA.Extract", 3.0, "rejected", "429")]
    path = tmp_path / "s.csv"
    assert write_samples(path, samples) == 2
    again = read_samples(path)
    assert again[0] == samples[0]
    assert math.isnan(again[1].queue_ms) and again[1].outcome == "rejected"
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a samples file"):
        read_samples(tmp_path / "bad.csv")


def _samples() -> list[Sample]:
    rng = np.random.default_rng(0)
    samples = []
    for i in range(1000):
        t = 0.01 * (i + 1)  # 0.01 .. 10 s
        endpoint = "/classify" if i % 4 else "/qa"
        outcome = "rejected" if i % 50 == 7 else "error" if i == 500 else "ok"
        samples.append(Sample(t, endpoint, float(rng.uniform(1, 100)), outcome, "200", 0.5, 4.0))
    return samples


def test_summary_figures_by_hand() -> None:
    samples = _samples()
    summary = summarize(samples, warmup_s=2.0)
    measured = [s for s in samples if s.t_end >= 2.0]
    window = 10.0 - 2.0
    assert summary["window_s"] == pytest.approx(window)
    everything = summary["endpoints"][ALL]
    ok = [s for s in measured if s.outcome == "ok"]
    assert everything["requests"] == len(measured)
    assert everything["ok"] == len(ok)
    assert everything["rejected"] == sum(s.outcome == "rejected" for s in measured)
    assert everything["errors"] == 1
    assert everything["failures"] == everything["rejected"] + everything["errors"]
    assert everything["ok_rps"] == pytest.approx(len(ok) / window, rel=1e-3)
    latencies = np.array([s.latency_ms for s in ok])
    assert everything["latency_ms"]["p99"] == pytest.approx(np.percentile(latencies, 99), abs=1e-3)
    assert everything["latency_ms"]["max"] == pytest.approx(latencies.max(), abs=1e-3)
    assert everything["server_queue_ms"]["p50"] == 0.5 and everything["server_inference_ms"]["mean"] == 4.0
    qa = summary["endpoints"]["/qa"]
    assert qa["requests"] + summary["endpoints"]["/classify"]["requests"] == everything["requests"]


def test_window_and_empty_cases() -> None:
    short = [Sample(0.5, "/qa", 1.0, "ok", "200")]
    assert measurement_window(short, warmup_s=5).start_s == 0.0  # warm-up longer than the run: keep it all
    assert latency_figures([])["p99"] is None
    empty = summarize([], warmup_s=1)
    assert empty["endpoints"][ALL]["requests"] == 0


def test_timeseries_buckets() -> None:
    series = timeseries(_samples(), bucket_s=1.0)
    assert series["t"][0] == 0.5
    assert len(series["t"]) == 10  # the partial bucket after 10.0 s is left out
    assert sum(series["ok_rps"]) + sum(series["rejected_rps"]) + sum(series["failed_rps"]) == 999
    assert all(p50 <= p99 for p50, p99 in zip(series["p50"], series["p99"], strict=True))


def test_stage_figures_leave_out_each_stage_start() -> None:
    from loadtests.summary import stage_figures

    samples = [Sample(t / 10, "/qa", 10.0 if t < 100 else 50.0, "ok", "200") for t in range(200)]  # 0..19.9 s
    samples.append(Sample(15.0, "/qa", 1.0, "rejected", "429"))
    rows = stage_figures(samples, [(10.0, 4), (20.0, 8)], settle_s=2.0)
    assert [r["users"] for r in rows] == [4, 8]
    assert rows[0]["ok_rps"] == pytest.approx(80 / 8.0) and rows[0]["p99"] == 10.0
    assert rows[1]["p50"] == 50.0 and rows[1]["rejected"] == 1 and rows[1]["failed"] == 0


def test_profile_shape_key() -> None:
    from loadtests.profiles import get_profile
    from loadtests.runner import profile_shape

    assert profile_shape(get_profile("smoke")) == "4@15"
    assert profile_shape(get_profile("smoke").with_overrides(duration_s=4)) == "4@4"
    assert profile_shape(get_profile("ramp")).startswith("1@20,4@40,")
