"""The Markdown report of a run, and the peer table (RPS, p50, p99, error rate, ratios to the naive server);
for the hostile profile, its phases (RSS, status codes, what each phase found)."""

from __future__ import annotations

from typing import Any

from loadtests.summary import ALL

PEER_LABELS = ("naive", "triton")
"""The targets every row is compared with, when a run has them."""


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def peer_rows(targets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target over all its endpoints, with ratios to the `naive` and `triton` peers when present."""
    peers = {label: targets[label]["summary"]["endpoints"][ALL] for label in PEER_LABELS if label in targets}
    rows = []
    for label, target in targets.items():
        figures = target["summary"]["endpoints"][ALL]
        latency = figures["latency_ms"]
        row = {
            "target": label,
            "endpoints": ", ".join(n for n in target["summary"]["endpoints"] if n != ALL),
            "ok_rps": figures["ok_rps"],
            "p50_ms": latency["p50"],
            "p99_ms": latency["p99"],
            "error_rate": figures["error_rate"],
        }
        for peer in PEER_LABELS:
            reference = peers.get(peer)
            row[f"rps_vs_{peer}"] = row[f"p99_vs_{peer}"] = None
            if reference is not None and reference["ok_rps"]:
                row[f"rps_vs_{peer}"] = round(figures["ok_rps"] / reference["ok_rps"], 3)
            if reference is not None and reference["latency_ms"]["p99"] and latency["p99"] is not None:
                row[f"p99_vs_{peer}"] = round(latency["p99"] / reference["latency_ms"]["p99"], 3)
        rows.append(row)
    return rows


def peer_table(rows: list[dict[str, Any]]) -> str:
    peers = [peer for peer in PEER_LABELS if any(row.get(f"rps_vs_{peer}") is not None for row in rows)] or ["naive"]
    ratio_heads = "".join(f" throughput vs {peer} | p99 vs {peer} |" for peer in peers)
    lines = [
        "| target | endpoint | throughput (ok/s) | p50 ms | p99 ms | error rate |" + ratio_heads,
        "|---|---|---:|---:|---:|---:|" + "---:|---:|" * len(peers),
    ]
    for row in rows:
        ratios = "".join(
            f" {_ratio(row.get(f'rps_vs_{peer}'))} | {_ratio(row.get(f'p99_vs_{peer}'))} |" for peer in peers
        )
        lines.append(
            f"| {row['target']} | {row['endpoints']} | {row['ok_rps']:.1f} | {_ms(row['p50_ms'])} | "
            f"{_ms(row['p99_ms'])} | {row['error_rate']:.2%} |" + ratios
        )
    return "\n".join(lines)


def endpoint_table(summary: dict[str, Any]) -> str:
    lines = [
        "| endpoint | requests | failures | 429 | timeouts | ok/s | p50 | p90 | p95 | p99 | max | "
        "server queue p50 / p99 | server inference p50 / p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in summary["endpoints"].items():
        lat, queue, infer = f["latency_ms"], f["server_queue_ms"], f["server_inference_ms"]
        lines.append(
            f"| {name} | {f['requests']} | {f['failures']} | {f['rejected']} | {f['timeouts']} | {f['ok_rps']:.1f} | "
            f"{_ms(lat['p50'])} | {_ms(lat['p90'])} | {_ms(lat['p95'])} | {_ms(lat['p99'])} | {_ms(lat['max'])} | "
            f"{_ms(queue['p50'])} / {_ms(queue['p99'])} | {_ms(infer['p50'])} / {_ms(infer['p99'])} |"
        )
    return "\n".join(lines)


def _header(summary: dict[str, Any]) -> list[str]:
    profile = summary["profile"]
    stages = ", ".join(f"{s['users']} users until {s['end_s']:.0f}s" for s in profile["stages"])
    shape = f"{stages}; warm-up {profile['warmup_s']:.0f}s left out of the figures"
    if profile.get("driver") == "hostile":
        phases = [row["phase"] for target in summary["targets"].values() for row in target["hostile"]["phases"]]
        shape = "phases " + " → ".join(phases)
    sources = ", ".join(f"{task}: {source}" for task, source in summary["payload_sources"].items())
    machine = summary["machine"]
    return [
        f"# Load test {summary['run_id']}",
        "",
        f"- profile **{profile['name']}**: {profile['description']} ({shape})",
        f"- mix: `{summary['mix']}`; payloads: {sources}",
        f"- machine: {machine['cpus']} CPUs, {machine['platform']}; git {summary.get('git') or 'unknown'}",
        "- latencies are client-side, in ms, over accepted requests; throughput counts accepted answers per second",
        "",
    ]


def stage_table(stages: list[dict[str, Any]]) -> str:
    lines = ["| users | seconds | ok/s | p50 ms | p99 ms | 429 | failed |", "|---:|---|---:|---:|---:|---:|---:|"]
    for row in stages:
        lines.append(
            f"| {row['users']} | {row['start_s']:.0f}–{row['end_s']:.0f} | {row['ok_rps']:.1f} | {_ms(row['p50'])} | "
            f"{_ms(row['p99'])} | {row['rejected']} | {row['failed']} |"
        )
    return "\n".join(lines)


def _target_section(label: str, target: dict[str, Any]) -> list[str]:
    lines = [f"## {label}", ""]
    if target.get("command"):
        lines += [
            f"Started with `{' '.join(target['command'][1:])}`"
            + (f" (ready in {target['ready_s']:.1f}s)." if target.get("ready_s") is not None else "."),
            "",
        ]
    else:
        lines += [f"External service at {target.get('http_url') or ''} {target.get('grpc_target') or ''}.", ""]
    cpu = [f"{name} {target[key]:.1f}" for name, key in (("server", "server_cpu_s"), ("locust", "loadgen_cpu_s"))
           if target.get(key) is not None]  # fmt: skip
    processes = (target.get("loadgen") or {}).get("processes", [])
    if len(processes) > 1:
        cpu[-1] += " (" + ", ".join(f"{p['role']} {p['cpu_s']:.1f}" for p in processes) + ")"
    per_answer = target.get("server_cpu_ms_per_ok")
    if cpu:
        each = f"; the server's CPU per accepted answer {per_answer:.2f} ms" if per_answer is not None else ""
        lines += [f"CPU seconds used while the load ran: {', '.join(cpu)}{each}.", ""]
    lines += [endpoint_table(target["summary"]), ""]
    if target["summary"].get("stages"):
        lines += ["Per stage (the first 2 s of each stage, while users arrive, left out):", ""]
        lines += [stage_table(target["summary"]["stages"]), ""]
    if target.get("hostile"):
        lines += hostile_lines(target["hostile"])
    return lines


def _statuses(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} x{n}" for status, n in counts.items()) or "–"


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def hostile_lines(hostile: dict[str, Any]) -> list[str]:
    """The hostile profile's phases: RSS, status codes per kind of request, and what each phase found."""
    lines = [
        f"Server RSS from {hostile['rss_source']}: {_mb(hostile['rss_start_mb'])} MB at the start, "
        f"{_mb(hostile['rss_end_mb'])} MB at the end, peak {_mb(hostile['rss_peak_mb'])} MB (rss.png).",
        "",
    ]
    if hostile.get("limits"):
        lines += [_limits_line(hostile["limits"]), ""]
    lines += [
        "| phase | seconds | RSS MB start → end (peak) | log KB | requests: status × count |",
        "|---|---:|---|---:|---|",
    ]
    for row in hostile["phases"]:
        statuses = "; ".join(f"{name}: {_statuses(counts)}" for name, counts in row["statuses"].items())
        logged = row.get("log_kb")
        lines.append(
            f"| {row['phase']} | {row['end_s'] - row['start_s']:.1f} | {_mb(row['rss_start_mb'])} → "
            f"{_mb(row['rss_end_mb'])} ({_mb(row['rss_peak_mb'])}) | {'–' if logged is None else f'{logged:g}'} | "
            f"{statuses or '–'} |"
        )
    lines.append("")
    for row in hostile["phases"]:
        lines += _hostile_phase_details(row)
    return lines


def _limits_line(limits: dict[str, Any]) -> str:
    source = limits.get("source", {})
    names = ("max_inputs", "max_text_chars", "max_body_bytes", "max_queue")
    stated = ", ".join(f"{name} {limits[name]:,} ({source.get(name, 'config')})" for name in names if name in limits)
    return f"Server limits the requests are sized by: {stated} (openapi: its schema; config: --hostile)."


def _windowed_lines(row: dict[str, Any]) -> list[str]:
    lines = []
    for task, sized in row.get("windowed", {}).items():
        what = "contexts" if task == "qa" else "texts"
        if sized["source"] == "accepted":
            said = f"taken ({sized['over_status']}): the queue holds them; that request is the largest sent"
        elif sized["source"] == "server":
            said = (
                f"need {sized['needed']:,} windows by the server's count, over its queue of {sized['max_queue']:,}: "
                f"{sized['over_status']}"
            )
        else:
            said = f"{sized['over_status']}, without a count of windows (estimated {sized['windows_per_input']} each)"
        lines.append(
            f"- /{task}: {sized['over_inputs']} longest {what} ({sized['over_chars']:,} characters each) {said}; "
            f"the largest legal request: {_legal(sized)}."
        )
    return ["Largest legal QA / NER requests (one model row per window; one request may need at most its "
            "model's queue):", "", *lines, ""] if lines else []  # fmt: skip


def _legal(sized: dict[str, Any]) -> str:
    if sized["input_chars"] == sized["over_chars"]:
        return f"{sized['legal_inputs']} of them = {sized['legal_windows']:,} windows"
    return f"one of {sized['input_chars']:,} characters (at most {sized['legal_windows']:,} windows)"


def _slow_lines(results: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    kinds: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        kinds.setdefault(result["kind"], []).append(result)
    lines += ["| slow clients | count | cut after (s) min / max | ends |", "|---|---:|---|---|"]
    for kind, items in kinds.items():
        times = [r["cut_s"] for r in items if r["cut_s"] is not None]
        span = f"{min(times):.1f} / {max(times):.1f}" if times else "never"
        ends: dict[str, int] = {}
        for item in items:
            ends[item["how"]] = ends.get(item["how"], 0) + 1
        lines.append(f"| {kind} | {len(items)} | {span} | {_statuses(ends)} |")
    lines.append("")
    return lines


def _hostile_phase_details(row: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if row.get("sweeps"):
        lines += ["Distinct values, per option (RSS before → after its sweep):", "",
                  "| option | values sent | RSS growth MB |", "|---|---:|---:|"]  # fmt: skip
        for name, sweep in row["sweeps"].items():
            growth = sweep.get("rss_growth_mb")
            lines.append(f"| {name} | {sweep['sent']} | {'–' if growth is None else f'{growth:+.1f}'} |")
        lines.append("")
    lines += _windowed_lines(row)
    if row.get("over"):
        over = "; ".join(f"{item['name']} ({item['bound']}): {item['status']}" for item in row["over"])
        lines += [f"Requests over a bound: {over}.", ""]
    if row.get("requests"):
        sizes = ", ".join(f"{name} ({size / 1e6:.2f} MB)" for name, size in row["requests"].items())
        lines += [f"Maximum-size requests: {sizes}.", ""]
    if row.get("slow"):
        lines += _slow_lines(row["slow"])
    if row.get("cases"):
        lines += ["| malformed request | answer | class | expected |", "|---|---|---|---|"]
        for case in row["cases"]:
            mark = "" if case["passed"] else " **(not expected)**"
            lines.append(
                f"| {case['case']} | {case['status']}{mark} | {case['class']} | {', '.join(case['allowed'])} |"
            )
        lines.append("")
    if "recovered_s" in row:
        seconds = row["recovered_s"]
        answer = "no normal answer within the limit" if seconds is None else f"a normal answer after {seconds:.2f} s"
        when = "At the end" if row["phase"] == "after" else f"After {row['phase']}"
        lines += [f"{when}: {answer}.", ""]
    return lines


def _verdict(check: dict[str, Any]) -> str:
    return "SKIP" if check.get("skipped") else "PASS" if check["passed"] else "FAIL"


def render_report(summary: dict[str, Any]) -> str:
    """The whole report.md."""
    lines = _header(summary)
    if len(summary["targets"]) > 1:
        lines += ["## Side by side", "", peer_table(summary["comparison"]), ""]
        lines += [
            "Ratios: throughput divided by the naive server's (higher is better); p99 divided by the naive "
            "server's (lower is better).",
            "",
        ]
    for label, target in summary["targets"].items():
        lines += _target_section(label, target)
    lines += ["## Checks", ""]
    lines += [f"- {_verdict(c)} {c['target']}: {c['description']}" for c in summary["checks"]]
    lines += ["" if summary["checks"] else "- none for this profile", ""]
    lines += ["## Compared with", ""]
    for label, regression in summary["regression"].items():
        reference = regression.get("reference")
        if reference is None:
            lines.append(f"- {label}: no earlier run of this profile, target and mix in the history")
            continue
        lines.append(f"- {label}: run {reference} (baseline {regression.get('baseline') or 'previous run'})")
        lines += [f"  - {change}" for change in regression["lines"]]
    lines += ["", "![latency and throughput over time](latency.png)", ""]
    return "\n".join(lines)
