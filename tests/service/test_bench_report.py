"""The service benchmark's report names the machine it ran on (no server is started here)."""

from __future__ import annotations

from bert_model.hardware import read_cpu_info
from service.bench import markdown
from tests.bert_model.test_hardware import AMX_XEON, EPYC_ZEN4


def report(cpuinfo: str) -> dict:
    row = {"requests_per_s": 100.0, "p50_ms": 10.0, "p99_ms": 20.0, "backend_calls": 10, "mean_batch_size": 4.0}
    low = {f"{key}_{kind}p50_ms": 1.0 for key in ("rest", "grpc") for kind in ("", "backend_", "overhead_")}
    return {
        "models": "m",
        "cpu_count": 2,
        "texts": "built-in",
        "cpu": read_cpu_info(cpuinfo, cores=2).describe(),
        "low_load": low,
        "concurrency": 32,
        "duration_s": 20.0,
        "batching_on": row,
        "batching_off": row,
        "throughput_gain": 1.0,
    }


def test_markdown_names_an_amx_xeon() -> None:
    text = markdown(report(AMX_XEON))
    assert "Machine: INTEL(R) XEON(R) PLATINUM 8580 (Emerald Rapids), 2 usable cores, AMX (features: amx_int8" in text


def test_markdown_names_an_epyc_zen4_without_amx() -> None:
    text = markdown(report(EPYC_ZEN4))
    assert "AMD EPYC 9454 48-Core Processor (Zen 4), 2 usable cores, AVX-512 VNNI (no AMX)" in text
    assert "amx_int8" not in text and "avx512_vnni" in text
