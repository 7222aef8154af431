"""The hostile profile (`bertserve loadtest --profile hostile`): what a hostile client does to one server, in
phases, with the server's RSS recorded throughout and a bound checked per phase (exit 4 when one breaks).

Phases, in order (`--hostile phases=...` picks some):
- `warmup`: one request of each kind with default options, then small /classify alone for `idle_s` (their
  baseline latency);
- `distinct`: `values` distinct values of every numeric request option over REST and gRPC
  (`loadtests.hostile.cases`), `concurrency` requests in flight; RSS before and after each option's sweep;
  bound: RSS growth over the phase <= `max_distinct_growth_mb`, no 5xx, no dropped connection;
- `max-size`: first, for QA and NER, a request of as many longest inputs as the body allows, which needs more
  windows (model rows) than the model's queue holds: it must be refused with a 4xx, and the server's count of
  its windows sizes the largest legal request (`hostile_cases.size_windowed`); then `big_clients` closed-loop
  clients send the largest legal requests (max inputs, max text chars, as many longest QA contexts / NER texts
  as the queue holds) for `max_size_s`, beside small /classify at `small_rate`/s; bounds: small p99 <=
  `small_p99_ms` and >= 99% of them answered 200, big ones answered 200 / 429 / 503 / 504 only, the ones over
  the bound a 4xx (not 429);
- `flood`: `flood` connections opened at once, then each sends a 64-sentence /classify; bounds: only 200 / 429 /
  503, peak RSS growth <= `max_flood_growth_mb`, a normal answer within `recovery_s` after the last reply;
- `pipeline`: `pipelined` connections, each writing `pipeline_requests` minimal GETs at once (HTTP/1.1
  pipelining, some 46 bytes a request), then reading until the server closes the connection or has answered them
  all; bounds: every connection ended within `client_timeout_s` (closed or answered, not left hanging), peak RSS
  growth <= `max_pipeline_growth_mb` (a server that queues every request it has read holds them all at once), a
  normal answer within `recovery_s` after;
- `slow`: `slow_clients` connections of each kind (headers dribbled a byte a second, a body dribbled a byte a
  second, idle), beside small /classify; bounds: every one cut within its timeout + `slow_slack_s`
  (`header_timeout_s` for headers and idle ones, `body_timeout_s` for bodies: the server's settings of those
  names, which the wire does not tell), small requests unaffected (the max-size bounds: slow clients cost no
  worker), a normal answer within `recovery_s` after;
- `malformed`: bad JSON, wrong types, truncated / garbage protobuf, unknown methods, broken HTTP, requests one
  past a limit (inputs, text characters, body bytes), one at a time: each answered with a 4xx / client-error
  status (a few also 200), never a 5xx, a hang or a reset; then `junk_heads` connections, 50 at a time, each
  sending a malformed request head: each answered 400;
and at the end: the server process alive (no crash), 0 5xx other than the intended ones (503 under the flood or
big requests, 504 for a deadline that passed), and a normal answer within `recovery_s`. In every phase, when the
runner started the server: its log grew by at most `max_log_kb` (a line per connection or request would be the
client writing to the server's disk).
The limits are the server's: max_inputs_per_request and max_text_chars as its OpenAPI schema states them (else
`--hostile`'s), max_body_bytes and max_queue as `--hostile` says (the wire does not tell them; the defaults are
`bertserve serve`'s), and the queue's size as the server's refusal states it.
Everything goes to loopback only (`loadtests.loopback`), bounded in count (the phase sizes) and time (each call's
client timeout, `distinct_limit_s`, the slow clients' limit). Reports like the locust profiles: summary.json with
the small requests' figures per phase as endpoints, report.md, latency.png, rss.png, the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import aiohttp
import grpc.aio

from loadtests.hostile import cases
from loadtests.hostile.checks import JUNK, hostile_checks
from loadtests.hostile.net import (
    Call,
    Clock,
    GrpcRequest,
    MetricsRss,
    PipelineResult,
    ProcRss,
    RestRequest,
    RssProbe,
    SlowResult,
    grpc_call,
    http_bytes,
    pipelined_client,
    rest_call,
    slow_client,
    status_class,
    tcp_exchange,
)
from loadtests.payloads import Payloads
from loadtests.plot import plot_rss
from loadtests.samples import Sample, grpc_outcome, rest_outcome, write_samples
from loadtests.summary import ALL, endpoint_figures
from loadtests.targets import RunningServer, Target

if TYPE_CHECKING:
    from loadtests.runner import RunOptions

PHASES = ("warmup", "distinct", "max-size", "flood", "pipeline", "slow", "malformed")
MB = 1024 * 1024
LOG_SETTLE_S = 0.3
"""Wait before reading a phase's log size at its end: the server writes its log lines on a thread of its own,
info lines every 0.1 s (service.operations.logs)."""
SMALL = "small /classify"
SLOW_KINDS = ("headers", "body", "idle")


@dataclass(frozen=True)
class HostileConfig:
    """Sizes, limits and bounds of a hostile run: `--hostile key=value,...` changes any of them."""

    phases: tuple[str, ...] = PHASES
    """The phases to run (`phases=distinct+flood`), in the fixed order."""
    values: int = 1000
    """Distinct values sent per numeric option."""
    concurrency: int = 8
    """Requests in flight in the distinct-values phase."""
    distinct_limit_s: float = 900.0
    """Longest the distinct-values phase may take; sweeps it could not finish count as a broken bound."""
    small_rate: float = 20.0
    """Small /classify requests per second (open loop) beside the big and the slow clients."""
    idle_s: float = 5.0
    """Seconds of small requests alone in the warm-up (their baseline latency)."""
    max_size_s: float = 30.0
    big_clients: int = 2
    """Closed-loop clients sending maximum-size requests."""
    flood: int = 500
    """Connections of the flood, opened at once."""
    pipelined: int = 20
    """Connections of the pipeline phase."""
    pipeline_requests: int = 6000
    """Requests each pipelining connection writes at once (6,000 minimal GETs: 276 KB)."""
    slow_clients: int = 100
    """Slow connections of each kind: headers, body, idle (more than the server admits at once: a slow body must
    not hold an admission slot for long)."""
    slow_interval_s: float = 1.0
    """Seconds between two bytes of a slow client."""
    header_timeout_s: float = 10.0
    """The server's header_timeout_s: a client dribbling its headers, or idle, must be cut by then."""
    body_timeout_s: float = 20.0
    """The server's body_timeout_s: a client dribbling its body (headers sent at once) must be cut by then."""
    slow_slack_s: float = 2.0
    client_timeout_s: float = 60.0
    """Network timeout of every call (a call without an answer by then counts as a hang)."""
    max_inputs: int = 64
    """The server's max_inputs_per_request (the maximum-size requests fill it)."""
    max_text_chars: int = 100_000
    """The server's max_text_chars."""
    max_body_bytes: int = 2_000_000
    """The server's max_body_bytes."""
    max_header_bytes: int = 32_768
    """The server's max_header_bytes: a larger request head must be refused, however it arrives."""
    max_queue: int = 512
    """The server's max_queue: the most model rows (QA / NER windows) one request may need, unless the server's
    refusal of a request over it says otherwise."""
    max_distinct_growth_mb: float = 50.0
    small_p99_ms: float = 250.0
    small_ok_share: float = 0.99
    max_flood_growth_mb: float = 300.0
    max_pipeline_growth_mb: float = 50.0
    junk_heads: int = 2000
    """Connections of the malformed phase that each send a malformed request head (one log line each, unless the
    server bounds what clients make it log)."""
    max_log_kb: float = 64.0
    """Most the server's log may grow in one phase: a line per malicious connection or request is the client
    writing to the server's disk."""
    recovery_s: float = 1.0

    def limits(self) -> cases.Limits:
        return cases.Limits(
            self.max_inputs, self.max_text_chars, self.max_body_bytes, self.max_queue, self.max_header_bytes
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_hostile(text: str | None) -> HostileConfig:
    """`values=20,flood=50,phases=distinct+flood` -> a HostileConfig; ValueError names a bad key or value."""
    config = HostileConfig()
    known = {f.name: f for f in dataclasses.fields(HostileConfig)}
    changes: dict[str, Any] = {}
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise ValueError(f"--hostile item {item!r} is not KEY=VALUE with KEY one of {', '.join(known)}")
        changes[key] = _parse_value(key, value.strip(), getattr(config, key))
    config = dataclasses.replace(config, **changes)
    _check_config(config)
    return config


def _parse_value(key: str, value: str, default: Any) -> Any:
    if key == "phases":
        chosen = tuple(p for p in (v.strip() for v in value.split("+")) if p)
        unknown = [p for p in chosen if p not in PHASES]
        if unknown or not chosen:
            raise ValueError(f"--hostile phases={value!r}: choose from {'+'.join(PHASES)}")
        return tuple(p for p in PHASES if p in chosen)
    try:
        number = int(value) if isinstance(default, int) else float(value)
    except ValueError:
        raise ValueError(f"--hostile {key}={value!r} is not a {type(default).__name__}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"--hostile {key}={value!r} must be a finite number >= 0")
    return number


def _check_config(config: HostileConfig) -> None:
    positive = ("values", "concurrency", "small_rate", "flood", "slow_interval_s", "client_timeout_s",
                "max_inputs", "max_text_chars", "max_body_bytes", "max_queue", "big_clients",
                "distinct_limit_s", "pipelined", "pipeline_requests", "junk_heads")  # fmt: skip
    zero = [name for name in positive if getattr(config, name) <= 0]
    if zero:
        raise ValueError(f"--hostile {', '.join(zero)} must be positive")
    if config.flood > 5000 or config.slow_clients > 1000 or config.values > 100_000 or config.pipelined > 1000:
        raise ValueError(
            "--hostile: at most 5000 flood connections, 1000 pipelining connections, 1000 slow clients per kind, "
            "100000 values"
        )
    if config.pipeline_requests > 100_000:
        raise ValueError(f"--hostile pipeline_requests={config.pipeline_requests} must be at most 100000")
    if config.small_rate > 500:
        raise ValueError(f"--hostile small_rate={config.small_rate} must be at most 500 per second")


# ---- the run's state -----------------------------------------------------------------------------------------
@dataclass
class Server:
    """The server under test, as the profile reaches it."""

    http_url: str
    grpc_target: str | None
    pid: int | None = None
    """Its process when the runner started it (RSS from /proc, crash detection)."""
    alive: Callable[[], bool] | None = None
    log_path: Path | None = None
    """Its log file when the runner started it (the log's growth per phase)."""

    def log_bytes(self) -> int | None:
        try:
            return self.log_path.stat().st_size if self.log_path is not None else None
        except OSError:
            return None


@dataclass
class Phase:
    name: str
    start_s: float
    end_s: float = 0.0
    rss_start: int | None = None
    rss_end: int | None = None
    log_start: int | None = None
    log_end: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """Everything a hostile run measured."""

    config: HostileConfig
    server: Server
    clock: Clock
    texts: cases.Texts
    session: aiohttp.ClientSession
    channel: grpc.aio.Channel | None
    probe: RssProbe
    out: TextIO
    models: dict[str, cases.ModelInfo] = field(default_factory=dict)
    limits: cases.Limits = field(default_factory=cases.Limits)
    limits_source: dict[str, str] = field(default_factory=dict)
    """Where each of `limits` comes from: `openapi` (the server's schema) or `config` (`--hostile`)."""
    calls: list[Call] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    small_index: int = 0

    async def rss_now(self) -> int | None:
        value = await self.probe.read()
        if value is not None:
            self.rss.append((self.clock.now(), value))
        return value

    async def send(self, request: RestRequest | GrpcRequest, phase: str, timeout_s: float | None = None) -> Call:
        timeout = timeout_s or self.config.client_timeout_s
        if isinstance(request, RestRequest):
            call = await rest_call(self.session, self.server.http_url, request, self.clock, phase, timeout)
        else:
            assert self.channel is not None
            call = await grpc_call(self.channel, request, self.clock, phase, timeout)
        self.calls.append(call)
        return call

    def say(self, line: str) -> None:
        self.out.write(f"[hostile] {line}\n")
        self.out.flush()


async def _phase(run: Run, name: str) -> Phase:
    phase = Phase(name, run.clock.now())
    phase.rss_start = await run.rss_now()
    phase.log_start = run.server.log_bytes()
    run.say(f"{name}: started")
    await PHASE_BODIES[name](run, phase)
    phase.end_s = run.clock.now()
    phase.rss_end = await run.rss_now()
    if phase.log_start is not None:
        await asyncio.sleep(LOG_SETTLE_S)
        phase.log_end = run.server.log_bytes()
    run.phases.append(phase)
    counts = Counter(c.status for c in run.calls if c.phase == name)
    run.say(f"{name}: done in {phase.end_s - phase.start_s:.1f}s, statuses {dict(counts)}, RSS {_mb(phase.rss_start)}"
            f" -> {_mb(phase.rss_end)} MB")  # fmt: skip
    return phase


def _mb(value: int | None) -> str:
    return "?" if value is None else f"{value / MB:.0f}"


# ---- phases --------------------------------------------------------------------------------------------------
async def _small_load(run: Run, phase: str, stop: asyncio.Event) -> None:
    """Small /classify requests at `small_rate` per second (open loop) until `stop` is set."""
    interval = 1.0 / run.config.small_rate
    pending: set[asyncio.Task[Call]] = set()
    start = run.clock.now()
    sent = 0
    while not stop.is_set():
        request = cases.small_classify(run.texts, run.small_index)
        run.small_index += 1
        task = asyncio.ensure_future(run.send(request, phase))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
        delay = start + sent * interval - run.clock.now()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(delay, 0.0))
    if pending:
        await asyncio.gather(*pending)


@contextlib.asynccontextmanager
async def _beside_small_load(run: Run, phase: str) -> Any:
    stop = asyncio.Event()
    task = asyncio.ensure_future(_small_load(run, phase, stop))
    try:
        yield
    finally:
        stop.set()
        await task


async def _warmup(run: Run, phase: Phase) -> None:
    for request in cases.warmup_requests(run.models, run.texts, run.channel is not None):
        for _ in range(3):
            await run.send(request, phase.name)
    async with _beside_small_load(run, phase.name):
        await asyncio.sleep(run.config.idle_s)


async def _distinct(run: Run, phase: Phase) -> None:
    sweeps = cases.rest_sweeps(run.models, run.texts, run.config.values)
    if run.channel is not None:
        sweeps += cases.grpc_sweeps(run.models, run.texts, run.config.values)
    deadline = run.clock.now() + run.config.distinct_limit_s
    per_sweep: dict[str, dict[str, Any]] = {}
    for sweep in sweeps:
        if run.clock.now() > deadline:
            per_sweep[sweep.name] = {"sent": 0, "finished": False}
            continue
        before = await run.rss_now()
        sent, finished = await _sweep(run, phase.name, sweep, deadline)
        after = await run.rss_now()
        growth = None if before is None or after is None else round((after - before) / MB, 1)
        per_sweep[sweep.name] = {"sent": sent, "finished": finished, "rss_growth_mb": growth}
        run.say(f"distinct: {sweep.name}: {sent} values, RSS {_mb(before)} -> {_mb(after)} MB")
    phase.details["sweeps"] = per_sweep


async def _sweep(run: Run, phase: str, sweep: cases.Sweep, deadline: float) -> tuple[int, bool]:
    """Send the sweep's values, `concurrency` at a time, until done or the phase deadline; (sent, finished)."""
    values = iter(range(sweep.count))
    sent = 0

    async def worker() -> None:
        nonlocal sent
        for value in values:
            if run.clock.now() > deadline:
                return
            sent += 1
            await run.send(sweep.build(value), phase)

    await asyncio.gather(*(worker() for _ in range(run.config.concurrency)))
    return sent, sent == sweep.count


async def _max_size(run: Run, phase: Phase) -> None:
    sized = {task: await _size_windowed(run, phase, task) for task in cases.WINDOWED if task in run.models}
    phase.details["windowed"] = {task: {**dataclasses.asdict(w), "legal_windows": w.legal_windows}
                                 for task, w in sized.items()}  # fmt: skip
    if run.channel is not None and "qa" in sized and sized["qa"].source != "accepted":
        over = sized["qa"].over_inputs
        name = f"over Extract {over} longest contexts"
        request = cases.extract_request(name, run.texts, over, run.limits.max_text_chars)
        phase.details.setdefault("over", []).append(_over_entry(await _probe(run, request, phase.name)))
    big = cases.max_size_requests(run.models, run.texts, run.limits, run.channel is not None, sized)
    phase.details["requests"] = {r.name: _request_size(r) for r in big}
    end = run.clock.now() + run.config.max_size_s

    async def big_client(offset: int) -> None:
        index = offset
        while run.clock.now() < end:
            await run.send(big[index % len(big)], phase.name)
            index += 1

    async with _beside_small_load(run, phase.name):
        await asyncio.gather(*(big_client(i) for i in range(run.config.big_clients)))


async def _size_windowed(run: Run, phase: Phase, task: str) -> cases.Windowed:
    """Send as many longest inputs of `task` as one body holds (more windows than the queue holds, unless the
    queue is larger than thought) and size the largest legal request from the answer."""
    chars = run.limits.max_text_chars
    count = cases.longest_input_count(task, run.texts, run.limits, chars)
    request = cases.windowed_request(task, cases.windowed_name(task, "over", count), run.texts, count, chars)
    call = await _probe(run, request, phase.name)
    question = len(run.texts.qa[0][0]) if task == "qa" else 0
    estimate = cases.estimate_windows(task, chars, run.models[task].max_seq_length, question)
    sized = cases.size_windowed(task, count, call.status, call.detail, run.limits, chars, estimate)
    if sized.source != "accepted":
        phase.details.setdefault("over", []).append(_over_entry(call, sized))
    run.say(f"max-size: {call.name}: {call.status} ({sized.needed} windows, queue {sized.max_queue}); the largest "
            f"legal: {sized.legal_inputs} of {sized.input_chars} chars = {sized.legal_windows} windows "
            f"({sized.source})")  # fmt: skip
    return sized


async def _probe(run: Run, request: RestRequest | GrpcRequest, phase: str, tries: int = 3) -> Call:
    """Send `request`, again (up to `tries` times, a second apart) while it is refused as busy (429): what is
    wanted is its answer on its merits."""
    for attempt in range(tries):
        call = await run.send(request, phase)
        if status_class(call.status) != "rejected" or attempt == tries - 1:
            return call
        await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


def _over_entry(call: Call, sized: cases.Windowed | None = None) -> dict[str, Any]:
    """A request over a bound and its answer (a 4xx other than 429 expected)."""
    bound = f"{sized.needed} windows > {sized.max_queue}" if sized and sized.needed else "windows > the queue"
    return {"name": call.name, "status": call.status, "class": status_class(call.status), "bound": bound,
            "detail": call.detail[:200]}  # fmt: skip


def _request_size(request: RestRequest | GrpcRequest) -> int:
    if isinstance(request, RestRequest):
        return len(request.body)
    message = request.message
    return len(message) if isinstance(message, bytes) else int(message.ByteSize())


async def _recovery(run: Run, phase: str) -> float | None:
    """Seconds until a small /classify (and a gRPC Classify) answers 200 / OK, trying for `recovery_s`."""
    start = run.clock.now()
    limit = run.config.recovery_s
    requests: list[RestRequest | GrpcRequest] = [cases.small_classify(run.texts, 0)]
    if run.channel is not None:
        requests += [r for r in cases.warmup_requests(run.models, run.texts, True) if isinstance(r, GrpcRequest)]
    for request in requests:
        while True:
            left = limit - (run.clock.now() - start)
            if left <= 0:
                return None
            call = await run.send(request, phase, timeout_s=left)
            if status_class(call.status) == "ok":
                break
            await asyncio.sleep(min(0.05, max(left, 0)))
    return round(run.clock.now() - start, 3)


async def _flood(run: Run, phase: Phase) -> None:
    host, port = _host_port(run.server.http_url)
    path, body = cases.flood_request(run.texts)
    payload = http_bytes(host, "POST", path, body)
    go = asyncio.Event()
    start = run.clock.now()

    async def one() -> None:
        status, detail = await tcp_exchange(host, port, payload, run.config.client_timeout_s, go)
        run.calls.append(Call(phase.name, "flood /classify", status, start, (run.clock.now() - start) * 1000, detail))

    tasks = [asyncio.ensure_future(one()) for _ in range(run.config.flood)]
    await asyncio.sleep(min(2.0, 0.2 + run.config.flood / 500))  # connections open (the kernel's accept queue)
    start = run.clock.now()
    go.set()
    await asyncio.gather(*tasks)
    phase.details["recovered_s"] = await _recovery(run, phase.name + " recovery")


async def _pipeline(run: Run, phase: Phase) -> None:
    host, port = _host_port(run.server.http_url)
    config = run.config
    requests, limit = config.pipeline_requests, config.client_timeout_s
    jobs = [pipelined_client(host, port, requests, limit) for _ in range(config.pipelined)]
    results: list[PipelineResult] = await asyncio.gather(*jobs)
    phase.details["pipelined"] = [dataclasses.asdict(result) for result in results]
    phase.details["recovered_s"] = await _recovery(run, phase.name + " recovery")


def slow_timeout(config: HostileConfig, kind: str) -> float:
    """The server timeout that must cut a slow client of `kind`."""
    return config.body_timeout_s if kind == "body" else config.header_timeout_s


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


async def _slow(run: Run, phase: Phase) -> None:
    host, port = _host_port(run.server.http_url)
    config = run.config
    jobs = [
        slow_client(host, port, kind, config.slow_interval_s, (slow_timeout(config, kind) + config.slow_slack_s) * 1.5)
        for kind in SLOW_KINDS
        for _ in range(config.slow_clients)
    ]  # each watched to 1.5 times its bound: a late cut is seen (and timed) too
    async with _beside_small_load(run, phase.name):
        results: list[SlowResult] = await asyncio.gather(*jobs)
    phase.details["slow"] = [dataclasses.asdict(result) for result in results]
    phase.details["recovered_s"] = await _recovery(run, phase.name + " recovery")


MALFORMED_TIMEOUT_S = 30.0
"""Most a malformed request of that phase waits for its answer (less when `client_timeout_s` is less)."""


async def _malformed(run: Run, phase: Phase) -> None:
    host, port = _host_port(run.server.http_url)
    limits = run.limits
    checked = cases.malformed_rest(run.models, limits) + cases.malformed_http(limits)
    if run.channel is not None:
        checked += cases.malformed_grpc(run.models, limits)
    verdicts = []
    for case in checked:
        if isinstance(case.request, bytes):
            call = await _raw_call(run, phase.name, case.name, host, port, case.request)
        else:
            call = await run.send(
                case.request, phase.name, timeout_s=min(run.config.client_timeout_s, MALFORMED_TIMEOUT_S)
            )
        verdicts.append({"case": case.name, "status": call.status, "class": status_class(call.status),
                         "allowed": sorted(case.allowed), "passed": status_class(call.status) in case.allowed,
                         "detail": call.detail[:160]})  # fmt: skip
    phase.details["cases"] = verdicts
    await _junk_heads(run, phase, host, port)


async def _raw_call(run: Run, phase: str, name: str, host: str, port: int, payload: bytes) -> Call:
    """`payload` sent on a connection of its own and the answer read (`tcp_exchange`), recorded as a call."""
    start = run.clock.now()
    timeout = min(run.config.client_timeout_s, MALFORMED_TIMEOUT_S)
    status, detail = await tcp_exchange(host, port, payload, timeout)
    call = Call(phase, name, status, start, (run.clock.now() - start) * 1000, detail)
    run.calls.append(call)
    return call


JUNK_HEAD = b"NOT AN HTTP REQUEST\r\n\r\n"


async def _junk_heads(run: Run, phase: Phase, host: str, port: int, concurrency: int = 50) -> None:
    """`junk_heads` connections, `concurrency` at a time, each sending a malformed head and reading the answer."""
    left = iter(range(run.config.junk_heads))

    async def worker() -> None:
        for _ in left:
            await _raw_call(run, phase.name, JUNK, host, port, JUNK_HEAD)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


PHASE_BODIES: dict[str, Callable[[Run, Phase], Awaitable[None]]] = {
    "warmup": _warmup,
    "distinct": _distinct,
    "max-size": _max_size,
    "flood": _flood,
    "pipeline": _pipeline,
    "slow": _slow,
    "malformed": _malformed,
}


async def _after(run: Run) -> None:
    """The end: a normal answer within `recovery_s`, and the server process still alive."""
    after = Phase("after", run.clock.now(), rss_start=await run.rss_now())
    after.details["recovered_s"] = await _recovery(run, "after")
    after.details["alive"] = run.server.alive() if run.server.alive is not None else None
    after.end_s = run.clock.now()
    after.rss_end = await run.rss_now()
    run.phases.append(after)


async def _sample_rss(run: Run, stop: asyncio.Event, interval_s: float) -> None:
    while not stop.is_set():
        await run.rss_now()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


async def _models(run: Run) -> dict[str, cases.ModelInfo]:
    """The default model of each task, from GET /models."""
    async with run.session.get(run.server.http_url + "/models", timeout=aiohttp.ClientTimeout(total=10)) as reply:
        listed = (await reply.json())["models"]
    found: dict[str, cases.ModelInfo] = {}
    for model in listed:
        if model.get("is_default") or model["task"] not in found:
            found[model["task"]] = cases.ModelInfo(model["name"], model["task"], int(model["max_seq_length"]))
    return found


async def _server_limits(run: Run) -> tuple[cases.Limits, dict[str, str]]:
    """The config's limits, with max_inputs and max_text_chars as the server's OpenAPI schema states them (the
    inputs list's maxItems and the texts' maxLength of a ClassifyRequest) where it does."""
    limits = run.config.limits()
    source = dict.fromkeys(dataclasses.asdict(limits), "config")
    try:
        async with run.session.get(run.server.http_url + "/openapi.json", timeout=aiohttp.ClientTimeout(total=10)) as r:
            schema = await r.json(content_type=None) if r.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        schema = {}
    request = schema.get("components", {}).get("schemas", {}).get("ClassifyRequest", {}) if schema else {}
    stated = {"max_inputs": _schema_values(request, "maxItems"), "max_text_chars": _schema_values(request, "maxLength")}
    changes = {key: min(values) for key, values in stated.items() if values}
    source.update(dict.fromkeys(changes, "openapi"))
    return dataclasses.replace(limits, **changes), source


def _schema_values(node: Any, key: str) -> list[int]:
    """Every integer `key` inside a JSON schema node."""
    if isinstance(node, dict):
        found = [node[key]] if isinstance(node.get(key), int) else []
        return found + [value for child in node.values() for value in _schema_values(child, key)]
    if isinstance(node, list):
        return [value for child in node for value in _schema_values(child, key)]
    return []


async def run_profile(config: HostileConfig, server: Server, payloads: Payloads, seed: int, out: TextIO) -> Run:
    """Run the configured phases against `server`; everything measured."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        channel = grpc.aio.insecure_channel(server.grpc_target) if server.grpc_target else None
        probe: RssProbe = ProcRss(server.pid) if server.pid is not None else MetricsRss(session, server.http_url)
        run = Run(config, server, Clock(), cases.Texts.from_payloads(payloads, seed), session, channel, probe, out)
        run.models = await _models(run)
        run.limits, run.limits_source = await _server_limits(run)
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(_sample_rss(run, stop, 0.25 if server.pid is not None else 0.5))
        try:
            for name in config.phases:
                await _phase(run, name)
            await _after(run)
        finally:
            stop.set()
            await sampler
            if channel is not None:
                await channel.close()
    return run


# ---- what the run shows ----------------------------------------------------------------------------------------
def _statuses(calls: Iterable[Call]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = {}
    for call in calls:
        table.setdefault(call.name, Counter())[call.status] += 1
    return {name: dict(sorted(counts.items())) for name, counts in table.items()}


def to_samples(calls: Iterable[Call]) -> list[Sample]:
    """The calls as the locust profiles' samples (endpoint `phase: name`)."""
    samples = []
    for call in calls:
        if call.status.isdigit():
            outcome = rest_outcome(int(call.status), None)
        elif call.status in ("no-answer",):
            outcome = "timeout"
        elif call.status in ("reset", "closed"):
            outcome = "error"
        else:
            outcome = grpc_outcome(call.status)
        samples.append(Sample(call.end_s, f"{call.phase}: {call.name}", call.latency_ms, outcome, call.status))
    return samples


def small_summary(run: Run) -> dict[str, Any]:
    """The summary (as `loadtests.summary.summarize` shapes it) of the small /classify requests of each phase."""
    endpoints: dict[str, Any] = {}
    small_all: list[Sample] = []
    window = 0.0
    for phase in run.phases:
        calls = [c for c in run.calls if c.phase == phase.name and c.name == SMALL]
        if not calls:
            continue
        samples = to_samples(calls)
        endpoints[f"{phase.name}: {SMALL}"] = endpoint_figures(samples, phase.end_s - phase.start_s)
        small_all += samples
        window += phase.end_s - phase.start_s
    endpoints[ALL] = endpoint_figures(small_all, window)
    return {"window_s": round(window, 3), "warmup_s": 0.0, "samples": len(run.calls), "endpoints": endpoints}


def phase_report(run: Run) -> list[dict[str, Any]]:
    """Per phase: times, RSS (start, end, peak), statuses per kind of call, and what the phase found."""
    rows = []
    for phase in run.phases:
        inside = [value for t, value in run.rss if phase.start_s <= t <= max(phase.end_s, phase.start_s)]
        peak = max(inside) if inside else None
        calls = [c for c in run.calls if c.phase in (phase.name, phase.name + " recovery")]
        rows.append({
            "phase": phase.name, "start_s": round(phase.start_s, 2), "end_s": round(phase.end_s, 2),
            "rss_start_mb": _round_mb(phase.rss_start), "rss_end_mb": _round_mb(phase.rss_end),
            "rss_peak_mb": _round_mb(peak), "log_kb": _log_kb(phase), "statuses": _statuses(calls), **phase.details,
        })  # fmt: skip
    return rows


def _log_kb(phase: Phase) -> float | None:
    """What the server logged during the phase, in KB; None when its log is not known (an external server)."""
    if phase.log_start is None or phase.log_end is None:
        return None
    return round((phase.log_end - phase.log_start) / 1024, 1)


def _round_mb(value: int | None) -> float | None:
    return None if value is None else round(value / MB, 1)


def rss_series(run: Run) -> list[tuple[float, float]]:
    return [(round(t, 3), round(value / MB, 2)) for t, value in run.rss]


def result_json(run: Run) -> dict[str, Any]:
    """The `hostile` entry of the target in summary.json."""
    first = run.rss[0][1] if run.rss else None
    last = run.rss[-1][1] if run.rss else None
    return {
        "config": run.config.to_dict(),
        "models": {task: dataclasses.asdict(info) for task, info in run.models.items()},
        "limits": {**dataclasses.asdict(run.limits), "source": run.limits_source},
        "rss_source": run.probe.source if run.rss else f"none ({run.probe.source} gave nothing)",
        "rss_start_mb": _round_mb(first),
        "rss_end_mb": _round_mb(last),
        "rss_peak_mb": _round_mb(max((v for _, v in run.rss), default=None)),
        "phases": phase_report(run),
    }


def write_rss(path: Path, run: Run) -> None:
    path.write_text(json.dumps({"source": run.probe.source, "t_s_mb": rss_series(run)}) + "\n")


# ---- one target, as the runner runs it ---------------------------------------------------------------------------
def run_hostile_target(
    target: Target, config: HostileConfig, payloads: Payloads, run_dir: Path, options: RunOptions, out: TextIO
) -> dict[str, Any]:
    """Start the server (unless external), run the phases, stop it; the target's entry of summary.json, with its
    checks under `_checks` and its samples (per series, for the plot) under `_samples`."""
    assert target.http_url is not None
    info = target.summary_entry()
    if target.command:
        out.write(f"starting {target.label}: {' '.join(target.command[1:])}\n")
        with RunningServer(target, run_dir / f"{target.label}_server.log") as server:
            info["ready_s"] = round(server.wait_ready(options.startup_timeout_s), 2)
            process = server.process
            assert process is not None
            described = Server(
                target.http_url, target.grpc_target, process.pid, lambda: process.poll() is None, server.log_path
            )
            cpu_start = server.cpu_seconds()
            run = asyncio.run(run_profile(config, described, payloads, options.seed, out))
            cpu_end = server.cpu_seconds()
        if cpu_start is not None and cpu_end is not None:
            info["server_cpu_s"] = round(cpu_end - cpu_start, 2)
    else:
        run = asyncio.run(run_profile(config, Server(target.http_url, target.grpc_target), payloads, options.seed, out))
    return _target_entry(info, target.label, run, run_dir)


def _target_entry(info: dict[str, Any], label: str, run: Run, run_dir: Path) -> dict[str, Any]:
    info["summary"] = small_summary(run)
    info["hostile"] = result_json(run)
    info["_checks"] = hostile_checks(label, info["hostile"], info["summary"])
    samples = to_samples(run.calls)
    write_samples(run_dir / f"{label}_samples.csv", sorted(samples, key=lambda s: s.t_end))
    write_rss(run_dir / f"{label}_rss.json", run)
    plot_rss(run_dir / "rss.png", rss_series(run), [(p.name, p.start_s, p.end_s) for p in run.phases], label)
    series: dict[str, list[Sample]] = {}
    for sample in samples:
        phase, _, name = sample.endpoint.partition(": ")
        key = SMALL if name == SMALL else "max-size requests" if phase == "max-size" else phase
        series.setdefault(key, []).append(sample)
    info["_samples"] = series
    return info
