"""`bertserve loadtest`: locust load tests of the service (and peers) with a named profile.

Imports nothing heavy at module level (no locust: it monkey-patches the standard library on import).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bertserve.cli_errors import exit_on_user_error
from loadtests.endpoints import DEFAULT_MIX
from loadtests.profiles import PROFILES

PROFILE_HELP = "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values())


def register(app: typer.Typer) -> None:
    app.command("loadtest")(loadtest)


def loadtest(
    profile: Annotated[str, typer.Option(help=f"Load profile. {PROFILE_HELP}")] = "smoke",
    mix: Annotated[
        str,
        typer.Option(
            help="Weighted endpoints, e.g. '/classify=3,/qa=1' or 'QA.Extract=1'. REST: /classify /qa /ner; gRPC: "
            "Classifier.Classify QA.Extract NER.Recognize."
        ),
    ] = DEFAULT_MIX,
    host: Annotated[
        str | None,
        typer.Option(help="Test a running service at this REST URL (loopback only) instead of starting one."),
    ] = None,
    grpc_host: Annotated[
        str | None, typer.Option(help="gRPC host:port of the running service (loopback only), for gRPC endpoints.")
    ] = None,
    peers: Annotated[
        bool,
        typer.Option(
            "--peers/--no-peers",
            help="Also run the peers side by side: naive (transformers, one request at a time), triton (the same "
            "bundles behind a real Triton's dynamic batcher; needs `make triton-venv`) and ours without batching.",
        ),
    ] = False,
    skip_peer: Annotated[
        list[str] | None, typer.Option(help="Leave this peer out of --peers: naive, triton, ours-no-batching.")
    ] = None,
    models: Annotated[
        str | None, typer.Option(help="Bundles to serve per task, e.g. 'classify=minilm-sst2,qa=DIR'. [default names]")
    ] = None,
    peer_models: Annotated[
        str | None, typer.Option(help="Models of the naive peer per task (folders or built-in names). [as --models]")
    ] = None,
    bundles_dir: Annotated[
        Path | None, typer.Option(help="Where bundle names are looked up (bertserve serve).")
    ] = None,
    sst2: Annotated[
        Path | None, typer.Option(help="SST-2 TSV (or one sentence per line) for /classify payloads.")
    ] = None,
    squad: Annotated[Path | None, typer.Option(help="SQuAD JSON for /qa and QA.Extract payloads.")] = None,
    conll: Annotated[Path | None, typer.Option(help="CoNLL-2003 file for /ner payloads.")] = None,
    payload_limit: Annotated[int, typer.Option(help="Most payloads kept per task (a seeded sample).")] = 2000,
    users: Annotated[int | None, typer.Option(help="Override the profile's users (single-stage profiles).")] = None,
    duration: Annotated[float | None, typer.Option(help="Override the profile's duration in seconds.")] = None,
    spawn_rate: Annotated[float | None, typer.Option(help="Override the users started per second.")] = None,
    results_dir: Annotated[
        Path | None, typer.Option(help="Where <timestamp>-<profile>/ folders go. [default loadtests/results]")
    ] = None,
    history: Annotated[Path | None, typer.Option(help="History file. [default RESULTS_DIR/history.jsonl]")] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Compare with this tag or run id instead of the previous run of the profile.")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="Name this run in the history (usable later as --baseline).")] = None,
    max_p99_increase: Annotated[
        float, typer.Option(help="Regression if accepted p99 grows by more than this fraction.")
    ] = 0.25,
    max_rps_drop: Annotated[
        float, typer.Option(help="Regression if throughput falls by more than this fraction.")
    ] = 0.15,
    server_arg: Annotated[
        list[str] | None, typer.Option(help="Extra `bertserve serve` argument for started services (repeatable).")
    ] = None,
    startup_timeout: Annotated[float, typer.Option(help="Seconds a started server may take to be ready.")] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of payload sampling and each user's choices.")] = 0,
    workers: Annotated[
        int,
        typer.Option(
            help="Locust's distributed mode: one master and this many worker processes share the users (for loads "
            "one locust process cannot generate: it uses one core). 0 = one process."
        ),
    ] = 0,
    hostile: Annotated[
        str | None,
        typer.Option(
            help="--profile hostile: sizes and bounds as KEY=VALUE,..., e.g. 'values=100,flood=200,"
            "header_timeout_s=5,phases=distinct+flood' (keys: the fields of loadtests.hostile.profile.HostileConfig; "
            "max_body_bytes, max_header_bytes, max_queue, header_timeout_s, body_timeout_s must be the server's "
            "settings; "
            "max_inputs and max_text_chars are read from its OpenAPI schema where it states them)."
        ),
    ] = None,
) -> None:
    """Load-test the service with locust: summary, report, plot, history. Exit 3: regression; 4: failed check."""
    from loadtests.runner import LoadGeneratorError, RunOptions, execute, plan_run
    from loadtests.targets import TargetStartError

    options = RunOptions(
        profile=profile, mix=mix, host=host, grpc_host=grpc_host, peers=peers,
        skip_peers=list(skip_peer or []), models=models,
        peer_models=peer_models, bundles_dir=bundles_dir, sst2=sst2, squad=squad, conll=conll,
        payload_limit=payload_limit, users=users, duration_s=duration, spawn_rate=spawn_rate,
        results_dir=results_dir, history=history, baseline=baseline, tag=tag,
        max_p99_increase=max_p99_increase, max_rps_drop=max_rps_drop, server_args=list(server_arg or []),
        startup_timeout_s=startup_timeout, seed=seed, workers=workers, hostile=hostile,
    )  # fmt: skip
    with exit_on_user_error():
        plan = plan_run(options)
    try:
        result = execute(plan, options)
    except (TargetStartError, LoadGeneratorError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from error
    _print_result(result.summary, result.run_dir)
    raise typer.Exit(code=result.exit_code)


def _print_result(summary: dict, run_dir: Path) -> None:
    from loadtests.report import peer_table
    from loadtests.targets import PEER_MODULES

    out = sys.stdout
    out.write("\n" + peer_table(summary["comparison"]) + "\n\n")
    for check in summary["checks"]:
        verdict = "SKIP" if check.get("skipped") else "PASS" if check["passed"] else "FAIL"
        out.write(f"{verdict} {check['target']}: {check['description']}\n")
    for label, regression in summary["regression"].items():
        if regression["reference"] is None:
            out.write(f"{label}: no earlier run to compare with\n")
        note = " (a peer: reported, not judged)" if label in PEER_MODULES else ""
        for line in regression["lines"]:
            out.write(f"{label} vs {regression['reference']}: {line}{note}\n")
    out.write(f"results: {run_dir}\n")
