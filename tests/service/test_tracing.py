"""OpenTelemetry: inert without an endpoint; with one, a request records tokenize / queue / infer / postprocess."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from service.engine.engine import Engine
from service.engine.inputs import ClassifyInput
from service.operations.tracing import Tracer
from service.settings import ServiceSettings


def test_no_endpoint_means_no_opentelemetry() -> None:
    tracer = Tracer(None)
    assert not tracer.enabled
    with tracer.span("x") as span:
        assert span is None
    tracer.record("queue", 0.0, 1.0)  # a no-op


def test_spans_of_one_request(tiny_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    settings = ServiceSettings(models=[str(tiny_bundles["classify"])], otlp_endpoint="127.0.0.1:4317", warmup_rounds=0)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # nothing listens there: do not retry for long
    exporter = InMemorySpanExporter()

    async def go() -> list[str]:
        service = Engine(settings)
        service.tracer._provider.add_span_processor(SimpleSpanProcessor(exporter))
        await service.load()
        service.set_ready()
        try:
            outcome = await service.submit(ClassifyInput(texts=["hello there"]))
            assert outcome.results[0][0]["label"] in ("negative", "positive")
        finally:
            await service.close()
        return [span.name for span in exporter.get_finished_spans()]

    names = asyncio.run(go())
    assert {"tokenize", "queue", "infer", "postprocess", "bertserve.classify"} <= set(names), names
    assert "opentelemetry" in sys.modules


def test_fastapi_native_telemetry_stays_off_even_with_a_global_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI would trace every request through a configured global OpenTelemetry provider; the service's spans
    come from its own tracer, so a provider set by the embedding process records nothing of the REST app."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from fastapi.testclient import TestClient
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service.http_api.app import create_app

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    app = create_app(ServiceSettings(models=["unused"], grpc_port=-1))
    client = TestClient(app)  # no lifespan: nothing is loaded, the health routes answer all the same
    assert client.get("/health/live").status_code == 200
    assert client.get("/models").status_code in (200, 503)
    assert exporter.get_finished_spans() == ()
