"""The grpc.aio server: bert.v1 servicers, standard grpc.health.v1 health, server reflection, API-key check.

Health reports NOT_SERVING until models are loaded and warmed up, and again from the start of shutdown.
Health and reflection stay public when an API key is set. Message size is capped like the HTTP body.
References: https://github.com/grpc/grpc/blob/master/doc/health-checking.md ,
https://grpc.github.io/grpc/python/grpc_asyncio.html
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.grpc_api.servicers import ClassifierServicer, ModelsServicer, NERServicer, QAServicer
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from service.inference import InferenceService
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

SERVICE_NAMES = tuple(pb.DESCRIPTOR.services_by_name[name].full_name for name in ("Classifier", "QA", "NER", "Models"))
PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED unless `authorization: Bearer <key>` is sent (health and reflection stay public)."""

    def __init__(self, key: str) -> None:
        self._expected = f"Bearer {key}".encode()

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "missing or wrong API key: send authorization: Bearer <key>"
            )

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(PUBLIC_PREFIXES):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("authorization", "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if secrets.compare_digest(given_bytes, self._expected):
            return await continuation(handler_call_details)
        return self._deny


class GrpcFrontDoor:
    """A started gRPC server over the shared service."""

    def __init__(self, server: grpc.aio.Server, health_servicer: Any, port: int) -> None:
        self.server = server
        self.health = health_servicer
        self.port = port

    @classmethod
    async def start(cls, service: InferenceService, settings: ServiceSettings) -> GrpcFrontDoor:
        interceptors = [ApiKeyInterceptor(settings.api_key.get_secret_value())] if settings.api_key else []
        options = [
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        pb_grpc.add_ClassifierServicer_to_server(ClassifierServicer(service), server)
        pb_grpc.add_QAServicer_to_server(QAServicer(service), server)
        pb_grpc.add_NERServicer_to_server(NERServicer(service), server)
        pb_grpc.add_ModelsServicer_to_server(ModelsServicer(service), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        port = server.add_insecure_port(f"{_grpc_host(settings.host)}:{settings.grpc_port}")
        if port == 0:
            raise OSError(f"could not bind the gRPC port {settings.host}:{settings.grpc_port}")
        await server.start()
        door = cls(server, health_servicer, port)
        await door._set(health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info("grpc listening", extra={"port": port})
        return door

    def set_serving(self, serving: bool) -> None:
        import asyncio

        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        asyncio.get_running_loop().create_task(self._set(status))

    async def _set(self, status: Any) -> None:
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING, refuse new RPCs, let in-flight ones finish for up to `grace_s`."""
        await self._set(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
