"""OpenTelemetry spans (tokenize / queue / infer / postprocess) only when an OTLP endpoint is configured.

With no endpoint, `Tracer.span` is a shared null context manager and nothing of OpenTelemetry is imported:
tracing costs nothing. With one, spans go through the SDK's BatchSpanProcessor to an OTLP/gRPC exporter.
Queue and infer spans are recorded after the fact from the batcher's timings (explicit start/end times), since
the batcher serves many requests at once.
Reference: https://opentelemetry.io/docs/languages/python/instrumentation/
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

_NULL = contextlib.nullcontext()


class Tracer:
    """Span factory; inert unless `endpoint` is given."""

    def __init__(self, endpoint: str | None, service_name: str = "bertserve") -> None:
        self.enabled = endpoint is not None
        self._tracer: Any = None
        self._provider: Any = None
        if endpoint is not None:
            self._setup(endpoint, service_name)

    def _setup(self, endpoint: str, service_name: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as error:
            raise ValueError(
                "otlp_endpoint is set but the OpenTelemetry SDK is not installed: "
                "pip install 'bertserve[otel]' or unset BERTSERVE_OTLP_ENDPOINT"
            ) from error
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
        self._provider = provider
        self._tracer = provider.get_tracer("bertserve.service")

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
        """A span around a block (a null context when tracing is off)."""
        if self._tracer is None:
            return _NULL
        return self._tracer.start_as_current_span(name, attributes=attributes)

    def record(self, name: str, start_s: float, end_s: float, **attributes: Any) -> None:
        """A finished child span from perf_counter-relative times (`start_s`, `end_s` in time.perf_counter())."""
        if self._tracer is None:
            return
        offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)
        span = self._tracer.start_span(name, start_time=offset_ns + int(start_s * 1e9), attributes=attributes)
        span.end(end_time=offset_ns + int(end_s * 1e9))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
