"""Run both front doors in one process: uvicorn serves the app; the app's lifespan runs gRPC and the engine.

A stop signal (SIGTERM from `docker compose down`, a rolling restart or Kubernetes; or SIGINT) drains in
three steps, so that no client, keep-alive or not, loses a request to a closed connection:
1. drain (`drain_s`): readiness and gRPC health report NOT_SERVING at once, so load balancers take the server
   out; requests are still served, and every HTTP response says `Connection: close`, so keep-alive clients
   leave their connections themselves instead of having them closed under a request in flight.
2. stop taking work: new requests get 503 / UNAVAILABLE (with Retry-After). The listening socket closes once
   no request has arrived for a moment and none waits to be accepted (bounded), so no client is reset by the
   close of a socket it had just reached.
3. uvicorn waits for in-flight HTTP requests (up to `shutdown_grace_s`); the lifespan stops gRPC (GOAWAY,
   in-flight RPCs get `shutdown_grace_s`) and closes the batchers (requests still queued get 503), and the
   process exits 0.
A second signal skips the rest of the drain, a third stops waiting for in-flight requests.
A server that fails for good (`InferenceService.fail`: loading failed, or a model's batch loop or backend died)
takes the same steps by itself, with liveness already 503, and exits 1, so that compose or Kubernetes restarts it;
after a failed load, when nothing was ever routed to it, it skips the drain.
Reference: https://www.uvicorn.org/deployment/ (graceful shutdown),
https://grpc.github.io/grpc/python/grpc_asyncio.html (Server.stop), RFC 9112 section 9.6.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from service.http_api.app import create_app
from service.http_api.connections import guarded_protocol
from service.operations.logs import configure_logging
from service.operations.threads import tokenize_on_the_calling_thread
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

QUIET_S = 0.3
"""Step 2 closes the listening socket after this long without a new request..."""
QUIET_MAX_S = 3.0
"""...or after this long at most, even if clients keep coming."""


class _Server(uvicorn.Server):
    """uvicorn.Server whose stop signal first drains (`on_drain`), then stops taking work (`on_stop`)."""

    def __init__(
        self, config: uvicorn.Config, drain_s: float, on_drain: Callable[[], None], on_stop: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self._drain_s = drain_s
        self._on_drain = on_drain
        self._on_stop = on_stop
        self._draining = False
        self._stopping = False
        self.failure: str | None = None
        """Why the server failed for good (then the process exits 1)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes of the event loop: schedule, never run, loop work here.
        loop = asyncio.get_event_loop()
        if self._stopping:
            self.force_exit = True  # a third signal: stop waiting for in-flight requests
            return
        if self._draining:
            log.info("second stop signal: ending the drain now", extra={"signal": sig})
            loop.call_soon_threadsafe(self._stop_taking_work)
            return
        self._draining = True
        log.info("stop signal received: draining", extra={"signal": sig, "drain_s": self._drain_s})
        loop.call_soon_threadsafe(self._on_drain)
        loop.call_soon_threadsafe(loop.call_later, self._drain_s, self._stop_taking_work)

    def fail(self, reason: str, drain: bool) -> None:
        """The server failed for good: drain (when `drain`), stop as after a stop signal, exit 1. On the loop."""
        if self.failure is not None:
            return
        self.failure = reason
        if self._draining:  # already stopping: the exit status is 1 all the same
            return
        self._draining = True
        if not drain:
            self._stop_taking_work()
            return
        log.error("the server failed: draining, then exiting", extra={"reason": reason, "drain_s": self._drain_s})
        self._on_drain()
        asyncio.get_running_loop().call_later(self._drain_s, self._stop_taking_work)

    def _stop_taking_work(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("drain over: refusing new requests, finishing in-flight ones")
        self._on_stop()
        self.should_exit = True  # main_loop returns within 0.1 s, then shutdown() runs

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._close_listeners_when_quiet()
        await super().shutdown(sockets)

    async def _close_listeners_when_quiet(self) -> None:
        """Close the listening sockets once no request arrived for QUIET_S and none waits in the accept queue:
        closing a socket resets the connections still queued on it."""
        listeners = [sock for server in self.servers for sock in server.sockets]
        deadline = time.monotonic() + QUIET_MAX_S
        seen, quiet_since = self.server_state.total_requests, time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if self.server_state.total_requests != seen:
                seen, quiet_since = self.server_state.total_requests, time.monotonic()
            waiting, _, _ = select.select(listeners, [], [], 0)
            if not waiting and time.monotonic() - quiet_since >= QUIET_S:
                break
        for server in self.servers:
            server.close()


def serve(settings: ServiceSettings) -> None:
    """Serve until SIGTERM / SIGINT, then drain and exit 0; or until the server fails for good, then drain and
    exit 1 (SystemExit) with the reason logged."""
    configure_logging(settings.log_level, settings.log_json)
    tokenize_on_the_calling_thread()
    app = create_app(settings)
    service = app.state.service

    def begin_drain() -> None:
        service.state.draining = True
        service.metrics.ready.set(0)
        if app.state.grpc is not None:
            app.state.grpc.set_serving(False)

    def stop_taking_work() -> None:
        # Both doors answer new requests with 503 / UNAVAILABLE from here on. gRPC's own stop (GOAWAY) waits
        # for the lifespan's shutdown: an RPC that reaches a stopping grpc server is CANCELLED, not refused.
        service.state.shutting_down = True
        service.state.ready = False

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_s)),
        # a server that closes an idle connection first races the client's next request on it (a reset)
        timeout_keep_alive=int(settings.keep_alive_s),
        lifespan="on",
        # nothing reads the client's address or scheme: uvicorn's X-Forwarded-* rewriting would be a layer per request
        proxy_headers=False,
        # slow or bloated request heads are cut (uvicorn times no head); the door bounds requests in progress,
        # this bounds open connections
        http=guarded_protocol(
            settings.header_timeout_s,
            settings.max_header_bytes,
            settings.body_timeout_s,
            on_cut=lambda phase: service.metrics.slow_clients.labels("http", phase).inc(),
        ),
        limit_concurrency=settings.max_connections,
    )
    # handle_exit never hands the signal to uvicorn, which would re-raise it after shutdown (exit status -15):
    # a drained server exits 0.
    server = _Server(config, settings.drain_s, begin_drain, stop_taking_work)
    service.failure_hooks.append(lambda reason: server.fail(reason, drain=service.state.load_error is None))
    server.run()
    if server.failure is not None:
        log.error("exiting with status 1: %s", server.failure)
        raise SystemExit(1)
