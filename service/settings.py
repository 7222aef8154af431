"""Service settings: one pydantic-settings class, every field also an environment variable `BERTSERVE_<FIELD>`.

Built once by the CLI (`bertserve serve`) or a test and passed to `create_app(settings)`; nothing reads the
environment at import time. Lists accept JSON or comma-separated values (`BERTSERVE_MODELS=a,b`).
Reference: https://docs.pydantic.dev/latest/concepts/pydantic_settings/
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bundles.runtimes import RuntimeSettings

DEFAULT_MODELS = ("minilm-sst2", "minilm-squad", "minilm-conll03", "minilm?", "minilm-rerank?")
"""The default task models, and the MiniLM sentence encoder (embed) and cross-encoder (rerank) when their bundles have
been built."""
DEFAULT_BUNDLES_DIR = Path("artifacts/bundles")

CommaList = Annotated[list[str], NoDecode]
RUNTIME = RuntimeSettings()
"""The runtime settings' defaults, with which the export's guard also opens every variant."""


class ServiceSettings(BaseSettings):
    """Everything `bertserve serve` can be told; each field is also the env var BERTSERVE_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="BERTSERVE_", extra="ignore", validate_default=True)

    # ---- what to serve --------------------------------------------------------------------------
    models: CommaList = Field(
        default=list(DEFAULT_MODELS),
        description="Bundle folders, a folder of bundles, or bundle names under bundles_dir; an entry ending "
        "in `?` is served only if it exists. The first model of each task is that task's default.",
    )
    bundles_dir: Path = Field(default=DEFAULT_BUNDLES_DIR, description="Where bundle names are looked up.")
    backend: Literal["ort", "triton"] = Field(default="ort", description="ONNX Runtime in-process, or a Triton server.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="ORT hardware; auto = CUDA if available."
    )
    variant: str | None = Field(
        default=None,
        description="Force one bundle variant (e.g. cpu-fp32) for every model; `auto`: on a CPU, time each model's "
        "guarded CPU variants at start and serve the fastest; unset: the first variant of this CPU family's order "
        "that this process runs (on CUDA, the GPU variant).",
    )
    variant_budget_s: float = Field(
        default=3.0,
        gt=0,
        description="--variant auto: seconds per model for loading and timing its candidate variants "
        "(at least 2 timing rounds are run whatever the budget).",
    )

    # ---- network ------------------------------------------------------------------------------
    host: str = Field(default="0.0.0.0", description="Interface both front doors listen on.")
    http_port: int = Field(default=8000, ge=-1, le=65535, description="REST port (0 = any free port, -1 = no REST).")
    grpc_port: int = Field(default=50051, ge=-1, le=65535, description="gRPC port (0 = any free port, -1 = no gRPC).")

    # ---- batching -----------------------------------------------------------------------------
    batching: bool = Field(default=True, description="Dynamic batching across requests; off = one feature per call.")
    max_batch_size: int = Field(
        default=8,
        ge=1,
        description="Most features (sequences) in one backend call; small on CPU cores (bigger batches pad more), "
        "raise it on a GPU.",
    )
    max_batch_tokens: int = Field(default=16384, ge=8, description="Token budget of one call: rows x padded length.")
    max_wait_ms: float = Field(
        default=0.0,
        ge=0,
        description="Longest a batch waits for more requests to fill it. 0 = never wait: batches form from the "
        "requests that arrive while the backend is busy.",
    )
    max_padding: float | None = Field(
        default=0.15,
        ge=0,
        description="Padding allowed in a batch, as a fraction of its real tokens (unset = no limit). 0.15 keeps "
        "the runtime's padded tokens within 1.15x the real ones at no cost in throughput on 2 CPU cores.",
    )
    batch_window: int | None = Field(
        default=None,
        ge=1,
        description="Cut each batch from the oldest N waiting sequences only (unset = twice max_batch_size): bounds "
        "how often a request is passed over for later ones closer in length (the p99), at a little more padding. At "
        "least max_batch_size; max_queue or more = the whole queue.",
    )
    pad_multiple: int | None = Field(
        default=None,
        ge=1,
        description="Pad each batch to its longest sequence rounded up to a multiple of N (unset = the backend's "
        "choice, timed at warm-up: 16 for OpenVINO variants on CPUs with VNNI or AMX where batches rounded up to 16 "
        "run no slower; 1, the longest sequence, else).",
    )
    max_queue: int = Field(default=512, ge=1, description="Features waiting per model; beyond it requests get 429.")
    priority_width: int | None = Field(
        default=128,
        ge=1,
        description="Short requests (at most max_batch_size token sequences, each at most this long: a few "
        "sentences; a QA request, a question over a passage, never is) go before bulk work (many inputs, long "
        "texts, QA, a document's NER windows): while one is in "
        "progress, at most one batch of bulk rows runs at a time in the process, over all models, not on all cores "
        "and of at most priority_batch_tokens, and short rows never wait behind a held one (unset = no priority: "
        "batches run in arrival order as each model's concurrency allows).",
    )
    priority_batch_tokens: int = Field(
        default=512,
        ge=1,
        description="While short requests are in progress, a batch of bulk rows holds at most this many padded "
        "tokens (one row at least), so that a short request waits on little compute: one 512-token row of MiniLM "
        "int8 takes about 0.1 s on 2 cores, eight of them about 0.9 s.",
    )
    max_concurrent_batches: int | None = Field(
        default=None,
        ge=1,
        description="Backend calls in flight per model (unset = what the backend runs at once: an OpenVINO variant's "
        "streams, else 1).",
    )
    request_timeout_s: float = Field(default=30.0, gt=0, description="Per-request deadline (504 / DEADLINE_EXCEEDED).")
    max_consecutive_failures: int = Field(
        default=10,
        ge=0,
        description="Failed batches in a row (backend errors, not busy answers) after which a model has failed for "
        "good: liveness reports 503 and the server drains and exits non-zero, to be restarted (0 = never).",
    )

    # ---- input limits -------------------------------------------------------------------------
    truncate: bool = Field(default=True, description="Default for inputs over the model length: cut (true) or reject.")
    max_inputs_per_request: int = Field(default=64, ge=1, description="Most texts (or QA pairs) in one request.")
    max_text_chars: int = Field(default=100_000, ge=1, description="Longest text (or QA context) in characters.")
    max_rerank_documents: int = Field(
        default=256,
        ge=1,
        description="Most passages one rerank request may rank (each is one model row, so at most max_queue).",
    )
    max_body_bytes: int = Field(default=2_000_000, ge=1024, description="Largest request body (HTTP and gRPC).")

    # ---- ONNX Runtime -------------------------------------------------------------------------
    ort_intra_op_threads: int = Field(
        default=RUNTIME.intra_op_threads, ge=0, description="Threads inside one operator (0 = ORT default)."
    )
    ort_inter_op_threads: int = Field(
        default=RUNTIME.inter_op_threads, ge=0, description="Threads across operators (0 = ORT default)."
    )
    ort_spinning: bool = Field(
        default=RUNTIME.spinning,
        description="Let ORT worker threads spin between operators (faster alone, slower when sharing cores "
        "with the event loop and tokenization).",
    )
    inference_threads: int | None = Field(
        default=None,
        ge=1,
        description="Worker threads running backend calls off the loop (unset = what the backend runs at once).",
    )
    openvino_streams: int = Field(
        default=RUNTIME.openvino_streams,
        ge=1,
        description="OpenVINO variants: streams (batches computed at once, the cores split between them; 1 = the "
        "latency setting, all cores on one batch). Under load N batches run at once without waiting on each other.",
    )
    openvino_lone_latency: bool = Field(
        default=RUNTIME.openvino_lone_latency,
        description="OpenVINO variants with more than one stream: a batch with nothing beside it (no other batch "
        "running, nothing waiting) goes to a second copy of the graph compiled for latency (all cores on that batch), "
        "so a lightly loaded server answers as fast as with one stream.",
    )

    # ---- Triton -------------------------------------------------------------------------------
    triton_url: str = Field(default="localhost:8001", description="Triton gRPC endpoint host:port.")
    triton_model_prefix: str = Field(default="", description="Prefix of model names in the Triton repository.")
    backend_wait_s: float = Field(
        default=120.0, ge=0, description="How long startup waits for an unavailable backend (Triton starting)."
    )
    triton_batching: bool = Field(
        default=True, description="Triton batches itself: our batcher passes requests through."
    )

    # ---- access and observability -------------------------------------------------------------
    api_key: SecretStr | None = Field(
        default=None,
        description="If set, every route but /health/* and /metrics (and every gRPC method but health) needs "
        "`Authorization: Bearer <key>` (the scheme in any case); checked before the body is read.",
    )
    public_docs: bool = Field(
        default=False,
        description="With an API key: serve the API docs (/docs, /redoc, /openapi.json) and the playground page "
        "without it (the routes they call still need the key).",
    )
    cors_origins: CommaList = Field(default_factory=list, description="Allowed CORS origins (empty = no CORS).")
    playground: bool = Field(
        default=True,
        description="Serve the playground at / and /playground: a browser page that tries every loaded model "
        "(with an API key set, the page needs public_docs, and it asks for the key to call the API routes).",
    )
    otlp_endpoint: str | None = Field(default=None, description="OTLP/gRPC endpoint for traces; unset = no tracing.")
    log_level: str = Field(default="info", description="debug, info, warning, error.")
    log_json: bool = Field(default=True, description="Structured JSON log lines (false = plain text).")
    warmup_rounds: int = Field(
        default=2, ge=0, description="Warm-up passes per model at load, before reporting ready (0 = none)."
    )
    shutdown_grace_s: float = Field(default=10.0, ge=0, description="How long SIGTERM waits for in-flight requests.")
    drain_s: float = Field(
        default=5.0,
        ge=0,
        description="After SIGTERM, seconds of serving on (unready, `Connection: close`) before new requests get 503.",
    )
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="Idle seconds before the server closes a keep-alive connection; longer than clients' and load "
        "balancers' own idle timeouts (httpx 5 s, most balancers 60 s), so that the client side closes first.",
    )

    # ---- admission and slow clients -----------------------------------------------------------
    max_in_progress: int = Field(
        default=64,
        ge=1,
        description="Requests at work in this process, REST and gRPC together, counted from the moment their whole "
        "body (gRPC: message) is in, before it is parsed or tokenized; beyond it requests get 429 / RESOURCE_EXHAUSTED "
        "at once. Health, metrics and the playground page are not counted. Twice the closed-loop users that saturate "
        "2 cores.",
    )
    max_receiving: int = Field(
        default=128,
        ge=1,
        description="Requests still receiving their body (gRPC: message), REST and gRPC together, counted from their "
        "arrival (the headers); beyond it requests get 429 / RESOURCE_EXHAUSTED at once. A separate, larger bound than "
        "max_in_progress, so that clients sending their bodies slowly hold no place at work: each costs no worker, "
        "at most max_body_bytes of memory and at most body_timeout_s.",
    )
    tokenize_threads: int = Field(
        default=2,
        ge=1,
        description="Worker threads that tokenize and post-process large requests off the event loop (small ones run "
        "on the loop); the Rust tokenizer parallelizes each batch itself.",
    )
    tokenize_queue: int = Field(
        default=16,
        ge=0,
        description="Large requests waiting for a tokenization thread; beyond it requests get 429 / RESOURCE_EXHAUSTED "
        "at once.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds an HTTP client has to send a request's headers, from its connection or the request's "
        "first byte; then the connection is closed (slow clients hold no worker, and not for long).",
    )
    body_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="Seconds a client has to send a whole request once its headers arrived (the REST body, the gRPC "
        "message); then 408 and the connection closed (gRPC: CANCELLED).",
    )
    max_header_bytes: int = Field(
        default=32768,
        ge=1024,
        description="Largest HTTP request head (request line and headers); beyond it 431 and the connection closed.",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Open HTTP connections (or requests running) beyond which new requests get 503 from uvicorn; a "
        "backstop above max_in_progress, for clients that open connections and hold them.",
    )

    # ---- gRPC connection age: long-lived channels reconnect and reach new replicas ---------------
    grpc_max_connection_age_s: float = Field(
        default=120.0,
        ge=0,
        description="The gRPC server sends GOAWAY to a connection this old (gRPC adds up to 10% jitter): the "
        "client's channel reconnects, through its load balancer or DNS, and so reaches replicas started since. "
        "HTTP/2 multiplexes every call of a channel on one connection, so without it a client stays on one replica. "
        "0: never; for replicas behind a proxy that balances each call (HAProxy 2.6 cuts the calls in flight on a "
        "connection the server ages out).",
    )
    grpc_max_connection_age_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="After that GOAWAY, how long calls in flight on the old connection may run before it is closed "
        "(at least request_timeout_s, so that no call is cut).",
    )

    @field_validator("models", "cors_origins", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [item.strip() for item in text.split(",") if item.strip()]
        return value

    @field_validator("api_key", "otlp_endpoint", "variant", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.lower()
        if level not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError(f"log_level must be debug, info, warning, error or critical, got {value!r}")
        return level

    @model_validator(mode="after")
    def _check(self) -> ServiceSettings:
        if not self.models:
            raise ValueError("models is empty: name at least one bundle folder or bundle name")
        if self.http_port < 0 and self.grpc_port < 0:
            raise ValueError("http_port and grpc_port are both -1: serve at least one front door")
        if self.batch_window is not None and self.batch_window < self.effective_max_batch_size:
            raise ValueError(
                f"batch_window ({self.batch_window}) must be at least max_batch_size ({self.effective_max_batch_size})"
            )
        return self

    @property
    def effective_max_batch_size(self) -> int:
        """1 when batching is off, so every feature is its own backend call."""
        return self.max_batch_size if self.batching else 1
