"""`serve(settings)`: load the engine, open the REST and gRPC front doors over it side by side, and stop them
together. Either door runs alone when the other's port is -1.

The REST port opens first, so that `/health/*` answers while the models load (503 `not_ready` to work); the gRPC
port opens once they are ready: a balancer that sends a call to a replica before its first health check (HAProxy
does, for a replica its DNS discovery has just found) sees a refused connection, which it retries on another
replica, where an UNAVAILABLE answer would reach the client.

A stop signal (SIGTERM from `docker compose down`, a rolling restart or Kubernetes; SIGINT; SIGHUP, a closed
terminal) drains in three steps, so that no client, keep-alive or not, loses a request to a closed connection:
1. drain (`drain_s`): readiness and gRPC health report NOT_SERVING at once, so load balancers take the server
   out; requests are still served, and every HTTP response says `Connection: close`, so keep-alive clients
   leave their connections themselves instead of having them closed under a request in flight.
2. stop taking work: new requests get 503 / UNAVAILABLE (with Retry-After). The REST listener closes once no
   request has arrived for a moment and none waits to be accepted (bounded), so no client is reset by the close of
   a socket it had just reached; gRPC sends GOAWAY.
3. in-flight requests of both doors finish for up to `shutdown_grace_s`; what still waits then (queued, or not
   yet computed) is answered 503 / UNAVAILABLE with Retry-After, never cut, and the process exits 0.
A second signal skips the rest of the drain, a third stops waiting for in-flight requests.
A server that fails for good (`Engine.fail`: loading failed, or a model's batch loop or backend died) takes the
same steps by itself, with liveness already 503, and exits 1, so that compose or Kubernetes restarts it; after a
failed load, when nothing was ever routed to it, it skips the drain.
Reference: https://www.uvicorn.org/deployment/ (graceful shutdown),
https://grpc.github.io/grpc/python/grpc_asyncio.html (Server.stop), RFC 9112 section 9.6.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from uvicorn.loops.auto import auto_loop_factory

from service.engine.engine import Engine
from service.grpc_api.server import GrpcFrontDoor
from service.http_api.app import create_app
from service.http_api.connections import guarded_protocol
from service.operations.logs import configure_logging
from service.operations.ports import ensure_port_free
from service.operations.threads import tokenize_on_the_calling_thread
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
QUIET_S = 0.3
"""Step 2 closes the REST listener after this long without a new request..."""
QUIET_MAX_S = 3.0
"""...or after this long at most, even if clients keep coming."""
UVICORN_MARGIN_S = 2.0
"""uvicorn's own graceful-shutdown timeout is the grace period plus this: by then the engine has answered what
was waiting (step 3), so its timeout, which cancels requests and answers them 500, never runs out."""


class _RestServer(uvicorn.Server):
    """uvicorn's server, told when to stop by `serve` (it installs no signal handlers of its own), closing its
    listener once quiet."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    listeners_closed: asyncio.Event | None = None
    """Set once the listening sockets are closed (step 2): gRPC's own stop waits for it."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._close_listeners_when_quiet()
        if self.listeners_closed is not None:
            self.listeners_closed.set()
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


class _Stop:
    """Stop signals and failures, counted: the first starts the drain, the second ends it, the third stops the
    wait for in-flight requests."""

    def __init__(self) -> None:
        self.signals = 0
        self.failure: str | None = None
        self.requested = asyncio.Event()
        self.drain_over = asyncio.Event()
        self.force = asyncio.Event()

    def signal(self, number: int) -> None:
        self.signals += 1
        what = ("stop signal received: draining", "second stop signal: ending the drain now", "third stop signal")
        log.info(what[min(self.signals, 3) - 1], extra={"signal": number})
        events = (self.requested, self.drain_over, self.force)
        events[min(self.signals, len(events)) - 1].set()

    def fail(self, reason: str, drain: bool) -> None:
        if self.failure is None:
            self.failure = reason
            self.requested.set()
            if not drain:
                self.drain_over.set()


def serve(settings: ServiceSettings) -> None:
    """Serve until a stop signal, then drain and exit 0; or until the server fails for good, then drain and exit 1
    (SystemExit) with the reason logged."""
    configure_logging(settings.log_level, settings.log_json)
    tokenize_on_the_calling_thread()
    with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:  # uvloop where installed, as uvicorn runs
        failure = runner.run(Server(settings).run())
    if failure is not None:
        log.error("exiting with status 1: %s", failure)
        raise SystemExit(1)


class Server:
    """The engine and its two front doors, for the whole life of one event loop (`run`)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.engine = Engine(settings)
        self.rest = _rest_server(settings, self.engine) if settings.http_port >= 0 else None
        self.grpc: GrpcFrontDoor | None = None
        self._stop = _Stop()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine.failure_hooks.append(
            lambda reason: self._stop.fail(reason, drain=self.engine.state.load_error is None)
        )

    @property
    def http_port(self) -> int | None:
        """The REST port it listens on (the one bound for port 0), once started."""
        servers = getattr(self.rest, "servers", None)  # uvicorn sets it when it starts listening
        if not servers:
            return None
        return int(servers[0].sockets[0].getsockname()[1])

    def stop(self) -> None:
        """Stop as after a stop signal (from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.signal, 0)

    async def run(self, handle_signals: bool = True) -> str | None:
        """Serve until stopped; the failure that ended it, None after a stop signal (or `stop`). `handle_signals`:
        take SIGTERM, SIGINT and SIGHUP (the main thread's loop only)."""
        settings, engine, stop = self.settings, self.engine, self._stop
        self._loop = loop = asyncio.get_running_loop()
        if handle_signals:
            for number in STOP_SIGNALS:
                loop.add_signal_handler(number, stop.signal, number)
        if settings.grpc_port > 0:
            ensure_port_free(settings.host, settings.grpc_port, "--grpc-port")  # now, not once the models are loaded
        rest_task = asyncio.create_task(self.rest.serve(), name="rest") if self.rest is not None else None
        self.grpc = await _load_and_open(engine, settings, stop)
        await stop.requested.wait()
        await _drain(engine, self.grpc, settings, stop)
        await _stop(engine, self.rest, rest_task, self.grpc, settings, stop)
        log.info("stopped", extra={"failure": stop.failure} if stop.failure else None)
        if handle_signals:
            for number in STOP_SIGNALS:
                loop.remove_signal_handler(number)
        return stop.failure


async def _load_and_open(engine: Engine, settings: ServiceSettings, stop: _Stop) -> GrpcFrontDoor | None:
    """Load and warm up the models, open the gRPC front door, report ready; a failure fails the server (unless a
    stop signal came first: then loading is abandoned)."""
    loading = asyncio.create_task(engine.load(), name="load-models")
    stopped = asyncio.create_task(stop.requested.wait())
    await asyncio.wait((loading, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not loading.done():
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        return None
    error = loading.exception()
    if error is not None:
        reason = f"{type(error).__name__}: {error}"
        engine.state.load_error = reason
        # the reason on one line; a traceback only for what is not a user's mistake (a bundle, a setting)
        log.error("loading models failed: %s", reason, exc_info=None if isinstance(error, SETUP_ERRORS) else error)
        engine.fail(f"loading models failed: {reason}")
        return None
    grpc_door = None
    if settings.grpc_port >= 0:
        grpc_door = await GrpcFrontDoor.start(engine, settings)
        engine.failure_hooks.append(lambda _: grpc_door.set_serving(False))
    engine.set_ready()
    log.info("ready", extra={"models": ",".join(engine.models)})
    return grpc_door


SETUP_ERRORS = (ValueError, TypeError, FileNotFoundError)
"""What loading raises for a bundle or a setting to fix (its message says what): logged without a traceback."""


async def _drain(engine: Engine, grpc_door: GrpcFrontDoor | None, settings: ServiceSettings, stop: _Stop) -> None:
    """Step 1: unready, serving on for `drain_s` (a second signal ends it)."""
    engine.state.draining = True
    engine.metrics.ready.set(0)
    if grpc_door is not None:
        grpc_door.set_serving(False)
    if not stop.drain_over.is_set():
        log.info("draining", extra={"drain_s": settings.drain_s})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.drain_s):
                await stop.drain_over.wait()


async def _stop(
    engine: Engine,
    rest: _RestServer | None,
    rest_task: asyncio.Task[None] | None,
    grpc_door: GrpcFrontDoor | None,
    settings: ServiceSettings,
    stop: _Stop,
) -> None:
    """Steps 2 and 3: refuse new work, let in-flight work finish within the grace period, answer what remains 503,
    close the engine."""
    log.info("drain over: refusing new requests, finishing in-flight ones")
    engine.state.shutting_down = True
    engine.state.ready = False
    doors: list[asyncio.Task[None]] = []
    quiet = asyncio.Event()
    if rest is not None and rest_task is not None:
        rest.listeners_closed = quiet
        rest.should_exit = True
        doors.append(rest_task)
    else:
        asyncio.get_running_loop().call_later(QUIET_S, quiet.set)
    if grpc_door is not None:
        doors.append(asyncio.create_task(_stop_grpc(grpc_door, quiet, settings.shutdown_grace_s)))
    if doors:
        # until both doors have stopped, a third signal, or the grace period ends, whichever comes first
        stopped: asyncio.Future[list[object]] = asyncio.gather(*doors, return_exceptions=True)
        forced: asyncio.Future[bool] = asyncio.ensure_future(stop.force.wait())
        waited: list[asyncio.Future[Any]] = [stopped, forced]
        await asyncio.wait(waited, timeout=settings.shutdown_grace_s, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
    await engine.close()  # what still waits is answered 503 / UNAVAILABLE now
    if stop.force.is_set() and rest is not None:
        rest.force_exit = True
    await asyncio.gather(*doors, return_exceptions=True)


async def _stop_grpc(grpc_door: GrpcFrontDoor, quiet: asyncio.Event, grace_s: float) -> None:
    """gRPC's GOAWAY once the REST listener has closed when quiet (until then new calls are answered UNAVAILABLE,
    which a client retries elsewhere, where a call reaching a stopping grpc server would be CANCELLED); in-flight
    calls then finish within the grace period."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(QUIET_MAX_S + 1):
            await quiet.wait()
    await grpc_door.stop(grace_s + UVICORN_MARGIN_S)


def _rest_server(settings: ServiceSettings, engine: Engine) -> _RestServer:
    config = uvicorn.Config(
        create_app(settings, engine),
        host=settings.host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_s + UVICORN_MARGIN_S)),
        # a server that closes an idle connection first races the client's next request on it (a reset)
        timeout_keep_alive=int(settings.keep_alive_s),
        lifespan="off",
        # nothing reads the client's address or scheme: uvicorn's X-Forwarded-* rewriting would be a layer per request
        proxy_headers=False,
        # slow or bloated request heads are cut (uvicorn times no head); the door bounds requests in progress,
        # this bounds open connections
        http=guarded_protocol(
            settings.header_timeout_s,
            settings.max_header_bytes,
            settings.body_timeout_s,
            on_cut=lambda phase: engine.metrics.slow_clients.labels("http", phase).inc(),
        ),
        limit_concurrency=settings.max_connections,
    )
    return _RestServer(config)
