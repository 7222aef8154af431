"""Run both front doors in one process: uvicorn serves the app; the app's lifespan runs gRPC and the engine.

SIGTERM / SIGINT: readiness and gRPC health turn NOT_SERVING at once and gRPC stops taking new RPCs; uvicorn
stops accepting connections and waits for in-flight HTTP requests (up to `shutdown_grace_s`); the lifespan
then lets in-flight RPCs finish and closes the batchers. The process exits 0.
Reference: https://www.uvicorn.org/deployment/ (graceful shutdown), https://grpc.github.io/grpc/python/grpc_asyncio.html
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType

import uvicorn

from service.http_api.app import create_app
from service.logs import configure_logging
from service.settings import ServiceSettings

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn.Server that also tells the engine and gRPC the moment a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: list) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("stop signal received, draining", extra={"signal": sig})
            for callback in self._on_exit:
                callback()
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after shutdown (exit status -15); a drained server exits 0
        self._captured_signals.clear()


def serve(settings: ServiceSettings) -> None:
    """Serve until SIGTERM / SIGINT."""
    configure_logging(settings.log_level, settings.log_json)
    app = create_app(settings)

    def begin_drain() -> None:
        service = app.state.service
        service.state.shutting_down = True
        service.state.ready = False
        grpc_front = app.state.grpc
        if grpc_front is not None:
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(lambda: loop.create_task(grpc_front.stop(settings.shutdown_grace_s)))

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_s)),
        lifespan="on",
    )
    _Server(config, [begin_drain]).run()
