"""Per route, where the server's CPU goes: closed-loop clients against one running server, and for each answer the
server's CPU split into event loop / tokenization / runtime / other (`bertserve.benchmarks.thread_cpu`), the padded
over real tokens its batches computed, throughput and latency; and where the latency goes: the p50 and p99 of each
stage the server reports per answer (its `x-<stage>-time-ms` headers / trailing metadata: tokenize, queue,
inference, postprocess) and of the rest of the client's wait (the front door, hand-offs between stages, the client).

Routes: REST `/classify`, `/embed` (SST-2 sentences), `/ner` (CoNLL-2003 sentences), `/qa` (SQuAD questions and
contexts) and gRPC `Classifier.Classify` (SST-2), each only when the server serves its task. Payloads come from the
data files given (`loadtests.payloads`), else from the built-in samples. The clients run in this process (aiohttp
and grpc.aio: a fraction of a millisecond of client CPU per request) on the same cores as the server, as a load test
does; the split counts the server process only.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertserve.benchmarks.thread_cpu import PARTS, cpu_by_part, per_answer_ms, snapshot
from loadtests.payloads import Payloads
from loadtests.samples import STAGES, stage_times

Stages = dict[str, float]
"""A stage's milliseconds by stage name, as one answer reported them (`loadtests.samples.stage_times`)."""

Call = Callable[[int], Awaitable[Stages | None]]
"""One request (the i-th of a client's loop): the stage times of its answer when it was answered 200 / OK, else
None."""


@dataclass(frozen=True)
class Route:
    name: str
    task: str
    """The task whose model serves it (`GET /models`)."""


ROUTES = (
    Route("/classify", "classify"),
    Route("Classifier.Classify", "classify"),
    Route("/embed", "embed"),
    Route("/ner", "ner"),
    Route("/qa", "qa"),
)


def rest_body(route: str, payloads: Payloads, index: int) -> dict[str, Any]:
    """The JSON body of the `index`-th request of a REST route: one input, as an interactive client sends it."""
    if route == "/qa":
        question, context = payloads.qa[index % len(payloads.qa)]
        return {"question": question, "context": context}
    if route == "/ner":
        return {"inputs": payloads.ner[index % len(payloads.ner)]}
    sentence = payloads.classify[index % len(payloads.classify)]
    return {"inputs": [sentence]} if route == "/embed" else {"inputs": sentence}


def token_totals(exposition: str, model: str) -> tuple[float, float]:
    """(real, padded) tokens `model` has computed so far, from a /metrics text."""

    def total(name: str) -> float:
        found = re.search(rf'^{name}_total{{model="{re.escape(model)}"}} (\S+)$', exposition, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    return total("bertserve_tokens"), total("bertserve_padded_tokens")


async def closed_loop(call: Call, clients: int, duration: float) -> dict[str, Any]:
    """`clients` loops calling `call` back to back for `duration` seconds: answers, rate, latency percentiles, and
    the p50 / p99 of each stage the answers reported and of the rest of the wait (`other`)."""
    latencies: list[float] = []
    stages: list[Stages] = []
    failed = 0
    stop_at = time.perf_counter() + duration

    async def client(offset: int) -> None:
        nonlocal failed
        index = offset
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            reported = await call(index)
            if reported is not None:
                latencies.append((time.perf_counter() - start) * 1000)
                stages.append(reported)
            else:
                failed += 1
            index += clients

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - started
    values = np.asarray(latencies) if latencies else np.asarray([float("nan")])
    return {
        "answers": len(latencies),
        "failed": failed,
        "answers_per_s": len(latencies) / wall,
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
        "stages_ms": stage_percentiles(latencies, stages),
    }


def stage_percentiles(latencies: list[float], stages: list[Stages]) -> dict[str, dict[str, float]]:
    """{stage: {p50, p99}} over the answers that reported every stage, with `other`: each answer's latency less
    its stages."""
    complete = [(total, got) for total, got in zip(latencies, stages, strict=True) if len(got) == len(STAGES)]
    if not complete:
        return {}
    columns = {stage: [got[stage] for _, got in complete] for stage in STAGES}
    columns["other"] = [total - sum(got.values()) for total, got in complete]
    return {
        stage: {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}
        for stage, values in columns.items()
    }


async def _measured(
    call: Call, clients: int, duration: float, pid: int, metrics: Callable[[], Awaitable[str]], model: str
) -> dict[str, Any]:
    await closed_loop(call, clients, min(3.0, duration))  # warm the connections and the batcher
    real_before, padded_before = token_totals(await metrics(), model)
    before = snapshot(pid)
    result = await closed_loop(call, clients, duration)
    after = snapshot(pid)
    real_after, padded_after = token_totals(await metrics(), model)
    real = real_after - real_before
    result["model"] = model
    result["cpu_ms_per_answer"] = per_answer_ms(cpu_by_part(pid, before, after), result["answers"])
    result["padded_over_real"] = (padded_after - padded_before) / real if real else float("nan")
    return result


async def measure_routes(
    url: str,
    grpc_target: str,
    pid: int,
    payloads: Payloads,
    clients: int,
    duration: float,
    only: tuple[str, ...] = (),
) -> dict[str, dict[str, Any]]:
    """Every route the server at `url` / `grpc_target` (process `pid`) serves (or those of `only`), one after
    another."""
    import aiohttp
    import grpc

    from service.grpc_api.stubs import bert_pb2 as pb
    from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

    results: dict[str, dict[str, Any]] = {}
    connector = aiohttp.TCPConnector(limit=clients)
    async with (
        aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session,
        grpc.aio.insecure_channel(grpc_target) as channel,
    ):

        async def metrics() -> str:
            async with session.get("/metrics") as response:
                return await response.text()

        async with session.get("/models") as response:
            defaults = {m["task"]: m["name"] for m in (await response.json())["models"] if m["is_default"]}
        classifier = pb_grpc.ClassifierStub(channel)

        def rest(route: str) -> Call:
            async def call(index: int) -> Stages | None:
                async with session.post(route, json=rest_body(route, payloads, index)) as answer:
                    await answer.read()
                    return stage_times(answer.headers) if answer.status == 200 else None

            return call

        async def classify_rpc(index: int) -> Stages | None:
            text = payloads.classify[index % len(payloads.classify)]
            rpc = classifier.Classify(pb.ClassifyRequest(inputs=[pb.TextInput(text=text)]), timeout=60)
            try:
                await rpc
            except grpc.aio.AioRpcError:
                return None
            return stage_times(tuple(await rpc.trailing_metadata()))  # iterated: (key, value) pairs

        for route in ROUTES:
            model = defaults.get(route.task)
            if model is None or (only and route.name not in only):
                continue
            call = classify_rpc if route.name == "Classifier.Classify" else rest(route.name)
            results[route.name] = await _measured(call, clients, duration, pid, metrics, model)
    return results


def routes_markdown(routes: dict[str, dict[str, Any]], clients: int, duration: float) -> str:
    """The per-route table: answers/s, latency, padded/real tokens, and the server's CPU per answer by part."""
    header = ["route", "answers/s", "p50 ms", "p99 ms", "padded / real tokens", *PARTS, "total", "outside runtime"]
    lines = [
        f"Server CPU per answer (ms of CPU time, per thread group), {clients} closed-loop clients, {duration:.0f} s "
        "per route:",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in routes.items():
        cpu = row["cpu_ms_per_answer"]
        cells = [
            f"`{name}`",
            f"{row['answers_per_s']:.1f}",
            f"{row['p50_ms']:.1f}",
            f"{row['p99_ms']:.1f}",
            f"{row['padded_over_real']:.2f}",
            *(f"{cpu[part]:.2f}" for part in PARTS),
            f"{cpu['total']:.2f}",
            f"{100 * cpu['outside_runtime_share']:.0f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    staged = {name: row["stages_ms"] for name, row in routes.items() if row.get("stages_ms")}
    if staged:
        columns = [*STAGES, "other"]
        lines += [
            "",
            "Where an answer's latency goes (ms, p50 / p99 of each part on its own; `other`: the latency less the "
            "server's stages, i.e. the front door, the hand-offs between stages and the client):",
            "",
            "| " + " | ".join(["route", "latency", *columns]) + " |",
            "|" + "---|" * (len(columns) + 2),
        ]
        for name, stages in staged.items():
            row = routes[name]
            cells = [f"`{name}`", f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f}"]
            cells += [f"{stages[stage]['p50']:.1f} / {stages[stage]['p99']:.1f}" for stage in columns]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
