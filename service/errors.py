"""The service's one domain error hierarchy, and the two tables that map it to HTTP and gRPC status codes.

The core (batcher, backends, the engine) raises only these; each front door translates them once
(anchor: text-embeddings-inference's single error enum mapped per transport). Every message says what the
caller should change. gRPC codes follow https://grpc.github.io/grpc/core/md_doc_statuscodes.html.
"""

from __future__ import annotations

import secrets
from typing import TypeVar

import grpc

T = TypeVar("T")


class ServiceError(Exception):
    """Base of every error a request can end with; `code` is the stable machine-readable name."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServiceError):
    """The request is malformed or asks for something the server cannot do (empty text, bad option, ...)."""

    code = "invalid_input"


class InvalidJson(InvalidInput):
    """The request body is not JSON at all (HTTP only: a gRPC message that does not parse is InvalidInput)."""

    code = "invalid_json"


class InputTooLong(InvalidInput):
    """An input exceeds the model's length and truncation is off."""

    code = "input_too_long"


class UnknownModel(InvalidInput):
    """The `model` field names no loaded model (the message lists them)."""

    code = "unknown_model"


class PayloadTooLarge(InvalidInput):
    """The request body is larger than the configured limit."""

    code = "payload_too_large"


class UnsupportedMediaType(InvalidInput):
    """The request body is not sent as JSON (its Content-Type is not `application/json`; HTTP only)."""

    code = "unsupported_media_type"


class HeadersTooLarge(InvalidInput):
    """The request head (URL and headers; gRPC: metadata) is larger than the server's limit."""

    code = "headers_too_large"


class RouteNotFound(InvalidInput):
    """No route (HTTP) or method (gRPC) has this name."""

    code = "not_found"


class MethodNotAllowed(InvalidInput):
    """The route exists, but not for this HTTP method (HTTP only)."""

    code = "method_not_allowed"


class RequestTimeout(ServiceError):
    """The request's head or body did not arrive within the server's timeout: the connection is closed."""

    code = "request_timeout"


class Unauthenticated(ServiceError):
    """Missing or wrong API key."""

    code = "unauthenticated"


class Overloaded(ServiceError):
    """The model's queue is full: rejected at once, retry later."""

    code = "overloaded"


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before its answer was ready."""

    code = "deadline_exceeded"


class NotReady(ServiceError):
    """Models are still loading / warming up, or the server is shutting down."""

    code = "not_ready"


class BackendUnavailable(ServiceError):
    """The inference backend cannot be reached (Triton down)."""

    code = "backend_unavailable"


class BackendBroken(BackendUnavailable):
    """A backend reports that it can never serve again (its runtime is gone): its model is failed at once."""

    code = "backend_broken"


class ModelFailed(ServiceError):
    """The model's batch loop or backend failed for good: the server is unlive and restarting; retry elsewhere."""

    code = "model_failed"


class BackendError(ServiceError):
    """The backend failed on a batch, or returned outputs that do not match its inputs."""

    code = "backend_error"


class Internal(ServiceError):
    """A bug in the server's own code on a request's path; the message carries the id its traceback is logged
    with (`error_id`), so a caller's report finds the log line."""

    code = "internal"

    def __init__(self, message: str, error_id: str | None = None) -> None:
        self.error_id = error_id or secrets.token_hex(8)
        super().__init__(f"{message} (logged on the server as error {self.error_id})")


# One table per transport. Lookup walks the class's MRO, so a subclass inherits its parent's status
# unless listed itself.
HTTP_STATUS: dict[type[ServiceError], int] = {
    InvalidInput: 422,
    InvalidJson: 400,
    UnsupportedMediaType: 415,
    HeadersTooLarge: 431,
    RouteNotFound: 404,
    MethodNotAllowed: 405,
    PayloadTooLarge: 413,
    RequestTimeout: 408,
    Unauthenticated: 401,
    Overloaded: 429,
    DeadlineExceeded: 504,
    NotReady: 503,
    BackendUnavailable: 503,
    ModelFailed: 503,
    BackendError: 500,
    ServiceError: 500,
}

GRPC_STATUS: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    HeadersTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RouteNotFound: grpc.StatusCode.UNIMPLEMENTED,
    RequestTimeout: grpc.StatusCode.CANCELLED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    BackendUnavailable: grpc.StatusCode.UNAVAILABLE,
    ModelFailed: grpc.StatusCode.UNAVAILABLE,
    BackendError: grpc.StatusCode.INTERNAL,
    ServiceError: grpc.StatusCode.INTERNAL,
}


def _lookup(table: dict[type[ServiceError], T], error: ServiceError) -> T:
    for klass in type(error).__mro__:
        if klass in table:
            return table[klass]
    return table[ServiceError]


RETRY_AFTER_S = 1
"""Seconds a 429 / 503 answer (RESOURCE_EXHAUSTED, UNAVAILABLE) asks the caller to wait before retrying."""


def http_status(error: ServiceError) -> int:
    """The HTTP status code of a domain error."""
    return _lookup(HTTP_STATUS, error)


def grpc_status(error: ServiceError) -> grpc.StatusCode:
    """The gRPC status code of a domain error."""
    return _lookup(GRPC_STATUS, error)
