"""Prometheus metrics of the service (prometheus-client), on a registry of its own per app instance.

Names follow https://prometheus.io/docs/practices/naming/ : requests by route and status, end-to-end
latency, queue time, inference time, batch size and tokens, queue depth, rejections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServiceMetrics:
    """All metric families; implements the batcher's `BatchObserver`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "bertserve_requests",
            "Requests by front door, route and outcome.",
            ["transport", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "bertserve_request_seconds",
            "End-to-end request latency.",
            ["transport", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "bertserve_queue_seconds",
            "Time from submission to the first backend call.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "bertserve_inference_seconds", "Backend call duration.", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            "bertserve_batch_size", "Sequences per backend call.", ["model"], buckets=SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "bertserve_batch_tokens",
            "Real (unpadded) tokens per backend call.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.padded_tokens = Counter(
            "bertserve_padded_tokens", "Tokens computed including padding.", ["model"], registry=r
        )
        self.real_tokens = Counter("bertserve_tokens", "Real tokens computed.", ["model"], registry=r)
        self.alone_batches = Counter(
            "bertserve_alone_batches",
            "Backend calls with nothing beside them (no other batch running, nothing waiting); on OpenVINO streams "
            "these run on the latency copy.",
            ["model"],
            registry=r,
        )
        self.queue_depth = Gauge("bertserve_queue_depth", "Sequences waiting for a batch.", ["model"], registry=r)
        self.rejections = Counter(
            "bertserve_rejected",
            "Requests rejected by the batcher (queue_full, deadline).",
            ["model", "reason"],
            registry=r,
        )
        self.ready = Gauge("bertserve_ready", "1 once every model is loaded and warmed up.", registry=r)
        self.door_rejections = Counter(
            "bertserve_door_rejected",
            "Requests refused at the door, by front door and bound: receiving (max_receiving requests were receiving "
            "their body, on arrival) or in_progress (max_in_progress requests were at work, once the body came).",
            ["transport", "bound"],
            registry=r,
        )
        self.in_progress = Gauge(
            "bertserve_in_progress",
            "Requests at work (body complete, not answered yet), both front doors together (max_in_progress).",
            registry=r,
        )
        self.receiving = Gauge(
            "bertserve_receiving",
            "Requests counted on arrival whose body (gRPC: message) is still arriving, both front doors together "
            "(max_receiving).",
            registry=r,
        )
        self.slow_clients = Counter(
            "bertserve_slow_clients_cut",
            "Connections or requests cut for not sending their headers (or the body / gRPC message) within the "
            "configured timeout, for too large headers, or for pipelining too many requests, by front door and "
            "phase (headers, body, header_size, pipeline).",
            ["transport", "phase"],
            registry=r,
        )

        self.abandoned = Counter(
            "bertserve_abandoned",
            "Requests whose caller went away (a closed HTTP connection, a cancelled gRPC call) before their answer: "
            "their queued and not yet computed work is dropped.",
            ["transport"],
            registry=r,
        )

    def _child(self, family: Any, *labels: str) -> Any:
        """`family.labels(*labels)`, looked up once: `labels()` checks and locks on every call, and the batch and
        request paths ask for the same few children each time. The labels come from the served models and the
        server's own routes and statuses, never from what a request says, so this stays as small as the families."""
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    # ---- BatchObserver ----------------------------------------------------------------------------
    def batch_done(
        self, model: str, rows: int, tokens: int, padded_tokens: int, seconds: float, alone: bool = False
    ) -> None:
        self._child(self.inference, model).observe(seconds)
        if alone:
            self._child(self.alone_batches, model).inc()
        self._child(self.batch_size, model).observe(rows)
        self._child(self.batch_tokens, model).observe(tokens)
        self._child(self.padded_tokens, model).inc(padded_tokens)
        self._child(self.real_tokens, model).inc(tokens)

    def queued(self, model: str, seconds: float) -> None:
        self._child(self.queue, model).observe(seconds)

    def watch_queue_depth(self, model: str, depth: Callable[[], float]) -> None:
        """The model's queue depth gauge reads `depth()` when scraped (nothing to update per request)."""
        self._child(self.queue_depth, model).set_function(depth)

    def rejected(self, model: str, reason: str) -> None:
        self.rejections.labels(model, reason).inc()

    # ---- front doors ------------------------------------------------------------------------------
    def observe_request(self, transport: str, route: str, status: str, seconds: float) -> None:
        self._child(self.requests, transport, route, status).inc()
        self._child(self.latency, transport, route).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
