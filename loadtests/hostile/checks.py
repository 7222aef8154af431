"""The bounds of the hostile profile, judged from what a run recorded (its `hostile` entry and the small requests'
figures in summary.json): one check per bound, `passed` or not, `skipped` when the run could not measure it
(no RSS source, a phase not run). The bounds are `HostileConfig`'s; why each: `loadtests.hostile.profile`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from loadtests.hostile.net import FIVE_XX_CLASSES, status_class

SMALL = "small /classify"
JUNK = "junk head"
"""The malformed phase's connections that each send a malformed request head."""
OK_ONLY = frozenset({"ok"})
DEFAULT_ALLOWED = frozenset({"ok", "client-error", "rejected"})
UNDER_LOAD = frozenset({"ok", "rejected", "unavailable"})
BIG_ALLOWED = frozenset({"ok", "rejected", "unavailable", "timeout"})
OVER = "over "
"""The names of the max-size phase's requests over a bound (a 4xx other than 429 expected): `over /qa 19 ...`."""


def is_over(name: str) -> bool:
    return name.startswith(OVER)


def allowed_classes(phase: str, name: str, malformed: dict[str, frozenset[str]]) -> frozenset[str]:
    """The status classes a sound server may answer a call with: 503 is intended under the flood and beside big
    requests, 504 for big requests and a deadline that passed; everything else 200, 4xx or 429."""
    if phase == "warmup":
        return OK_ONLY
    if phase == "malformed":
        return malformed.get(name, DEFAULT_ALLOWED)
    if phase == "max-size" and is_over(name):
        return DEFAULT_ALLOWED
    if phase == "max-size" and name != SMALL:
        return BIG_ALLOWED
    if phase in ("flood", "max-size", "slow") or phase.endswith("recovery") or phase == "after":
        return UNDER_LOAD
    return DEFAULT_ALLOWED


def _count(statuses: dict[str, int], keep: Callable[[str], bool]) -> dict[str, int]:
    return {status: n for status, n in statuses.items() if keep(status)}


class Checks:
    """Collects the checks of one target."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.items: list[dict[str, Any]] = []

    def add(self, description: str, passed: bool, skipped: bool = False) -> None:
        item = {"target": self.target, "description": description, "passed": bool(passed or skipped)}
        if skipped:
            item["skipped"] = True
        self.items.append(item)


def _growth(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 1)


def _outside(row: dict[str, Any], allowed: frozenset[str], names: Callable[[str], bool]) -> dict[str, int]:
    found: dict[str, int] = {}
    for name, statuses in row["statuses"].items():
        if names(name):
            for status, n in _count(statuses, lambda s: status_class(s) not in allowed).items():
                found[f"{name} {status}"] = found.get(f"{name} {status}", 0) + n
    return found


def _small_checks(checks: Checks, phase: str, small: dict[str, Any], config: dict[str, Any], why: str) -> None:
    figures = small["endpoints"].get(f"{phase}: {SMALL}")
    if not figures or not figures["requests"]:
        checks.add(f"{phase}: small /classify requests sent {why}", False)
        return
    p99 = figures["latency_ms"]["p99"]
    bound = config["small_p99_ms"]
    checks.add(f"{phase}: small /classify p99 {p99} ms <= {bound:g} ms {why}", p99 is not None and p99 <= bound)
    share = figures["ok"] / figures["requests"]
    checks.add(
        f"{phase}: small /classify answered 200: {figures['ok']} of {figures['requests']} ({share:.1%} >= "
        f"{config['small_ok_share']:.0%})",
        share >= config["small_ok_share"],
    )


def _recovery_check(checks: Checks, phase: str, row: dict[str, Any], config: dict[str, Any]) -> None:
    seconds = row.get("recovered_s")
    within = config["recovery_s"]
    text = "no normal answer" if seconds is None else f"a normal answer {seconds:.2f} s"
    checks.add(f"{phase}: {text} after it (<= {within:g} s)", seconds is not None and seconds <= within)


def _peak_growth_check(checks: Checks, phase: str, row: dict[str, Any], bound: float) -> None:
    growth = _growth(row["rss_start_mb"], row["rss_peak_mb"])
    if growth is None:
        checks.add(f"{phase}: RSS growth not measured (no RSS source)", True, skipped=True)
    else:
        checks.add(f"{phase}: peak RSS growth {growth:+.1f} MB <= {bound:g} MB", growth <= bound)


def _log_checks(checks: Checks, rows: list[dict[str, Any]], config: dict[str, Any]) -> None:
    """What the server logged in each phase, against `max_log_kb` (where its log was read)."""
    bound = config.get("max_log_kb", 64.0)
    for row in rows:
        logged = row.get("log_kb")
        if logged is not None:
            checks.add(f"{row['phase']}: the server logged {logged:g} KB <= {bound:g} KB", logged <= bound)


def _distinct(checks: Checks, row: dict[str, Any], config: dict[str, Any]) -> None:
    sweeps = row.get("sweeps", {})
    growth = _growth(row["rss_start_mb"], row["rss_end_mb"])
    bound = config["max_distinct_growth_mb"]
    what = f"{config['values']} distinct values of each of {len(sweeps)} options"
    if growth is None:
        checks.add(f"distinct: RSS growth over {what}: not measured (no RSS source)", True, skipped=True)
    else:
        worst = max(sweeps.items(), key=lambda item: item[1].get("rss_growth_mb") or 0, default=None)
        most = f"; most: {worst[0]} {worst[1].get('rss_growth_mb')} MB" if worst else ""
        checks.add(f"distinct: RSS growth {growth:+.1f} MB <= {bound:g} MB over {what}{most}", growth <= bound)
    unfinished = [name for name, sweep in sweeps.items() if not sweep.get("finished")]
    checks.add(
        f"distinct: every sweep finished within {config['distinct_limit_s']:g} s"
        + (f" (not: {', '.join(unfinished)})" if unfinished else ""),
        not unfinished,
    )
    wrong = _outside(row, DEFAULT_ALLOWED, lambda name: True)
    checks.add(f"distinct: only 200 / 4xx / 429 answers{_found(wrong)}", not wrong)


def _found(counts: dict[str, int], most: int = 8) -> str:
    if not counts:
        return ""
    items = sorted(counts.items(), key=lambda item: -item[1])
    return (
        " (found: " + ", ".join(f"{key} x{n}" for key, n in items[:most]) + (", ..." if len(items) > most else "") + ")"
    )


def _max_size(checks: Checks, row: dict[str, Any], small: dict[str, Any], config: dict[str, Any]) -> None:
    _small_checks(checks, "max-size", small, config, "while maximum-size requests run")
    wrong = _outside(row, BIG_ALLOWED, lambda name: name != SMALL and not is_over(name))
    checks.add(f"max-size: maximum-size requests answered 200 / 429 / 503 / 504 only{_found(wrong)}", not wrong)
    over = row.get("over", [])
    if over:
        answers = ", ".join(f"{item['name']} ({item['bound']}): {item['status']}" for item in over)
        refused = all(item["class"] == "client-error" for item in over)
        checks.add(f"max-size: requests over a bound answered 4xx (not 429): {answers}", refused)
    for task, sized in row.get("windowed", {}).items():
        if sized["source"] == "accepted":
            checks.add(
                f"max-size: {sized['over_inputs']} longest {task} inputs were taken ({sized['over_status']}): "
                "the queue holds them, no request over it was sent",
                True,
                skipped=True,
            )


def _flood(checks: Checks, row: dict[str, Any], config: dict[str, Any]) -> None:
    statuses = row["statuses"].get("flood /classify", {})
    total = sum(statuses.values())
    wrong = _count(statuses, lambda s: status_class(s) not in UNDER_LOAD)
    checks.add(
        f"flood: {total} connections answered only 200 / 429 / 503 ({statuses})",
        not wrong and total == config["flood"],
    )
    _peak_growth_check(checks, "flood", row, config["max_flood_growth_mb"])
    _recovery_check(checks, "flood", row, config)


def _pipeline(checks: Checks, row: dict[str, Any], config: dict[str, Any]) -> None:
    results = row.get("pipelined", [])
    limit = config["client_timeout_s"]
    ended = [r for r in results if r["end_s"] is not None]
    hows = dict(sorted(Counter(r["how"] for r in results).items()))
    answers = [r["answers"] for r in results]
    most = f", at most {max(answers)} answers on one" if answers else ""
    checks.add(
        f"pipeline: {len(ended)} of {len(results)} connections of {config['pipeline_requests']} pipelined requests "
        f"ended within {limit:g} s ({hows}{most})",
        len(ended) == len(results) == config["pipelined"],
    )
    _peak_growth_check(checks, "pipeline", row, config["max_pipeline_growth_mb"])
    _recovery_check(checks, "pipeline", row, config)


def _slow(checks: Checks, row: dict[str, Any], small: dict[str, Any], config: dict[str, Any]) -> None:
    results = row.get("slow", [])
    kinds: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        kinds.setdefault(result["kind"], []).append(result)
    for kind, items in kinds.items():
        timeout = config["body_timeout_s" if kind == "body" else "header_timeout_s"]
        limit = timeout + config["slow_slack_s"]
        cut = [r for r in items if r["cut_s"] is not None and r["cut_s"] <= limit]
        times = [r["cut_s"] for r in items if r["cut_s"] is not None]
        longest = f", the longest after {max(times):.1f} s" if times else ""
        hows = sorted({r["how"] for r in items})
        checks.add(
            f"slow ({kind}): {len(cut)} of {len(items)} slow clients cut within {limit:g} s (configured "
            f"{timeout:g} s + {config['slow_slack_s']:g} s){longest}; ends: {', '.join(hows)}",
            len(cut) == len(items),
        )
    _small_checks(checks, "slow", small, config, "beside the slow clients (they cost no worker)")
    _recovery_check(checks, "slow", row, config)


def _malformed(checks: Checks, row: dict[str, Any], config: dict[str, Any]) -> None:
    cases = row.get("cases", [])
    failed = [f"{case['case']} -> {case['status']}" for case in cases if not case["passed"]]
    shown = "; ".join(failed[:10]) + ("; ..." if len(failed) > 10 else "")
    checks.add(
        f"malformed: {len(cases) - len(failed)} of {len(cases)} answered as expected (4xx, no 5xx, hang or reset)"
        + (f"; not: {shown}" if failed else ""),
        not failed,
    )
    junk = row["statuses"].get(JUNK, {})
    expected = config.get("junk_heads", 0)
    if expected:
        answered = _count(junk, lambda status: status_class(status) == "client-error")
        total = sum(answered.values())
        checks.add(
            f"malformed: {total} of {expected} connections with a malformed head answered 4xx ({junk})",
            total == sum(junk.values()) == expected,
        )


def _after(checks: Checks, rows: list[dict[str, Any]], config: dict[str, Any]) -> None:
    after = rows[-1]
    alive = after.get("alive")
    if alive is None:
        checks.add("after: the server process is alive (not measured: an external server)", True, skipped=True)
        checks.add("the server's log growth per phase (not measured: an external server)", True, skipped=True)
    else:
        checks.add("after: the server process is alive (no crash)", bool(alive))
    _recovery_check(checks, "the profile", after, config)
    malformed = {
        case["case"]: frozenset(case["allowed"]) for row in rows if row["phase"] == "malformed" for case in row["cases"]
    }
    unintended: dict[str, int] = {}
    for row in rows:
        for name, statuses in row["statuses"].items():
            allowed = allowed_classes(row["phase"], name, malformed)
            for status, n in statuses.items():
                kind = status_class(status)
                if kind in FIVE_XX_CLASSES and kind not in allowed:
                    key = f"{row['phase']}: {name} {status}"
                    unintended[key] = unintended.get(key, 0) + n
    checks.add(f"0 5xx other than the intended ones{_found(unintended)}", not unintended)


def hostile_checks(target: str, hostile: dict[str, Any], small: dict[str, Any]) -> list[dict[str, Any]]:
    """Every bound of the run, in phase order."""
    checks = Checks(target)
    config = hostile["config"]
    rows = hostile["phases"]
    for row in rows:
        phase = row["phase"]
        if phase == "warmup":
            wrong = _outside(row, OK_ONLY, lambda name: True)
            checks.add(f"warm-up: every request answered 200{_found(wrong)}", not wrong)
        elif phase == "distinct":
            _distinct(checks, row, config)
        elif phase == "max-size":
            _max_size(checks, row, small, config)
        elif phase == "flood":
            _flood(checks, row, config)
        elif phase == "pipeline":
            _pipeline(checks, row, config)
        elif phase == "slow":
            _slow(checks, row, small, config)
        elif phase == "malformed":
            _malformed(checks, row, config)
    _log_checks(checks, rows, config)
    if rows and rows[-1]["phase"] == "after":
        _after(checks, rows, config)
    return checks.items
