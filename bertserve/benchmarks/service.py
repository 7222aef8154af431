"""Service benchmark: overhead at low load, throughput with batching on vs off, and per route where the server's
CPU goes.

    python -m bertserve.benchmarks.service [--models artifacts/bundles/minilm-sst2] [--concurrency 32] [--duration 20]
    make bench-service            # the same, under the shared CPU lock

Starts the real server (`bertserve serve`, a subprocess) once per mode on free local ports, and drives it over
HTTP (aiohttp) and gRPC (generated stubs) from this process:
- overhead: sequential single-text /classify (and Classifier.Classify) calls; per call, end-to-end latency
  minus the backend's own time (the `x-inference-time-ms` header / trailing metadata); reports p50s;
- throughput: `--concurrency` clients in closed loops for `--duration` seconds, batching on, then off
  (`--no-batching`: one sequence per backend call); requests/s, p50/p99 latency, mean batch size;
- routes (`bertserve.benchmarks.service_routes`): one server with the default models (`--route-models`), and per
  route (`/classify`, `Classifier.Classify`, `/embed`, `/ner`, `/qa`) `--concurrency` closed-loop clients for
  `--duration` seconds: answers/s, latency, padded / real tokens, and the server's CPU per answer split into event
  loop, tokenization, runtime and other threads (per-thread CPU from /proc). `--parts` picks some of the three.
Texts are SST-2 dev sentences from ../shared/data when present (also SQuAD and CoNLL-2003 for the routes), else
built-in samples. Torch-free.
Results: a JSON file and a Markdown table (default artifacts/bench/service.{json,md}) by `report.write_report`,
which names the date, the machine (CPU model, cores, int8 / bf16 features) and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bertserve.benchmarks.report import command_line, provenance, render, write_report
from bertserve.benchmarks.service_routes import measure_routes, routes_markdown
from loadtests.payloads import load_payloads

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0
"""How long a started server may take to become ready."""
DATA = REPO.parent / "shared" / "data"
SST2_DEV = DATA / "sst2" / "dev.half-a.tsv"
SQUAD_DEV = DATA / "squad_v1.1" / "dev-v1.1.half-a.json"
CONLL_DEV = DATA / "conll2003" / "eng.testa"
DEFAULT_ROUTE_MODELS = ",".join(
    str(REPO / "artifacts" / "bundles" / name) for name in ("minilm-sst2", "minilm-squad", "minilm-conll03", "minilm")
)
PARTS = ("overhead", "batching", "routes")
FALLBACK_TEXTS = [
    "a gripping, beautifully acted film",
    "the plot is thin and the jokes fall flat",
    "an unexpectedly moving portrait of a family",
    "i would not recommend it to anyone",
    "a tedious, overlong mess",
    "one of the best films of the year",
]


def load_texts() -> list[str]:
    if SST2_DEV.is_file():
        rows = SST2_DEV.read_text(encoding="utf-8").splitlines()[1:]
        return [row.split("\t")[0] for row in rows if row.strip()]
    return FALLBACK_TEXTS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`bertserve serve` in a subprocess on free ports."""

    def __init__(self, models: str, extra: list[str], log: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        command = [sys.executable, "-m", "bertserve", "serve", "--models", models, "--host", "127.0.0.1"]
        command += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), *extra]
        # the default log level: each request's access line is part of what is measured; no drain: the bench is the
        # server's only client
        env = {**os.environ, "BERTSERVE_LOG_LEVEL": "info", "BERTSERVE_DRAIN_S": "0"}
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self) -> None:
        timeout = READY_TIMEOUT_S
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}; see {self._log.name}")
            try:
                if httpx.get(self.url + "/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the server was not ready after {timeout}s; see {self._log.name}")

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values: dict[str, float] = {}
        for name in ("bertserve_batch_size_sum", "bertserve_batch_size_count"):
            values[name] = sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE))
        return values

    def stop(self) -> int:
        """SIGTERM and the server's exit status; a server still running 60 s later is killed (-9)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def measure_overhead(server: Server, texts: list[str], requests: int) -> dict[str, float]:
    """Sequential calls: p50 of end-to-end latency, of backend time, and of their difference (REST, gRPC)."""
    import grpc

    from service.grpc_api.stubs import bert_pb2 as pb
    from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

    rest_total, rest_backend = asyncio.run(_sequential(server.url, texts, requests))
    grpc_total, grpc_backend = [], []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.ClassifierStub(channel)
        for index in range(requests + 10):
            request = pb.ClassifyRequest(inputs=[pb.TextInput(text=texts[index % len(texts)])])
            start = time.perf_counter()
            _, call = stub.Classify.with_call(request, timeout=30)
            elapsed = (time.perf_counter() - start) * 1000
            if index >= 10:
                grpc_total.append(elapsed)
                grpc_backend.append(float(dict(call.trailing_metadata())["x-inference-time-ms"]))
    rest_over = [t - b for t, b in zip(rest_total, rest_backend, strict=True)]
    grpc_over = [t - b for t, b in zip(grpc_total, grpc_backend, strict=True)]
    return {
        "requests": requests,
        "rest_p50_ms": percentile(rest_total, 50),
        "rest_backend_p50_ms": percentile(rest_backend, 50),
        "rest_overhead_p50_ms": percentile(rest_over, 50),
        "grpc_p50_ms": percentile(grpc_total, 50),
        "grpc_backend_p50_ms": percentile(grpc_backend, 50),
        "grpc_overhead_p50_ms": percentile(grpc_over, 50),
    }


async def _sequential(url: str, texts: list[str], requests: int) -> tuple[list[float], list[float]]:
    """One connection, one /classify call at a time: end-to-end and backend milliseconds (after 10 warm-up calls)."""
    import aiohttp

    total: list[float] = []
    backend: list[float] = []
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=30)) as session:
        for index in range(requests + 10):
            start = time.perf_counter()
            async with session.post("/classify", json={"inputs": texts[index % len(texts)]}) as response:
                await response.read()
                response.raise_for_status()
            elapsed = (time.perf_counter() - start) * 1000
            if index >= 10:  # warm the connection first
                total.append(elapsed)
                backend.append(float(response.headers["x-inference-time-ms"]))
    return total, backend


async def _closed_loop(url: str, texts: list[str], concurrency: int, duration: float) -> dict[str, Any]:
    # aiohttp, not httpx's AsyncClient: httpx spends an order of magnitude more client CPU a request, so on a small
    # machine the client, not the server, would set the throughput.
    import aiohttp

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    stop_at = time.perf_counter() + duration
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def user(offset: int) -> None:
            index = offset
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                async with session.post("/classify", json={"inputs": texts[index % len(texts)]}) as response:
                    await response.read()
                latencies.append((time.perf_counter() - start) * 1000)
                statuses[response.status] = statuses.get(response.status, 0) + 1
                index += concurrency

        started = time.perf_counter()
        await asyncio.gather(*(user(i) for i in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "requests_per_s": len(latencies) / wall,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def measure_throughput(server: Server, texts: list[str], concurrency: int, duration: float) -> dict[str, Any]:
    asyncio.run(_closed_loop(server.url, texts, concurrency, min(3.0, duration)))  # warm-up
    before = server.metrics()
    result = asyncio.run(_closed_loop(server.url, texts, concurrency, duration))
    after = server.metrics()
    calls = after["bertserve_batch_size_count"] - before["bertserve_batch_size_count"]
    rows = after["bertserve_batch_size_sum"] - before["bertserve_batch_size_sum"]
    result.update(backend_calls=int(calls), mean_batch_size=rows / calls if calls else 0.0)
    return result


def run(
    models: str,
    concurrency: int,
    duration: float,
    requests: int,
    workdir: Path,
    parts: tuple[str, ...] = PARTS,
    route_models: str = DEFAULT_ROUTE_MODELS,
    routes: tuple[str, ...] = (),
    server_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    texts = load_texts()
    report: dict[str, Any] = {
        "models": models,
        "concurrency": concurrency,
        "duration_s": duration,
        "texts": "sst2/dev.half-a.tsv" if SST2_DEV.is_file() else "built-in",
        "cpu_count": os.cpu_count(),
        "parts": list(parts),
    }
    modes = [("batching_on", ["--batching"])] if "overhead" in parts or "batching" in parts else []
    modes += [("batching_off", ["--no-batching"])] if "batching" in parts else []
    for mode, extra in modes:
        server = Server(models, extra, workdir / f"server-{mode}.log")
        try:
            server.wait_ready()
            if "overhead" in parts and mode == "batching_on":
                report["low_load"] = measure_overhead(server, texts, requests)
            if "batching" in parts:
                report[mode] = measure_throughput(server, texts, concurrency, duration)
        finally:
            report[f"{mode}_exit_code"] = server.stop()
    if "batching" in parts:
        on, off = report["batching_on"], report["batching_off"]
        report["throughput_gain"] = on["requests_per_s"] / off["requests_per_s"] if off["requests_per_s"] else None
    if "routes" in parts:
        report["route_models"] = route_models
        report["routes"] = measure_each_route(route_models, concurrency, duration, workdir, routes, server_args)
    return report


def measure_each_route(
    models: str,
    concurrency: int,
    duration: float,
    workdir: Path,
    only: tuple[str, ...] = (),
    server_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """`service_routes.measure_routes` (of `only`, or every route) against one server with `models` and
    `server_args`."""
    payloads = load_payloads(
        sst2=SST2_DEV if SST2_DEV.is_file() else None,
        squad=SQUAD_DEV if SQUAD_DEV.is_file() else None,
        conll=CONLL_DEV if CONLL_DEV.is_file() else None,
    )
    server = Server(models, list(server_args), workdir / "server-routes.log")
    try:
        server.wait_ready()
        target = f"127.0.0.1:{server.grpc_port}"
        routes = asyncio.run(
            measure_routes(server.url, target, server.process.pid, payloads, concurrency, duration, only)
        )
    finally:
        server.stop()
    return {"payloads": payloads.sources, "by_route": routes}


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Service benchmark: {report['models']}, {report['cpu_count']} CPUs, texts: {report['texts']}", ""]
    low = report.get("low_load")
    if low is not None:
        lines += [
            "| low load (sequential) | end-to-end p50 ms | backend p50 ms | overhead p50 ms |",
            "|---|---|---|---|",
            *(
                f"| {label} | {low[f'{key}_p50_ms']:.2f} | {low[f'{key}_backend_p50_ms']:.2f} "
                f"| {low[f'{key}_overhead_p50_ms']:.2f} |"
                for label, key in (("REST /classify", "rest"), ("gRPC Classify", "grpc"))
            ),
            "",
        ]
    if "batching_on" in report and "batching_off" in report:
        lines += [
            f"| {report['concurrency']} clients, {report['duration_s']:.0f} s | req/s | p50 ms | p99 ms "
            "| backend calls | mean batch |",
            "|---|---|---|---|---|---|",
        ]
        for name, key in (("batching on", "batching_on"), ("batching off", "batching_off")):
            row = report[key]
            lines.append(
                f"| {name} | {row['requests_per_s']:.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
                f"{row['backend_calls']} | {row['mean_batch_size']:.2f} |"
            )
        lines += ["", f"Throughput gain from batching: {report['throughput_gain']:.2f}x", ""]
    if "routes" in report:
        sources = ", ".join(f"{task}: {source}" for task, source in report["routes"]["payloads"].items())
        lines += [routes_markdown(report["routes"]["by_route"], report["concurrency"], report["duration_s"]).rstrip()]
        lines += ["", f"Payloads: {sources}."]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="artifacts/bundles/minilm-sst2", help="Bundle(s) to serve (--models).")
    parser.add_argument("--concurrency", type=int, default=32, help="Concurrent clients in the throughput runs.")
    parser.add_argument("--duration", type=float, default=20.0, help="Seconds per throughput run.")
    parser.add_argument("--requests", type=int, default=200, help="Sequential requests for the overhead figure.")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="Folder for service.{json,md}.")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"What to measure, comma-separated: {', '.join(PARTS)}."
    )
    parser.add_argument(
        "--route-models", default=DEFAULT_ROUTE_MODELS, help="Bundles of the server the routes part measures."
    )
    parser.add_argument("--routes", default="", help="Routes the routes part measures, comma-separated (default all).")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="An extra `bertserve serve` argument of the routes' server."
    )
    args = parser.parse_args(argv)
    parts = tuple(part.strip() for part in args.parts.split(",") if part.strip())
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--parts takes some of {', '.join(PARTS)}, got {args.parts!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    origin = provenance(command_line("python -m bertserve.benchmarks.service", argv))
    print(f"Machine: {origin.machine}", flush=True)
    routes = tuple(route.strip() for route in args.routes.split(",") if route.strip())
    report = run(
        args.models, args.concurrency, args.duration, args.requests, args.out, parts, args.route_models, routes,
        tuple(args.server_arg),
    )  # fmt: skip
    write_report(args.out, "service", origin, report, markdown(report))
    print(render(origin, markdown(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
