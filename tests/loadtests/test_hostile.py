"""The hostile profile: its options, its status classes and checks, the sizing of its largest legal requests,
and short runs that pass a sound server, flag a server that breaks bounds (memory grown per request value, 500s
for bad JSON or for a request over its queue, slow clients never cut), and measure the real tiny-model server
(RSS from /proc, both front doors)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.hostile import cases
from loadtests.hostile.checks import hostile_checks
from loadtests.hostile.net import parse_rss_metric, status_class
from loadtests.hostile.profile import HostileConfig, parse_hostile
from loadtests.runner import RunOptions, execute, plan_run
from loadtests.targets import free_port
from tests.loadtests.test_smoke import REPO, _run_dir

SHORT = (
    "values=30,concurrency=4,idle_s=0.5,max_size_s=2,big_clients=1,flood=50,slow_clients=3,header_timeout_s=1,"
    "body_timeout_s=1,slow_slack_s=1,max_distinct_growth_mb=40,pipelined=5,pipeline_requests=500,"
    "small_p99_ms=600000"  # the latency bound is the real run's check; these tests assert behaviour, not time
)


def test_parse_hostile_takes_known_keys_and_refuses_the_rest() -> None:
    config = parse_hostile("values=20, flood=50, body_timeout_s=2.5, phases=flood+distinct")
    assert (config.values, config.flood, config.body_timeout_s) == (20, 50, 2.5)
    assert config.phases == ("distinct", "flood")  # always in the profile's order
    assert parse_hostile(None) == HostileConfig()
    for text, message in (
        ("valuez=3", "not KEY=VALUE"),
        ("values", "not KEY=VALUE"),
        ("values=many", "is not a int"),
        ("flood=-1", ">= 0"),
        ("values=0", "values must be positive"),
        ("phases=warmup+nap", "choose from"),
        ("flood=100000", "at most 5000 flood connections"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_hostile(text)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("200", "ok"), ("OK", "ok"), ("422", "client-error"), ("INVALID_ARGUMENT", "client-error"),
        ("UNIMPLEMENTED", "client-error"), ("429", "rejected"), ("RESOURCE_EXHAUSTED", "rejected"),
        ("503", "unavailable"), ("UNAVAILABLE", "unavailable"), ("504", "timeout"), ("no-answer", "timeout"),
        ("DEADLINE_EXCEEDED", "timeout"), ("500", "server-error"), ("502", "server-error"),
        ("INTERNAL", "server-error"), ("UNKNOWN", "server-error"), ("reset", "connection"), ("closed", "connection"),
    ],
)  # fmt: skip
def test_status_classes(status: str, expected: str) -> None:
    assert status_class(status) == expected


def test_rss_metric_is_read_from_an_exposition() -> None:
    text = "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    text += "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1.2345e+08\n"
    assert parse_rss_metric(text) == 123450000
    assert parse_rss_metric("requests_total 3\n") is None


REFUSAL = "the request needs 1919 sequences, more than this model's queue holds (512); send fewer or shorter inputs"


def test_the_largest_legal_qa_request_comes_from_the_servers_count_of_windows() -> None:
    limits = cases.Limits()
    sized = cases.size_windowed("qa", 19, "422", '{"error": {"message": "' + REFUSAL + '"}}', limits, 100_000, 999)
    assert (sized.needed, sized.max_queue, sized.windows_per_input, sized.source) == (1919, 512, 101, "server")
    assert (sized.legal_inputs, sized.legal_windows, sized.input_chars) == (5, 505, 100_000)
    over_grpc = cases.size_windowed("qa", 19, "INVALID_ARGUMENT", REFUSAL, cases.Limits(max_queue=64), 100_000, 9)
    assert (over_grpc.max_queue, over_grpc.legal_inputs) == (512, 5)  # the server's queue, not the config's
    guessed = cases.size_windowed("ner", 19, "422", "too many", cases.Limits(max_queue=100), 100_000, 30)
    assert (guessed.source, guessed.needed, guessed.legal_inputs, guessed.legal_windows) == ("estimate", None, 3, 90)
    # the server's refusal of a QA / NER plan names windows (service.engine.pipelines)
    windows = (
        "the request needs 3610 windows of 256 tokens (doc_stride 128), more than this model's queue holds (512, the "
        "server's max_queue setting); split it"
    )
    planned = cases.size_windowed("qa", 19, "INVALID_ARGUMENT", windows, limits, 100_000, 999)
    assert (planned.needed, planned.max_queue, planned.windows_per_input, planned.legal_inputs) == (3610, 512, 190, 2)
    taken = cases.size_windowed("qa", 19, "200", "", limits, 100_000, 30)
    assert (taken.source, taken.legal_inputs) == ("accepted", 19)
    alone = cases.size_windowed("qa", 2, "422", REFUSAL.replace("1919", "1200"), limits, 100_000, 30)
    assert (alone.legal_inputs, alone.input_chars, alone.legal_windows) == (1, 68_266, 512)  # 600 windows each
    # the estimate errs towards more windows than a server's 4 characters a token and doc_stride 128 give
    assert cases.estimate_windows("qa", 100_000, 384, 60) == 185
    assert cases.estimate_windows("ner", 300, 128) == 1


def test_maximum_and_over_the_limit_requests_fill_each_limit_exactly() -> None:
    limits = cases.Limits(max_inputs=64, max_text_chars=100_000, max_body_bytes=2_000_000)
    texts = cases.Texts(["A fine film \u00e9."], [("Who wrote it?", "Ada wrote it in \u201cLondon\u201d.")])
    count = cases.longest_input_count("qa", texts, limits, limits.max_text_chars)
    over = cases.windowed_request("qa", "over", texts, count, limits.max_text_chars)
    assert 1 < count < 19 and len(over.body) <= limits.max_body_bytes  # \u escapes counted: fewer than 19 fit
    one_more = cases.windowed_request("qa", "over", texts, count + 1, limits.max_text_chars)
    assert len(one_more.body) > limits.max_body_bytes * 0.97
    bodies = {case.name: case.request for case in cases.malformed_rest({}, limits)}
    body = json.loads(bodies["a body over max_body_bytes"].body)  # type: ignore[union-attr]
    assert len(bodies["a body over max_body_bytes"].body) > limits.max_body_bytes  # type: ignore[union-attr]
    assert len(body["inputs"]) <= limits.max_inputs and max(map(len, body["inputs"])) <= limits.max_text_chars
    text = json.loads(bodies["a text over max_text_chars"].body)["inputs"]  # type: ignore[union-attr]
    assert len(text) == limits.max_text_chars + 1


def test_a_head_over_the_servers_limit_must_be_refused() -> None:
    def allowed(limits: cases.Limits) -> frozenset[str]:
        return {case.name: case.allowed for case in cases.malformed_http(limits)}["64 KB header"]

    assert allowed(cases.Limits()) == {"client-error", "connection"}
    assert allowed(cases.Limits(max_header_bytes=100_000)) == {"ok", "client-error", "connection"}


def _row(phase: str, statuses: dict[str, dict[str, int]], **details: object) -> dict:
    return {"phase": phase, "start_s": 0.0, "end_s": 1.0, "rss_start_mb": 100.0, "rss_end_mb": 100.0,
            "rss_peak_mb": 100.0, "statuses": statuses, **details}  # fmt: skip


def test_checks_name_each_broken_bound() -> None:
    config = HostileConfig(flood=3).to_dict()
    rows = [
        _row("distinct", {"/qa doc_stride": {"200": 5, "500": 1}}, rss_end_mb=180.0,
             sweeps={"/qa doc_stride": {"sent": 6, "finished": True, "rss_growth_mb": 80.0}}),
        _row("flood", {"flood /classify": {"200": 1, "429": 1, "reset": 1}}, rss_peak_mb=500.0, recovered_s=1.5),
        _row("slow", {}, slow=[{"kind": "body", "cut_s": None, "how": "not cut", "bytes_sent": 9}], recovered_s=0.1),
        _row("after", {"small /classify": {"200": 1}}, recovered_s=0.01, alive=False),
    ]  # fmt: skip
    small = {"endpoints": {"slow: small /classify": {"requests": 0}}}
    checks = hostile_checks("t", {"config": config, "phases": rows}, small)
    failed = [c["description"] for c in checks if not c["passed"]]
    assert any("RSS growth +80.0 MB <= 50 MB" in d and "/qa doc_stride 80.0 MB" in d for d in failed)
    assert any("only 200 / 4xx / 429" in d and "/qa doc_stride 500 x1" in d for d in failed)
    assert any(d.startswith("flood: 3 connections answered only 200 / 429 / 503") for d in failed)
    assert any("peak RSS growth +400.0 MB <= 300 MB" in d for d in failed)
    assert any("flood: a normal answer 1.50 s after it" in d for d in failed)
    assert any("slow (body): 0 of 1 slow clients cut" in d for d in failed)
    assert any("server process is alive" in d for d in failed)
    assert any("0 5xx other than the intended ones" in d and "distinct: /qa doc_stride 500 x1" in d for d in failed)
    passed = [c["description"] for c in checks if c["passed"]]
    assert any("the profile: a normal answer 0.01 s" in d for d in passed)


def test_pipeline_checks_name_a_connection_left_hanging_and_the_memory_it_grew() -> None:
    config = HostileConfig(pipelined=3).to_dict()
    pipelined = [
        {"sent": 6000, "answers": 17, "end_s": 0.01, "how": "closed"},
        {"sent": 6000, "answers": 6000, "end_s": 2.5, "how": "all answered"},
        {"sent": 6000, "answers": 120, "end_s": None, "how": "not ended"},
    ]
    rows = [_row("pipeline", {}, rss_peak_mb=380.0, pipelined=pipelined, recovered_s=0.02)]
    checks = hostile_checks("t", {"config": config, "phases": rows}, {"endpoints": {}})
    by_passed = {c["description"]: c["passed"] for c in checks}
    assert by_passed == {
        "pipeline: 2 of 3 connections of 6000 pipelined requests ended within 60 s ({'all answered': 1, 'closed': 1, "
        "'not ended': 1}, at most 6000 answers on one)": False,
        "pipeline: peak RSS growth +280.0 MB <= 50 MB": False,
        "pipeline: a normal answer 0.02 s after it (<= 1 s)": True,
    }
    rows[0]["pipelined"] = pipelined[:2]
    rows[0]["rss_peak_mb"] = 101.0
    config["pipelined"] = 2
    checks = hostile_checks("t", {"config": config, "phases": rows}, {"endpoints": {}})
    assert all(c["passed"] for c in checks), checks


def test_a_phase_that_made_the_server_log_more_than_its_bound_fails() -> None:
    config = HostileConfig().to_dict()
    rows = [_row("malformed", {}, cases=[], log_kb=0.3), _row("pipeline", {}, pipelined=[], log_kb=96.5)]
    checks = hostile_checks("t", {"config": config, "phases": rows}, {"endpoints": {}})
    logged = {c["description"]: c["passed"] for c in checks if "logged" in c["description"]}
    assert logged == {
        "malformed: the server logged 0.3 KB <= 64 KB": True,
        "pipeline: the server logged 96.5 KB <= 64 KB": False,
    }


def test_hostile_options_are_checked_before_any_load(tmp_path: Path) -> None:
    for overrides, message in (
        ({"users": 4}, "--users: not for the hostile profile"),
        ({"workers": 2}, "--workers: not for the hostile profile"),
        ({"grpc_host": "127.0.0.1:50051"}, "needs the REST front door"),
        ({"mix": "/qa"}, "include /classify"),
        ({"hostile": "values=x"}, "is not a int"),
    ):
        with pytest.raises(ValueError, match=message):
            plan_run(RunOptions(profile="hostile", results_dir=tmp_path / "r", **overrides))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sizes the hostile profile only"):
        plan_run(RunOptions(profile="smoke", hostile="values=3", results_dir=tmp_path / "r"))
    assert not (tmp_path / "r").exists()


@pytest.fixture
def fake_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The fake server, with the fault flags the test parametrizes it with (none: sound); its URL."""
    port = free_port()
    command = [sys.executable, "-m", "tests.loadtests.hostile_fake_server", "--port", str(port)]
    process = subprocess.Popen([*command, *getattr(request, "param", ())], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == b"ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


@pytest.mark.integration
def test_a_sound_server_passes_every_bound(fake_server: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    command = [sys.executable, "-m", "bertserve", "loadtest", "--profile", "hostile", "--host", fake_server,
               "--hostile", SHORT, "--results-dir", str(results)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = _run_dir(results, done)
    summary = json.loads((run_dir / "summary.json").read_text())
    target = summary["targets"]["external"]
    assert [row["phase"] for row in target["hostile"]["phases"]] == [
        "warmup", "distinct", "max-size", "flood", "pipeline", "slow", "malformed", "after"
    ]  # fmt: skip
    pipelined = target["hostile"]["phases"][4]["pipelined"]
    assert len(pipelined) == 5 and all(r["how"] in ("closed", "reset") and r["answers"] <= 1 for r in pipelined)
    assert target["hostile"]["rss_source"].startswith("process_resident_memory_bytes of")
    assert all(c["passed"] for c in summary["checks"]), summary["checks"]
    skipped = [c["description"] for c in summary["checks"] if c.get("skipped")]
    assert skipped == [
        "after: the server process is alive (not measured: an external server)",
        "the server's log growth per phase (not measured: an external server)",
    ]
    assert len(summary["checks"]) >= 20
    sweeps = target["hostile"]["phases"][1]["sweeps"]
    assert {name: sweep["sent"] for name, sweep in sweeps.items()} == dict.fromkeys(
        [
            "/classify top_k",
            "/classify model",
            "/classify x-request-timeout-ms",
            "/models/<name>",
            "/tokenize inputs",
            "/v2 model name",
            "/models/<name> parameter",
            "/v2 infer id",
        ],
        30,
    )
    assert target["summary"]["endpoints"]["max-size: small /classify"]["ok"] >= 30
    for name in ("report.md", "latency.png", "rss.png", "external_samples.csv", "external_rss.json"):
        assert (run_dir / name).stat().st_size > 0, name
    assert "| slow clients |" in (run_dir / "report.md").read_text()
    history = [json.loads(line) for line in (results / "history.jsonl").read_text().splitlines()]
    assert [r["profile"] for r in history] == ["hostile"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "fake_server", [("--leak-mb-per-top-k", "3", "--error-on-bad-json", "--no-cut")], indirect=True
)
def test_broken_bounds_exit_4(fake_server: str, tmp_path: Path) -> None:
    options = RunOptions(profile="hostile", host=fake_server, hostile=SHORT, results_dir=tmp_path / "results")
    with open(tmp_path / "progress.txt", "w") as out:
        result = execute(plan_run(options), options, out)
    assert result.exit_code == 4
    failed = [c["description"] for c in result.summary["checks"] if not c["passed"]]
    assert len(failed) == 6, failed
    assert failed[0].startswith("distinct: RSS growth +") and "most: /classify top_k" in failed[0]  # 30 x 3 MB
    assert [d.split(":")[0] for d in failed[1:4]] == ["slow (headers)", "slow (body)", "slow (idle)"]
    assert all("0 of 3 slow clients cut within 2 s" in d and "ends: not cut" in d for d in failed[1:4])
    assert failed[4].startswith("malformed:") and "body not JSON -> 500" in failed[4]
    assert failed[5].startswith("0 5xx other than the intended ones") and "malformed: body not JSON 500" in failed[5]
    passed = [c["description"] for c in result.summary["checks"] if c["passed"]]
    assert any(d.startswith("flood: 50 connections answered only 200 / 429 / 503") for d in passed)


QA_FAKE = ("--qa-chars-per-window", "20000", "--max-queue", "40")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("fake_server", "over_status"),
    [(QA_FAKE, "422"), ((*QA_FAKE, "--over-queue-status", "500"), "500")],
    indirect=["fake_server"],
)
def test_qa_requests_are_sized_by_the_servers_queue(fake_server: str, over_status: str, tmp_path: Path) -> None:
    short = SHORT + ",phases=warmup+max-size"
    options = RunOptions(profile="hostile", host=fake_server, hostile=short, results_dir=tmp_path / "results")
    with open(tmp_path / "progress.txt", "w") as out:
        result = execute(plan_run(options), options, out)
    row = result.summary["targets"]["external"]["hostile"]["phases"][1]
    # 19 contexts of 100,000 characters fill the body: 5 windows each, 95 > 40; the largest legal: 8 = 40 windows
    qa = row["windowed"]["qa"]
    assert (qa["over_inputs"], qa["needed"], qa["max_queue"], qa["source"]) == (19, 95, 40, "server")
    assert (qa["legal_inputs"], qa["legal_windows"]) == (8, 40)
    assert row["statuses"]["over /qa 19 longest contexts"] == {over_status: 1}
    assert set(row["statuses"]["max /qa 8 longest contexts"]) == {"200"}
    checks = {c["description"]: c["passed"] for c in result.summary["checks"]}
    refused = [d for d in checks if d.startswith("max-size: requests over a bound answered 4xx")]
    assert refused == [f"max-size: requests over a bound answered 4xx (not 429): over /qa 19 longest contexts "
                       f"(95 windows > 40): {over_status}"]  # fmt: skip
    failed = [d for d, passed in checks.items() if not passed]
    if over_status == "422":
        assert result.exit_code == 0 and not failed, result.summary["checks"]
    else:
        assert result.exit_code == 4
        assert failed == [
            refused[0], "0 5xx other than the intended ones (found: max-size: over /qa 19 longest contexts 500 x1)"
        ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.integration
def test_the_tiny_server_through_both_front_doors(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    _, bundle = tiny
    results = tmp_path / "results"
    # the fakes show the slow-client bounds; smaller "maximum" bodies keep the run short on the tiny model
    short = SHORT + ",values=10,flood=40,max_body_bytes=300000,phases=warmup+distinct+max-size+flood+pipeline+malformed"
    command = [sys.executable, "-m", "bertserve", "loadtest", "--profile", "hostile", "--mix", "/classify",
               "--models", f"classify={bundle}", "--hostile", short, "--results-dir", str(results)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode in (0, 4), done.stdout + done.stderr  # 4: a bound the code of the day breaks
    summary = json.loads((_run_dir(results, done) / "summary.json").read_text())
    hostile = summary["targets"]["ours-batching"]["hostile"]
    assert hostile["rss_source"].startswith("/proc/") and hostile["rss_start_mb"] > 50
    rows = {row["phase"]: row for row in hostile["phases"]}
    assert set(rows["distinct"]["sweeps"]) == {
        "/classify top_k",
        "/classify model",
        "/classify x-request-timeout-ms",
        "Classify top_k",
        "Classify model",
        "Classify deadline+metadata",
        "/models/<name>",
        "/models/<name> parameter",
        "/tokenize inputs",
        "/v2 model name",
        "/v2 infer id",
    }
    assert rows["distinct"]["statuses"]["Classify model"] == {"INVALID_ARGUMENT": 10} or rows["distinct"]["statuses"]
    grpc_cases = [case for case in rows["malformed"]["cases"] if "Request" in case["case"] or "method" in case["case"]]
    assert grpc_cases and all(case["status"].isupper() for case in grpc_cases)
    assert sum(rows["flood"]["statuses"]["flood /classify"].values()) == 40
    pipelined = rows["pipeline"]["pipelined"]  # the one at work and MAX_PIPELINED queued answered, then a FIN
    assert [(r["how"], r["answers"]) for r in pipelined] == [("closed", 17)] * 5
    # the runner started the server: its log is read in every phase
    assert all(row["log_kb"] is not None for name, row in rows.items() if name != "after")
    checks = {c["description"]: c["passed"] for c in summary["checks"]}
    assert checks["after: the server process is alive (no crash)"], summary["checks"]
