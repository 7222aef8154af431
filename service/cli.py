"""`bertserve serve`: REST + gRPC over one batched engine. Every option is also an env var BERTSERVE_<NAME>;
a few rarely changed settings (max_text_chars, shutdown_grace_s, backend_wait_s, ...) are env-only.

Options given on the command line win over environment variables, which win over defaults
(`service.settings.ServiceSettings`). Imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bertserve.errors import exit_on_user_error
from service.settings import ServiceSettings


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    models: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated bundle folders, folders of bundles, or names under --bundles-dir. "
            "[env BERTSERVE_MODELS; default minilm-sst2,minilm-squad,minilm-conll03]"
        ),
    ] = None,
    bundles_dir: Annotated[
        Path | None,
        typer.Option(help="Where bundle names are looked up. [env BERTSERVE_BUNDLES_DIR; default artifacts/bundles]"),
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="ort (ONNX Runtime in-process) or triton. [env BERTSERVE_BACKEND; default ort]")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Interface to listen on. [env BERTSERVE_HOST; default 0.0.0.0]")
    ] = None,
    http_port: Annotated[int | None, typer.Option(help="REST port. [env BERTSERVE_HTTP_PORT; default 8000]")] = None,
    grpc_port: Annotated[
        int | None, typer.Option(help="gRPC port, -1 = no gRPC. [env BERTSERVE_GRPC_PORT; default 50051]")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (ORT). [env BERTSERVE_DEVICE]")] = None,
    variant: Annotated[
        str | None, typer.Option(help="Force a bundle variant, e.g. cpu-fp32. [env BERTSERVE_VARIANT]")
    ] = None,
    batching: Annotated[
        bool | None,
        typer.Option("--batching/--no-batching", help="Dynamic batching. [env BERTSERVE_BATCHING; default on]"),
    ] = None,
    max_batch_size: Annotated[
        int | None, typer.Option(help="Sequences per backend call. [env BERTSERVE_MAX_BATCH_SIZE]")
    ] = None,
    max_batch_tokens: Annotated[
        int | None, typer.Option(help="Padded tokens per backend call. [env BERTSERVE_MAX_BATCH_TOKENS]")
    ] = None,
    max_wait_ms: Annotated[
        float | None, typer.Option(help="Longest wait to fill a batch. [env BERTSERVE_MAX_WAIT_MS]")
    ] = None,
    max_queue: Annotated[
        int | None, typer.Option(help="Queued sequences per model before 429. [env BERTSERVE_MAX_QUEUE]")
    ] = None,
    request_timeout_s: Annotated[
        float | None, typer.Option(help="Per-request deadline in seconds. [env BERTSERVE_REQUEST_TIMEOUT_S]")
    ] = None,
    truncate: Annotated[
        bool | None,
        typer.Option(
            "--truncate/--reject-long", help="Default for over-long inputs. [env BERTSERVE_TRUNCATE; default truncate]"
        ),
    ] = None,
    ort_intra_op_threads: Annotated[int | None, typer.Option(help="ORT intra-op threads, 0 = default.")] = None,
    ort_inter_op_threads: Annotated[int | None, typer.Option(help="ORT inter-op threads, 0 = default.")] = None,
    triton_url: Annotated[str | None, typer.Option(help="Triton gRPC host:port. [env BERTSERVE_TRITON_URL]")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Require `Authorization: Bearer KEY`. Prefer the env var BERTSERVE_API_KEY.")
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning, error. [env BERTSERVE_LOG_LEVEL]")
    ] = None,
    max_inputs_per_request: Annotated[
        int | None, typer.Option(help="Most texts per request. [env BERTSERVE_MAX_INPUTS_PER_REQUEST; default 64]")
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="Largest request body. [env BERTSERVE_MAX_BODY_BYTES; default 2000000]")
    ] = None,
    inference_threads: Annotated[
        int | None, typer.Option(help="Threads running backend calls. [env BERTSERVE_INFERENCE_THREADS; default 1]")
    ] = None,
    max_concurrent_batches: Annotated[
        int | None, typer.Option(help="Backend calls in flight per model. [env BERTSERVE_MAX_CONCURRENT_BATCHES]")
    ] = None,
    warmup_rounds: Annotated[
        int | None, typer.Option(help="Warm-up passes per model before ready. [env BERTSERVE_WARMUP_ROUNDS]")
    ] = None,
    cors_origins: Annotated[
        str | None, typer.Option(help="Comma-separated allowed CORS origins. [env BERTSERVE_CORS_ORIGINS]")
    ] = None,
    otlp_endpoint: Annotated[
        str | None, typer.Option(help="OTLP/gRPC endpoint for traces. [env BERTSERVE_OTLP_ENDPOINT]")
    ] = None,
    log_json: Annotated[
        bool | None,
        typer.Option("--log-json/--log-text", help="JSON log lines or plain text. [env BERTSERVE_LOG_JSON]"),
    ] = None,
) -> None:
    """Serve REST (default :8000) and gRPC (default :50051) over one dynamically batched engine."""
    given: dict[str, Any] = {name: value for name, value in locals().items() if value is not None}
    with exit_on_user_error():
        settings = build_settings(given)
    from service.runner import serve as run_server

    run_server(settings)


def build_settings(overrides: dict[str, Any]) -> ServiceSettings:
    """ServiceSettings from CLI overrides + env; checks that every bundle exists before anything starts."""
    from pydantic import ValidationError

    from service.bundles import find_bundles

    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors())
        raise ValueError(problems) from None
    find_bundles(settings.models, settings.bundles_dir)
    return settings
