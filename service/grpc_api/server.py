"""The gRPC front door: bert.v1 servicers, standard grpc.health.v1 health, server reflection, API-key check.

`service.serve` opens it over the engine once the models are loaded, beside the REST front door. Health reports
SERVING from then on, NOT_SERVING from the start of the drain and from the moment the server fails for good (the
process then drains and exits 1).
Health and reflection stay public when an API key is set. Message size is capped like the HTTP body.
Every other RPC is counted in the service's door (shared with REST): among the RPCs receiving from its arrival,
among those at work once its message is in; beyond either bound it ends at once with RESOURCE_EXHAUSTED, and one
whose message does not arrive within `body_timeout_s` ends with CANCELLED (`AdmissionInterceptor`).
References: https://github.com/grpc/grpc/blob/master/doc/health-checking.md ,
https://grpc.github.io/grpc/python/grpc_asyncio.html
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from service.engine.admission import Door, Ticket, bearer_matches
from service.engine.engine import Engine
from service.errors import InvalidInput, ServiceError, Unauthenticated
from service.grpc_api import v2_servicer
from service.grpc_api.servicers import (
    ClassifierServicer,
    EmbedderServicer,
    FillMaskServicer,
    ModelsServicer,
    NERServicer,
    QAServicer,
    RerankerServicer,
    abort,
)
from service.grpc_api.stubs import bert_pb2 as pb
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    *(
        pb.DESCRIPTOR.services_by_name[name].full_name
        for name in ("Classifier", "QA", "NER", "Embedder", "FillMask", "Reranker", "Models")
    ),
    v2_servicer.SERVICE.full_name,
)
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
"""Server reflection's v1 name: its messages are v1alpha's, field for field, so one servicer answers both."""
PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
METADATA_LIMIT_BYTES = 16 * 1024
"""Largest request metadata (headers, HPACK-decoded sizes); more ends the call with RESOURCE_EXHAUSTED."""


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED unless `authorization: Bearer <key>` is sent, the scheme in any case (health and reflection
    stay public); decided from the metadata, before the message is read."""

    def __init__(self, key: str) -> None:
        self._key = key.encode()

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
        if bearer_matches(metadata.get("authorization"), self._key):
            return await continuation(handler_call_details)
        return self._deny


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Counts each RPC but health and reflection in `door` (shared with REST): among the RPCs receiving from its
    arrival, among those at work once its message is in, until its end (the end of grpc.aio's task for the RPC,
    whatever ends it); RESOURCE_EXHAUSTED at once when either bound is full. A unary RPC is served by a handler that
    reads its message itself, so that one whose message does not arrive within `receive_timeout_s` ends with
    CANCELLED and a message (a cancelled task alone would leave the caller waiting), and so that a slow message
    holds no place at work."""

    def __init__(self, door: Door, receive_timeout_s: float, on_timeout: Callable[[], None] | None = None) -> None:
        self._door = door
        self._receive_timeout_s = receive_timeout_s
        self._on_timeout = on_timeout
        self._refuse = {bound: _refusing(door.refusal(bound)) for bound in ("receiving", "in_progress")}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        task = asyncio.current_task()
        if (handler_call_details.method or "").startswith(PUBLIC_PREFIXES) or task is None:
            return await continuation(handler_call_details)
        ticket = self._door.arrive("grpc")
        if ticket is None:
            return self._refuse["receiving"]
        task.add_done_callback(lambda _: ticket.close())
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.request_streaming or handler.response_streaming:
            return handler if ticket.admit() else self._refuse["in_progress"]
        return self._timed(handler, ticket)

    def _timed(self, handler: grpc.RpcMethodHandler, ticket: Ticket) -> grpc.RpcMethodHandler:
        behaviour, timeout_s, on_timeout = handler.unary_unary, self._receive_timeout_s, self._on_timeout
        door = self._door

        async def receive_then_run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                async with asyncio.timeout(timeout_s):
                    request = await context.read()
            except TimeoutError:
                if on_timeout is not None:
                    on_timeout()
                await context.abort(
                    grpc.StatusCode.CANCELLED, f"the request message did not arrive within {timeout_s:g} s"
                )
            if request is grpc.aio.EOF:
                await abort(context, InvalidInput("the call ended without a request message"))
            if not ticket.admit():
                await abort(context, door.refusal())
            try:
                return await behaviour(request, context)
            finally:
                ticket.close()  # before grpc sends the answer: the caller's next call must find the place free

        return grpc.stream_unary_rpc_method_handler(
            receive_then_run,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _refusing(error: ServiceError) -> grpc.RpcMethodHandler:
    """A handler that ends its call with `error` at once (its message unread)."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, error)

    return grpc.unary_unary_rpc_method_handler(refuse)


def connection_age_options(settings: ServiceSettings) -> list[tuple[str, int]]:
    """gRPC's connection-age options: none when the age is 0 (gRPC's own default: connections never age out)."""
    if settings.grpc_max_connection_age_s == 0:
        return []
    return [
        ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(settings.grpc_max_connection_age_grace_s * 1000)),
    ]


class GrpcFrontDoor:
    """A started gRPC server over the engine: opened once the models are ready, so its health starts at SERVING;
    NOT_SERVING from the drain or a failure on."""

    def __init__(self, server: grpc.aio.Server, health_servicer: Any, port: int) -> None:
        self.server = server
        self.health = health_servicer
        self.port = port

    @classmethod
    async def start(cls, engine: Engine, settings: ServiceSettings) -> GrpcFrontDoor:
        admission = AdmissionInterceptor(
            engine.door,
            settings.body_timeout_s,
            on_timeout=lambda: engine.metrics.slow_clients.labels("grpc", "body").inc(),
        )
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if settings.api_key:  # first: a call without the key is refused before it is counted or read
            interceptors.append(ApiKeyInterceptor(settings.api_key.get_secret_value()))
        interceptors.append(admission)
        options = [
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            # one metadata limit: between grpc's soft (8 KiB) and hard (16 KiB) defaults the same call is refused
            # at random (RESOURCE_EXHAUSTED for a growing share of calls); with both equal it is always the same answer
            ("grpc.max_metadata_size", METADATA_LIMIT_BYTES),
            ("grpc.absolute_max_metadata_size", METADATA_LIMIT_BYTES),
            ("grpc.so_reuseport", 0),
            *connection_age_options(settings),
            # a connection must finish its HTTP/2 handshake as fast as an HTTP client its request head
            ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
        ]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        embedder = EmbedderServicer(engine)
        server.add_generic_rpc_handlers(
            (
                _bert("Classifier", {"Classify": ClassifierServicer(engine).Classify}),
                _bert("QA", {"Extract": QAServicer(engine).Extract}),
                _bert("NER", {"Recognize": NERServicer(engine).Recognize}),
                _bert("Embedder", {"Embed": embedder.Embed, "EmbedAll": embedder.EmbedAll}),
                _bert("FillMask", {"Fill": FillMaskServicer(engine).Fill}),
                _bert("Reranker", {"Rerank": RerankerServicer(engine).Rerank}),
                _bert("Models", {"List": ModelsServicer(engine).List}),
                _handlers(v2_servicer.SERVICE, v2_servicer.v2, _v2_methods(engine)),
            )
        )
        health_servicer = health.aio.HealthServicer()
        strict = _StrictRegistry(server)  # what a caller sends wrong is INVALID_ARGUMENT on every method
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, strict)
        reflection_names = (*SERVICE_NAMES, health.SERVICE_NAME, REFLECTION_V1, reflection.SERVICE_NAME)
        reflector = reflection.aio.ReflectionServicer(reflection_names)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflector, strict)
        strict.add_generic_rpc_handlers((_reflection_v1(reflector),))
        port = server.add_insecure_port(f"{_grpc_host(settings.host)}:{settings.grpc_port}")
        if port == 0:
            raise OSError(f"could not bind the gRPC port {settings.host}:{settings.grpc_port}")
        door = cls(server, health_servicer, port)
        await door._set(health_pb2.HealthCheckResponse.SERVING)  # opened once the models are ready
        await server.start()
        log.info("grpc listening", extra={"port": port})
        return door

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        asyncio.get_running_loop().create_task(self._set(status))

    async def _set(self, status: Any) -> None:
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING, refuse new RPCs, let in-flight ones finish for up to `grace_s`."""
        await self._set(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)


def _handlers(service: Any, messages: Any, methods: dict[str, Callable[..., Awaitable[Any]]]) -> grpc.GenericRpcHandler:
    """Unary handlers of `service` (a service descriptor whose messages are classes of the module `messages`) like
    the generated `add_*_to_server`'s, but a request that is not a valid message becomes INVALID_ARGUMENT (grpc
    answers UNKNOWN). They stay unary: `AdmissionInterceptor` reads their message itself (within the receive
    timeout; a call that ends without one is INVALID_ARGUMENT, where grpc's unary path would wait for the deadline).
    Methods of the service not in `methods` answer UNIMPLEMENTED."""
    handlers = {}
    for name, behaviour in methods.items():
        method = service.methods_by_name[name]
        request_class = getattr(messages, method.input_type.name)
        response_class = getattr(messages, method.output_type.name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _guard(behaviour, method.input_type.full_name),
            request_deserializer=_lenient(request_class.FromString),
            response_serializer=response_class.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _v2_methods(engine: Engine) -> dict[str, Callable[..., Awaitable[Any]]]:
    servicer = v2_servicer.InferenceServicer(engine)
    return {name: getattr(servicer, name) for name in v2_servicer.METHODS}


def _bert(service_name: str, methods: dict[str, Callable[..., Awaitable[Any]]]) -> grpc.GenericRpcHandler:
    return _handlers(pb.DESCRIPTOR.services_by_name[service_name], pb, methods)


def _reflection_v1(reflector: Any) -> grpc.GenericRpcHandler:
    """`grpc.reflection.v1.ServerReflection`, answered by the v1alpha servicer (newer grpcurl and Postman ask v1
    first)."""
    handler = grpc.stream_stream_rpc_method_handler(
        reflector.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler})


class _StrictRegistry:
    """Stands in for the server in a generated `add_*_to_server` (health, reflection): registers its handlers
    made strict (`_strict`)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_StrictGeneric(handler) for handler in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(service, {name: _strict(h) for name, h in handlers.items()})


class _StrictGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return _strict(self._inner.service(handler_call_details))


class _Malformed:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as error:  # DecodeError, invalid UTF-8 in a string field, ...
            return _Malformed(str(error) or type(error).__name__)

    return parse


def _strict(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
    """`handler` (health, reflection) answering what a caller sends wrong with INVALID_ARGUMENT and a message,
    where grpc answers UNKNOWN (bytes that do not parse: 'Unexpected DecodeError') or nothing: on grpc's unary
    path, a request stream that ends without a whole message waits for the deadline (forever without one). So a
    unary request is read as a stream whose first message is the request (of several, the first is answered, as
    grpc's unary path does; checking for a second one would cost a read per call)."""
    if handler is None or handler.request_deserializer is None:
        return handler
    type_name = _type_name(handler.request_deserializer)
    options = {
        "request_deserializer": _lenient(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_one_in(handler.unary_unary, type_name), **options)
    if handler.unary_stream is not None:
        return grpc.stream_stream_rpc_method_handler(_one_in_stream_out(handler.unary_stream, type_name), **options)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_checked_in_one_out(handler.stream_unary, type_name), **options)
    return grpc.stream_stream_rpc_method_handler(_checked_in(handler.stream_stream, type_name), **options)


def _type_name(deserialize: Callable[[bytes], Any]) -> str:
    """The message type a generated deserializer (`Message.FromString`) parses."""
    descriptor = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "request"))


async def _checked(request: Any, context: grpc.aio.ServicerContext, type_name: str) -> Any:
    if isinstance(request, _Malformed):
        await abort(context, InvalidInput(f"the request is not a valid {type_name} message: {request.reason}"))
    return request


async def _only_request(context: grpc.aio.ServicerContext, type_name: str) -> Any:
    """The one request message of a unary method."""
    request = await context.read()
    if request is grpc.aio.EOF:
        await abort(
            context,
            InvalidInput(f"the request ended before one whole {type_name} message arrived: send exactly one"),
        )
    return await _checked(request, context, type_name)


def _guard(behaviour: Callable[..., Awaitable[Any]], type_name: str) -> Callable[..., Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(await _checked(request, context, type_name), context)

    return handle


def _one_in(behaviour: Callable[..., Awaitable[Any]], type_name: str) -> Callable[..., Awaitable[Any]]:
    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(await _only_request(context, type_name), context)

    return handle


def _one_in_stream_out(behaviour: Callable[..., Any], type_name: str) -> Callable[..., Any]:
    """A server-streaming method: its behaviour either yields its responses (an async generator) or writes them
    through `context.write` and returns (a coroutine: grpcio-health-checking's `Watch`)."""
    if inspect.iscoroutinefunction(behaviour):

        async def write(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            await behaviour(await _only_request(context, type_name), context)

        return write

    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for response in behaviour(await _only_request(context, type_name), context):
            yield response

    return handle


async def _each_checked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, type_name: str
) -> AsyncIterator[Any]:
    async for request in requests:
        yield await _checked(request, context, type_name)


def _checked_in(behaviour: Callable[..., AsyncIterator[Any]], type_name: str) -> Callable[..., Any]:
    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for response in behaviour(_each_checked(requests, context, type_name), context):
            yield response

    return handle


def _checked_in_one_out(behaviour: Callable[..., Awaitable[Any]], type_name: str) -> Callable[..., Awaitable[Any]]:
    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(_each_checked(requests, context, type_name), context)

    return handle


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
