"""`bertserve loadtest`: validate everything, run locust headless against each target, write the results.

Order of work: (1) check every input before any load: profile, mix, thresholds, data files (payloads are
read now), loopback-only hosts, history and baseline, an external host's health; (2) per target (with
`--peers`: the naive peer, the triton peer, ours without batching, then ours with batching; or one target)
start the server if needed, run locust in a
subprocess with the profile's load shape (with `--workers N`: locust's distributed mode, a master on
127.0.0.1 and N worker processes whose samples are merged), show a progress line, stop the server; (3) write
`<results>/<timestamp>-<profile>/`: locust's CSVs, `<target>_samples.csv`, `summary.json`, `report.md`,
`latency.png`; append to the history file and compare with the previous run (or a baseline).
Exit status: 0; 3 = a regression beyond the thresholds; 4 = a check of the profile failed (both: 4).
Locust runs in its own process because it monkey-patches the standard library with gevent on import.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TextIO

from bundles.hardware import read_cpu_info
from loadtests import endpoints as ep
from loadtests.history import (
    append_history,
    changes_to_json,
    check_baseline,
    compare,
    find_reference,
    history_record,
    read_history,
)
from loadtests.loopback import check_grpc_target, check_http_url
from loadtests.payloads import DEFAULT_LIMIT, Payloads, load_payloads
from loadtests.plot import plot_run
from loadtests.profiles import Profile, get_profile
from loadtests.report import peer_rows, render_report
from loadtests.samples import WORKER_ENV, Sample, read_samples, worker_path, write_samples
from loadtests.summary import ALL, stage_figures, summarize
from loadtests.targets import (
    LOOPBACK,
    PEER_MODULES,
    REPO,
    RunningServer,
    Target,
    check_external,
    free_port,
    ours_command,
    peer_command,
    process_cpu_seconds,
    triton_venv_problem,
)

if TYPE_CHECKING:
    from loadtests.hostile.profile import HostileConfig

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
DEFAULT_RESULTS = REPO / "loadtests" / "results"
DEFAULT_BUNDLES_DIR = REPO / "artifacts" / "bundles"
DEFAULT_MODELS = {
    "classify": "minilm-sst2",
    "qa": "minilm-squad",
    "ner": "minilm-conll03",
    "embed": "minilm",
    "rerank": "minilm-rerank",
}
EXIT_OK, EXIT_REGRESSION, EXIT_CHECKS = 0, 3, 4
MAX_WORKERS = 32
HOSTILE_MIX = "/classify=1,/qa=1,/ner=1"
"""What the server the hostile profile starts serves by default (and /embed when the minilm bundle is built)."""
PEERS = ("naive", "triton", "ours-no-batching")
"""What `--peers` runs beside ours with batching, in this order (`--skip-peer` leaves one out)."""


class LoadGeneratorError(RuntimeError):
    """Locust failed or hung; the message ends with its log."""


@dataclass
class RunOptions:
    """Everything `bertserve loadtest` can be told (validated by `plan_run` before any load)."""

    profile: str = "smoke"
    mix: str = ep.DEFAULT_MIX
    host: str | None = None
    grpc_host: str | None = None
    peers: bool = False
    skip_peers: list[str] = field(default_factory=list)
    models: str | None = None
    peer_models: str | None = None
    bundles_dir: Path | None = None
    sst2: Path | None = None
    squad: Path | None = None
    conll: Path | None = None
    payload_limit: int = DEFAULT_LIMIT
    users: int | None = None
    duration_s: float | None = None
    spawn_rate: float | None = None
    results_dir: Path | None = None
    """Default: loadtests/results of the repository."""
    history: Path | None = None
    baseline: str | None = None
    tag: str | None = None
    max_p99_increase: float = 0.25
    max_rps_drop: float = 0.15
    server_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 300.0
    seed: int = 0
    workers: int = 0
    """0: one locust process; N: locust's distributed mode, a master and N worker processes."""
    hostile: str | None = None
    """`key=value,...` changes to the hostile profile's sizes and bounds (`loadtests.hostile.profile.HostileConfig`)."""


@dataclass
class Plan:
    profile: Profile
    mix: ep.Mix
    payloads: Payloads
    targets: list[Target]
    history_path: Path
    history: list[dict[str, Any]]
    skipped: dict[str, str] = field(default_factory=dict)
    """Peers `--peers` could not run here -> why."""
    hostile: HostileConfig | None = None
    """The hostile profile's sizes and bounds (None for the locust profiles)."""


@dataclass
class RunResult:
    exit_code: int
    run_dir: Path
    summary: dict[str, Any]


# ---- validation (nothing is started or sent before this passes) ----------------------------------------
def parse_task_models(text: str | None, needed: list[str], option: str) -> dict[str, str]:
    """`classify=minilm-sst2,qa=x` -> {task: model} for the needed tasks, defaults for the rest."""
    given: dict[str, str] = {}
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        task_name, sep, model = item.partition("=")
        if not sep or task_name not in DEFAULT_MODELS or not model:
            raise ValueError(f"{option} item {item!r} is not TASK=MODEL with TASK in {', '.join(DEFAULT_MODELS)}")
        given[task_name] = model
    return {task_name: given.get(task_name, DEFAULT_MODELS[task_name]) for task_name in needed}


def resolve_bundle(entry: str, bundles_dir: Path) -> str:
    """An absolute bundle folder for a `--models` value (a folder, or a name under `bundles_dir`), read from
    disk the way `bertserve serve` reads it; FileNotFoundError before any server is started."""
    for candidate in (Path(entry).expanduser(), bundles_dir / entry):
        if (candidate / "manifest.json").is_file():
            return str(candidate.resolve())
    raise FileNotFoundError(
        f"no serving bundle {entry!r} (a folder with manifest.json, or a name under {bundles_dir}): "
        "build the default bundles with `make bundles`, or give --models TASK=FOLDER"
    )


def resolve_peer_model(entry: str) -> str:
    """An absolute model folder for the naive peer (a folder or a built-in model name)."""
    from bert_model.registry import resolve_model_path  # torch-free

    return str(resolve_model_path(entry))


def _check_numbers(options: RunOptions) -> None:
    if options.max_p99_increase < 0 or options.max_rps_drop < 0 or options.max_rps_drop >= 1:
        raise ValueError(
            f"thresholds: --max-p99-increase must be >= 0 (got {options.max_p99_increase}) and --max-rps-drop "
            f"in [0, 1) (got {options.max_rps_drop})"
        )
    if options.startup_timeout_s <= 0:
        raise ValueError(f"--startup-timeout must be positive, got {options.startup_timeout_s}")
    if not 0 <= options.workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be between 0 (one locust process) and {MAX_WORKERS}, got {options.workers}")


def _external_target(options: RunOptions, mix: ep.Mix) -> Target:
    kinds = ep.protocols(mix)
    if "rest" in kinds and not options.host:
        raise ValueError("the mix has REST endpoints: give --host http://127.0.0.1:8000 (or drop --grpc-host)")
    if "grpc" in kinds and not options.grpc_host:
        raise ValueError("the mix has gRPC endpoints: give --grpc-host 127.0.0.1:50051 as well")
    http_url = check_http_url(options.host) if options.host else None
    grpc_target = check_grpc_target(options.grpc_host) if options.grpc_host else None
    return Target("external", "external", mix, http_url=http_url, grpc_target=grpc_target)


def _started_targets(options: RunOptions, profile: Profile, mix: ep.Mix) -> tuple[list[Target], dict[str, str]]:
    """The targets to start, and the peers skipped because this machine cannot run them (-> why)."""
    needed = ep.tasks(mix)
    bundles_dir = (options.bundles_dir or DEFAULT_BUNDLES_DIR).expanduser().resolve()
    ours_by_task = {
        task_name: resolve_bundle(model, bundles_dir)
        for task_name, model in parse_task_models(options.models, needed, "--models").items()
    }
    ours = list(ours_by_task.values())
    extra = [*profile.server_args, *options.server_args]
    peers = [peer for peer in PEERS if peer not in options.skip_peers] if options.peers else []
    targets, skipped = [], {}
    if "naive" in peers:
        peer_models = parse_task_models(options.peer_models or options.models, needed, "--peer-models")
        command, url = peer_command("naive", {task: resolve_peer_model(m) for task, m in peer_models.items()})
        targets.append(Target("naive", "naive", ep.as_rest(mix), command=command, http_url=url, ready_path="/health"))
    if "triton" in peers:
        problem = triton_venv_problem()
        if problem is None:
            command, url = peer_command("triton", ours_by_task)
            targets.append(
                Target("triton", "triton", ep.as_rest(mix), command=command, http_url=url, ready_path="/health")
            )
        else:
            skipped["triton"] = problem
    for batching in [False, True] if "ours-no-batching" in peers else [True]:
        command, url, grpc_target = ours_command(ours, batching, profile.request_timeout_s, extra, None)
        label = "ours-batching" if batching else "ours-no-batching"
        targets.append(Target(label, "ours", mix, batching, command, url, grpc_target))
    return targets, skipped


def _hostile_plan(options: RunOptions, profile: Profile) -> tuple[HostileConfig | None, str]:
    """The hostile profile's sizes and bounds and its mix (None and `--mix` for the other profiles); ValueError
    for the options it does not take."""
    if profile.driver != "hostile":
        if options.hostile is not None:
            raise ValueError(f"--hostile sizes the hostile profile only, not {profile.name!r}")
        return None, options.mix
    from loadtests.hostile.profile import parse_hostile

    given = {"--users": options.users, "--duration": options.duration_s, "--spawn-rate": options.spawn_rate}
    wrong = [name for name, value in given.items() if value is not None]
    if options.peers or options.workers:
        wrong.append("--peers" if options.peers else "--workers")
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: not for the hostile profile (no locust users); size it with --hostile")
    if options.grpc_host is not None and options.host is None:
        raise ValueError("the hostile profile needs the REST front door: give --host (and --grpc-host for gRPC)")
    mix = options.mix
    if mix == ep.DEFAULT_MIX:  # the default server's tasks; its embedding model when its bundle is built
        bundles_dir = (options.bundles_dir or DEFAULT_BUNDLES_DIR).expanduser()
        embed = (bundles_dir / DEFAULT_MODELS["embed"] / "manifest.json").is_file() or options.host is not None
        mix = HOSTILE_MIX + (",/embed" if embed else "")
    if "classify" not in ep.tasks(ep.parse_mix(mix)):
        raise ValueError(f"--mix {mix!r}: the hostile profile watches small /classify requests: include /classify")
    return parse_hostile(options.hostile), mix


def plan_run(options: RunOptions) -> Plan:
    """Check every input and build the targets; raises ValueError / FileNotFoundError before any load."""
    profile = get_profile(options.profile)
    hostile, mix_text = _hostile_plan(options, profile)
    if hostile is None:
        profile = profile.with_overrides(options.users, options.duration_s, options.spawn_rate)
    mix = ep.parse_mix(mix_text)
    _check_numbers(options)
    external = options.host is not None or options.grpc_host is not None
    if external and options.peers:
        raise ValueError("--peers starts its own servers: drop --host / --grpc-host")
    unknown = sorted(set(options.skip_peers) - set(PEERS))
    if unknown:
        raise ValueError(f"--skip-peer {', '.join(unknown)}: the peers are {', '.join(PEERS)}")
    payloads = load_payloads(options.sst2, options.squad, options.conll, options.payload_limit, options.seed)
    history_path = options.history or (options.results_dir or DEFAULT_RESULTS) / "history.jsonl"
    history = read_history(history_path)
    if options.baseline is not None:
        check_baseline(history, options.baseline, history_path)
    targets, skipped = ([_external_target(options, mix)], {}) if external else _started_targets(options, profile, mix)
    for target in targets:
        if target.kind == "external":
            check_external(target)
    return Plan(profile, mix, payloads, targets, history_path, history, skipped, hostile)


# ---- one target ---------------------------------------------------------------------------------------
WORKER_WAIT_S = 60
"""Longest the master of a distributed run waits for its workers to connect."""


def _user_classes(target: Target) -> list[str]:
    return [name for name, kind in (("RestUser", "rest"), ("GrpcUser", "grpc")) if kind in ep.protocols(target.mix)]


def locust_command(
    target: Target, config_path: Path, csv_prefix: Path, workers: int = 0, master_port: int | None = None
) -> list[str]:
    """The headless locust run of `target`: one process, or (`workers` > 0) the master of a distributed run that
    waits for `workers` workers on 127.0.0.1:`master_port` and writes the CSVs of their aggregated stats."""
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--loglevel", "WARNING", "--csv", str(csv_prefix), "--csv-full-history", "--exit-code-on-error", "0",
        "--host", target.http_url or "http://127.0.0.1", "--bertserve-config", str(config_path),
    ]  # fmt: skip
    if workers:
        command += ["--master", "--master-bind-host", LOOPBACK, "--master-bind-port", str(master_port)]
        command += ["--expect-workers", str(workers), "--expect-workers-max-wait", str(WORKER_WAIT_S)]
    return [*command, *_user_classes(target)]


def worker_command(target: Target, config_path: Path, master_port: int) -> list[str]:
    """A locust worker that takes its users from the master on 127.0.0.1:`master_port`."""
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker", "--master-host", LOOPBACK,
        "--master-port", str(master_port), "--loglevel", "WARNING", "--host", target.http_url or "http://127.0.0.1",
        "--bertserve-config", str(config_path), *_user_classes(target),
    ]  # fmt: skip


@dataclass
class LoadProcess:
    """One locust process of a run and the CPU seconds it had used when last seen."""

    role: str
    """`locust` (a single process), `master` or `worker N`."""
    process: subprocess.Popen[bytes]
    cpu_s: float = 0.0

    def refresh_cpu(self) -> None:
        seen = process_cpu_seconds(self.process.pid)
        if seen is not None:
            self.cpu_s = seen


def merge_progress(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One progress record from the workers' own: counts, users and ok/s added up, the worst p50 / p99."""
    if len(parts) == 1:
        return parts[0]
    counts: dict[str, int] = {}
    for part in parts:
        for outcome, count in part.get("counts", {}).items():
            counts[outcome] = counts.get(outcome, 0) + int(count)

    def worst(key: str) -> float | None:
        values = [part[key] for part in parts if part.get(key) is not None]
        return max(values) if values else None

    return {
        "t": max(float(part.get("t", 0)) for part in parts),
        "users": sum(int(part.get("users", 0)) for part in parts),
        "counts": counts,
        "ok_rps": sum(float(part.get("ok_rps", 0)) for part in parts),
        "p50_ms": worst("p50_ms"),
        "p99_ms": worst("p99_ms"),
    }


def _read_progress(paths: list[Path]) -> dict[str, Any] | None:
    parts = []
    for path in paths:
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return merge_progress(parts) if parts else None


def _progress_line(label: str, profile: Profile, progress: dict[str, Any]) -> str:
    counts = progress.get("counts", {})
    p50, p99 = progress.get("p50_ms"), progress.get("p99_ms")
    latency = f"p50 {p50:.0f} ms  p99 {p99:.0f} ms" if p50 is not None and p99 is not None else "p50 –  p99 –"
    return (
        f"[{profile.name}] {label:<17} {progress.get('t', 0):5.0f}/{profile.duration_s:.0f}s  "
        f"users {progress.get('users', 0):3d}  ok {counts.get('ok', 0):6d}  429 {counts.get('rejected', 0):5d}  "
        f"timeouts {counts.get('timeout', 0):4d}  errors {counts.get('error', 0):4d}  "
        f"ok/s {progress.get('ok_rps', 0):7.1f}  {latency}"
    )


def _watch(processes: list[LoadProcess], progress_paths: list[Path], label: str, profile: Profile, out: TextIO) -> int:
    """Wait for locust (the first process: the only one, or the master), printing the progress line (in place on
    a terminal, every 5 s otherwise) and noting every process's CPU time."""
    main = processes[0].process
    allowed_s = profile.duration_s + 120 + (WORKER_WAIT_S if len(processes) > 1 else 0)
    limit = time.monotonic() + allowed_s
    interactive = out.isatty()
    last_print = 0.0
    line = printed = ""
    while main.poll() is None:
        if time.monotonic() > limit:
            main.kill()
            raise LoadGeneratorError(f"locust did not finish within {allowed_s:.0f}s for {label}")
        time.sleep(0.5)
        for process in processes:
            process.refresh_cpu()
        progress = _read_progress(progress_paths)
        if progress is None:
            continue
        line = _progress_line(label, profile, progress)
        if interactive:
            out.write("\r" + line)
            out.flush()
        elif time.monotonic() - last_print >= 5:
            out.write(line + "\n")
            printed, last_print = line, time.monotonic()
    if interactive and line:
        out.write("\n")
    elif line != printed:
        out.write(line + "\n")
    return int(main.returncode)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _start_locust(target: Target, config_path: Path, run_dir: Path, workers: int, log: IO[bytes]) -> list[LoadProcess]:
    """The locust processes of one target: [locust], or [master, worker 1, ..., worker N] (all logging to `log`)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    master_port = free_port() if workers else None
    command = locust_command(target, config_path, run_dir / target.label, workers, master_port)
    started = [LoadProcess("master" if workers else "locust", _popen(command, environment, log))]
    for index in range(1, workers + 1):
        assert master_port is not None
        worker_environment = {**environment, WORKER_ENV: str(index)}
        command = worker_command(target, config_path, master_port)
        started.append(LoadProcess(f"worker {index}", _popen(command, worker_environment, log)))
    return started


def _popen(command: list[str], environment: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT)


def _stop_workers(processes: list[LoadProcess], timeout_s: float = 30.0) -> None:
    """Wait for the workers (the master tells them to quit when it ends), killing any still running after
    `timeout_s`; the master is killed if it is still running (a failed watch)."""
    deadline = time.monotonic() + timeout_s
    for load_process in processes:
        process = load_process.process
        if load_process.role in ("locust", "master") and process.poll() is None:
            process.kill()
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _own_files(path: Path, workers: int) -> list[Path]:
    """The files a run writes where its config says `path`: that one, or one per worker."""
    return [worker_path(path, index) for index in range(1, workers + 1)] if workers else [path]


def run_locust(
    target: Target, plan: Plan, run_dir: Path, seed: int, out: TextIO, workers: int = 0
) -> tuple[list[Sample], dict[str, Any]]:
    """Drive `target` with the profile (one locust process, or a master and `workers` workers); the samples of
    every request and the load generator's CPU: `cpu_s` (every locust process, from their rusage once ended)
    and `processes` (role and CPU seconds of each, as last seen while it ran)."""
    config_path = run_dir / f"{target.label}_config.json"
    samples_path = run_dir / f"{target.label}_samples.csv"
    progress_path = run_dir / f".{target.label}_progress.json"
    config = {
        "mix": target.mix,
        "payloads_path": str(run_dir / "payloads.json"),
        "grpc_target": target.grpc_target,
        "stages": [[s.end_s, s.users, s.spawn_rate] for s in plan.profile.stages],
        "client_timeout_s": plan.profile.client_timeout_s,
        "reject_backoff_s": plan.profile.reject_backoff_s,
        "samples_path": str(samples_path),
        "progress_path": str(progress_path),
        "seed": seed,
    }
    config_path.write_text(json.dumps(config, indent=2))
    log_path = run_dir / f"{target.label}_locust.log"
    with open(log_path, "wb") as log:
        cpu_before = _children_cpu_s()  # the locust processes are the only children reaped until they end
        processes = _start_locust(target, config_path, run_dir, workers, log)
        try:
            code = _watch(processes, _own_files(progress_path, workers), target.label, plan.profile, out)
        finally:
            _stop_workers(processes)
        loadgen = {
            "workers": workers,
            "cpu_s": round(_children_cpu_s() - cpu_before, 2),
            "processes": [{"role": p.role, "cpu_s": round(p.cpu_s, 2)} for p in processes],
        }
    for path in _own_files(progress_path, workers):
        path.unlink(missing_ok=True)
    written = _own_files(samples_path, workers)
    if code != 0 or not all(path.exists() for path in written):
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise LoadGeneratorError(f"locust failed for {target.label} (exit {code}):\n{tail}")
    samples = sorted((s for path in written for s in read_samples(path)), key=lambda sample: sample.t_end)
    if workers:  # one file per target, as a single process writes it
        write_samples(samples_path, samples)
        for path in written:
            path.unlink()
    return samples, loadgen


def run_target(target: Target, plan: Plan, run_dir: Path, options: RunOptions, out: TextIO) -> dict[str, Any]:
    """Start (if needed), load, stop one target; its entry of summary.json plus its samples."""
    info = target.summary_entry()
    if target.command:
        out.write(f"starting {target.label}: {' '.join(target.command[1:])}\n")
        with RunningServer(target, run_dir / f"{target.label}_server.log") as server:
            info["ready_s"] = round(server.wait_ready(options.startup_timeout_s), 2)
            server_start = server.cpu_seconds()
            samples, loadgen = run_locust(target, plan, run_dir, options.seed, out, options.workers)
            server_end = server.cpu_seconds()
        if server_start is not None and server_end is not None:
            info["server_cpu_s"] = round(server_end - server_start, 2)
            answered = sum(1 for sample in samples if sample.outcome == "ok")
            # the CPU was counted over the whole run, warm-up included: so are the answers
            info["server_cpu_ms_per_ok"] = round(info["server_cpu_s"] * 1000 / answered, 2) if answered else None
    else:
        samples, loadgen = run_locust(target, plan, run_dir, options.seed, out, options.workers)
    info["loadgen_cpu_s"] = loadgen["cpu_s"]
    info["loadgen"] = loadgen
    info["summary"] = summarize(samples, plan.profile.warmup_s)
    if len(plan.profile.stages) > 1:
        info["summary"]["stages"] = stage_figures(samples, [(s.end_s, s.users) for s in plan.profile.stages])
    info["_samples"] = samples
    return info


# ---- checks, history, outputs -------------------------------------------------------------------------
def evaluate_checks(profile: Profile, targets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The profile's checks on our targets (the peers have no queue limit nor deadline to check)."""
    checks: list[dict[str, Any]] = []
    rules = profile.checks
    for label, target in targets.items():
        if target["kind"] in ("naive", "triton"):
            continue
        figures = target["summary"]["endpoints"][ALL]

        def add(description: str, passed: bool, label: str = label) -> None:
            checks.append({"target": label, "description": description, "passed": bool(passed)})

        if figures["requests"] == 0:
            add("at least one request completed", False)
            continue
        if rules.max_error_rate is not None:
            add(
                f"error rate {figures['error_rate']:.2%} <= {rules.max_error_rate:.2%}",
                figures["error_rate"] <= rules.max_error_rate,
            )
        if rules.expect_rejections:
            add(
                f"{figures['rejected']} requests rejected with 429 / RESOURCE_EXHAUSTED (expected > 0)",
                figures["rejected"] > 0,
            )
        if rules.max_timeouts is not None:
            add(f"{figures['timeouts']} timeouts <= {rules.max_timeouts}", figures["timeouts"] <= rules.max_timeouts)
        p99 = figures["latency_ms"]["p99"]
        if rules.accepted_p99_within_timeout:
            limit_ms = profile.request_timeout_s * 1000
            add(f"accepted p99 {p99} ms < request timeout {limit_ms:.0f} ms", p99 is not None and p99 < limit_ms)
    return checks


def _regressions(
    plan: Plan, run_id: str, options: RunOptions, targets: dict[str, dict[str, Any]], cpu: str
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    shape = profile_shape(plan.profile)
    for label, target in targets.items():
        reference = find_reference(
            plan.history, plan.profile.name, label, target["mix"], options.baseline, run_id, shape, cpu
        )
        if reference is None:
            result[label] = {
                "reference": None,
                "baseline": options.baseline,
                "changes": [],
                "lines": [],
                "regression": False,
            }
            continue
        current = {name: _compact(f) for name, f in target["summary"]["endpoints"].items()}
        changes = compare(current, reference["figures"], options.max_p99_increase, options.max_rps_drop)
        result[label] = {
            "reference": reference["run_id"],
            "baseline": options.baseline,
            "changes": changes_to_json(changes),
            "lines": [change.describe() for change in changes],
            "regression": any(change.regression for change in changes),
        }
    return result


def profile_shape(profile: Profile) -> str:
    """`users@end_s` of every stage: runs are compared only with runs of the same shape."""
    return ",".join(f"{stage.users}@{stage.end_s:g}" for stage in profile.stages)


def _compact(figures: dict[str, Any]) -> dict[str, Any]:
    return {"ok": figures["ok"], "ok_rps": figures["ok_rps"], "p99": figures["latency_ms"]["p99"]}


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _machine() -> dict[str, Any]:
    """Where the run ran: the CPU in one line (speed ratios differ between CPU families), cores, OS, Python."""
    return {
        "cpu": read_cpu_info().summary(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_outputs(run_dir: Path, summary: dict[str, Any], samples: dict[str, list[Sample]]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    (run_dir / "report.md").write_text(render_report(summary))
    title = f"{summary['run_id']}: {summary['mix']}"
    stages = [(stage["end_s"], stage["users"]) for stage in summary["profile"]["stages"]]
    plot_run(run_dir / "latency.png", samples, title, summary["profile"]["warmup_s"], stages)


def _new_run_dir(results_dir: Path, profile: str) -> tuple[str, Path]:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{profile}"
    run_dir = results_dir / run_id
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_id = f"{stamp}-{profile}-{suffix}"
        run_dir = results_dir / run_id
    run_dir.mkdir(parents=True)
    return run_id, run_dir


def execute(plan: Plan, options: RunOptions, out: TextIO = sys.stderr) -> RunResult:
    """Run every target of a checked plan and write the results."""
    run_id, run_dir = _new_run_dir(options.results_dir or DEFAULT_RESULTS, plan.profile.name)
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    (run_dir / "payloads.json").write_text(plan.payloads.to_json())
    for label, why in plan.skipped.items():
        out.write(f"peer {label} skipped: {why}\n")
    targets = {t.label: _run_one(t, plan, run_dir, options, out) for t in plan.targets}
    samples = _plotted(targets)
    checks = evaluate_checks(plan.profile, targets) if plan.hostile is None else []
    checks += [check for target in targets.values() for check in target.pop("_checks", [])]
    summary: dict[str, Any] = {
        "run_id": run_id,
        "created": created,
        "profile": plan.profile.to_dict(),
        "mix": ep.format_mix(plan.mix),
        "payload_sources": plan.payloads.sources,
        "payload_counts": plan.payloads.counts(),
        "git": _git_commit(),
        "machine": _machine(),
        "tag": options.tag,
        "targets": targets,
        "skipped_peers": plan.skipped,
        "comparison": peer_rows(targets),
        "checks": checks,
    }
    summary["regression"] = _regressions(plan, run_id, options, targets, summary["machine"]["cpu"])
    write_outputs(run_dir, summary, samples)
    meta = {"git": summary["git"], "machine": summary["machine"], "shape": profile_shape(plan.profile)}
    records = [
        history_record(run_id, created, plan.profile.name, label, t["mix"], options.tag, t["summary"], meta)
        for label, t in targets.items()
    ]
    for record in records:  # the hostile profile's bounds, judged per target
        judged = [c for c in checks if c.get("target") == record["target"] and "description" in c]
        if plan.hostile is not None and judged:
            record["checks"] = [{"description": c["description"], "passed": c["passed"]} for c in judged]
    append_history(plan.history_path, records)
    return RunResult(_exit_code(summary), run_dir, summary)


def _run_one(target: Target, plan: Plan, run_dir: Path, options: RunOptions, out: TextIO) -> dict[str, Any]:
    if plan.hostile is None:
        return run_target(target, plan, run_dir, options, out)
    from loadtests.hostile.profile import run_hostile_target

    return run_hostile_target(target, plan.hostile, plan.payloads, run_dir, options, out)


def _plotted(targets: dict[str, dict[str, Any]]) -> dict[str, list[Sample]]:
    """The series of latency.png: each target's samples (a hostile target's per kind of request)."""
    series: dict[str, list[Sample]] = {}
    for label, target in targets.items():
        samples = target.pop("_samples")
        if isinstance(samples, dict):
            series.update({name if len(targets) == 1 else f"{label} {name}": s for name, s in samples.items()})
        else:
            series[label] = samples
    return series


def _exit_code(summary: dict[str, Any]) -> int:
    """4 on a failed check, 3 when one of our own targets regressed; a peer's change is reported only (the peers do
    not change with our code: a peer slower than in its previous run is the machine, which then ran slower for every
    target of the run)."""
    if not all(check["passed"] for check in summary["checks"]):
        return EXIT_CHECKS
    if any(entry["regression"] for label, entry in summary["regression"].items() if label not in PEER_MODULES):
        return EXIT_REGRESSION
    return EXIT_OK
