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

from service.errors import InvalidInput, Unauthenticated
from service.grpc_api.servicers import (
    ClassifierServicer,
    EmbedderServicer,
    FillMaskServicer,
    ModelsServicer,
    NERServicer,
    QAServicer,
    abort,
)
from service.grpc_api.stubs import bert_pb2 as pb
from service.inference import InferenceService
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

SERVICE_NAMES = tuple(
    pb.DESCRIPTOR.services_by_name[name].full_name
    for name in ("Classifier", "QA", "NER", "Embedder", "FillMask", "Models")
)
PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED unless `authorization: Bearer <key>` is sent (health and reflection stay public)."""

    def __init__(self, key: str) -> None:
        self._expected = f"Bearer {key}".encode()

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await abort(context, Unauthenticated("missing or wrong API key: send authorization: Bearer <key>"))

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
            ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(settings.grpc_max_connection_age_grace_s * 1000)),
        ]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        server.add_generic_rpc_handlers(
            (
                _handlers("Classifier", {"Classify": ClassifierServicer(service).Classify}),
                _handlers("QA", {"Extract": QAServicer(service).Extract}),
                _handlers("NER", {"Recognize": NERServicer(service).Recognize}),
                _handlers("Embedder", {"Embed": EmbedderServicer(service).Embed}),
                _handlers("FillMask", {"Fill": FillMaskServicer(service).Fill}),
                _handlers("Models", {"List": ModelsServicer(service).List}),
            )
        )
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


def _handlers(service_name: str, methods: dict[str, Callable[..., Awaitable[Any]]]) -> grpc.GenericRpcHandler:
    """Unary handlers like the generated `add_*_to_server`, but a request that is not a valid message
    becomes INVALID_ARGUMENT (grpc's default for a failed deserializer is INTERNAL)."""
    descriptor = pb.DESCRIPTOR.services_by_name[service_name]
    handlers = {}
    for name, behaviour in methods.items():
        method = descriptor.methods_by_name[name]
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _guard(behaviour, method.input_type.full_name),
            request_deserializer=_lenient(request_class),
            response_serializer=response_class.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)


class _Malformed:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(message_class: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except Exception as error:  # DecodeError, invalid UTF-8 in a string field, ...
            return _Malformed(str(error) or type(error).__name__)

    return parse


def _guard(
    behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], type_name: str
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            await abort(context, InvalidInput(f"the request is not a valid {type_name} message: {request.reason}"))
        return await behaviour(request, context)

    return handle


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
