"""The service benchmark's report, written by the one report writer: date, machine and command before the tables
(no server is started here; its clients are tested against a real server in tests/service/test_http_api.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertserve.benchmarks.report import command_line, provenance, write_report
from bertserve.benchmarks.service import markdown
from bundles.hardware import read_cpu_info
from tests.bundles.test_hardware import AMX_XEON, EPYC_ZEN4

ROW = {"requests_per_s": 100.0, "p50_ms": 10.0, "p99_ms": 20.0, "backend_calls": 10, "mean_batch_size": 4.0}


def report() -> dict:
    low = {f"{key}_{kind}p50_ms": 1.0 for key in ("rest", "grpc") for kind in ("", "backend_", "overhead_")}
    return {
        "models": "m",
        "cpu_count": 2,
        "texts": "built-in",
        "low_load": low,
        "concurrency": 32,
        "duration_s": 20.0,
        "batching_on": ROW,
        "batching_off": ROW,
        "throughput_gain": 1.0,
    }


def written(tmp_path: Path, cpuinfo: str) -> tuple[dict, str]:
    command = command_line("python -m bertserve.benchmarks.service", ["--duration", "20"])
    origin = provenance(command, cpu=read_cpu_info(cpuinfo, cores=2))
    json_path, md_path = write_report(tmp_path, "service", origin, report(), markdown(report()))
    assert (json_path.name, md_path.name) == ("service.json", "service.md")
    return json.loads(json_path.read_text()), md_path.read_text()


def test_report_names_an_amx_xeon_and_the_command(tmp_path: Path) -> None:
    data, text = written(tmp_path, AMX_XEON)
    first = text.splitlines()[0]
    assert first.startswith("Measured ") and " UTC on INTEL(R) XEON(R) PLATINUM 8580 (Emerald Rapids), 2 cores" in first
    assert "; AMX; features: amx_int8" in first
    assert first.endswith(" by `python -m bertserve.benchmarks.service --duration 20`.")
    assert "| batching on | 100.0 | 10.0 | 20.0 | 10 | 4.00 |" in text
    assert data["provenance"]["command"] == "python -m bertserve.benchmarks.service --duration 20"
    assert data["provenance"]["cpu"]["matrix_family"] == "AMX" and data["batching_on"] == ROW


def test_report_names_an_epyc_zen4_without_amx(tmp_path: Path) -> None:
    data, text = written(tmp_path, EPYC_ZEN4)
    assert "AMD EPYC 9454 48-Core Processor (Zen 4), 2 cores at 2.75 GHz; AVX-512 VNNI (no AMX)" in text
    assert "amx_int8" not in text and "avx512_vnni" in text
    assert data["provenance"]["created"].endswith("Z") and data["provenance"]["cpu"]["microarchitecture"] == "Zen 4"


def test_routes_part_splits_a_real_servers_cpu_per_answer(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Against a real server (classify, qa, embed): every route it serves is measured, its CPU per answer split
    into the four parts (adding up to the total), padded / real tokens >= 1, its latency split into the stages
    every answer reported (REST headers, gRPC trailing metadata); a route whose task is not served (/ner) is left
    out; both Markdown tables have a row per route."""
    import asyncio

    from bertserve.benchmarks.service_routes import measure_routes, routes_markdown
    from bertserve.benchmarks.thread_cpu import PARTS
    from loadtests.payloads import load_payloads
    from loadtests.samples import STAGES
    from tests.service.server import serving

    with serving(list(tiny_bundles.values()), tmp_path / "server.log") as server:
        routes = asyncio.run(
            measure_routes(server.url, server.grpc_target, server.process.pid, load_payloads(), 4, 1.5)
        )
    assert list(routes) == ["/classify", "Classifier.Classify", "/embed", "/qa"]
    for name, row in routes.items():
        cpu = row["cpu_ms_per_answer"]
        assert row["answers"] > 0 and row["failed"] == 0, (name, row)
        assert abs(sum(cpu[part] for part in PARTS) - cpu["total"]) < 1e-6 and cpu["total"] > 0, (name, cpu)
        assert cpu["event_loop"] > 0 and 0 <= cpu["outside_runtime_share"] <= 1, (name, cpu)
        assert row["padded_over_real"] >= 1.0, (name, row)
        stages = row["stages_ms"]
        assert list(stages) == [*STAGES, "other"], (name, stages)
        assert all(0 <= stages[stage]["p50"] <= stages[stage]["p99"] for stage in STAGES), (name, stages)
        assert 0 < stages["inference"]["p50"] < row["p50_ms"] and stages["other"]["p50"] > 0, (name, row)
    table = routes_markdown(routes, 4, 1.5)
    assert table.count("\n| `") == 8 and "| route | answers/s |" in table and "| route | latency | tokenize |" in table


def test_stages_are_read_from_headers_or_metadata_and_the_rest_is_other() -> None:
    from bertserve.benchmarks.service_routes import stage_percentiles
    from loadtests.samples import stage_times

    headers = {"X-Tokenize-Time-Ms": "1.0", "x-queue-time-ms": "4", "x-inference-time-ms": "3", "x-model": "m"}
    assert stage_times(headers) == {"tokenize": 1.0, "queue": 4.0, "inference": 3.0}  # no postprocess sent
    metadata = (("x-tokenize-time-ms", "1"), ("x-queue-time-ms", "2"), ("x-inference-time-ms", "3"))
    full = stage_times((*metadata, ("x-postprocess-time-ms", "0.5")))
    assert full == {"tokenize": 1.0, "queue": 2.0, "inference": 3.0, "postprocess": 0.5}
    parts = stage_percentiles([10.0, 20.0, 99.0], [full, full, stage_times(headers)])
    assert parts["queue"] == {"p50": 2.0, "p99": 2.0}  # the answer without every stage is left out
    assert parts["other"] == {"p50": 8.5, "p99": pytest.approx(13.4)}  # of 10 - 6.5 and 20 - 6.5
    assert stage_percentiles([5.0], [stage_times(headers)]) == {}


def test_thread_parts_follow_the_kernel_names() -> None:
    from bertserve.benchmarks.thread_cpu import ThreadTime, cpu_by_part

    before = {10: ThreadTime("bertserve", 1.0), 11: ThreadTime("bs-tokenize_0", 0.5), 12: ThreadTime("bs-infer", 2.0)}
    after = {
        10: ThreadTime("bertserve", 1.5),
        11: ThreadTime("bs-tokenize_0", 0.75),
        12: ThreadTime("bs-infer", 4.0),
        13: ThreadTime("bs-infer", 1.0),  # a runtime thread started in between counts from zero
        14: ThreadTime("grpc_global_tim", 0.1),
    }
    parts = cpu_by_part(10, before, after)
    assert parts == {"event_loop": 0.5, "tokenization": 0.25, "runtime": 3.0, "other": 0.1}
