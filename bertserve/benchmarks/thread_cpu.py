"""Where a server process spends its CPU: per-thread CPU time from `/proc/<pid>/task/<tid>/stat`, grouped into parts.

A snapshot reads each thread's user + system time (clock ticks) and its kernel name (`comm`); the difference of two
snapshots, divided by the answers given in between, is the CPU per answer of each part:
- `event_loop`: the main thread (tid = pid), which runs asyncio, uvicorn, FastAPI and the gRPC servicers;
- `tokenization`: threads named `service.operations.threads.TOKENIZE` (tokenization and post-processing off the event
  loop: the bounded pool of large requests, the small-request thread);
- `runtime`: threads named `service.operations.threads.INFER` (backend calls) and the runtime pools they start, which
  inherit that name (ONNX Runtime's intra-op threads, OpenVINO's streams);
- `other`: every other thread (gRPC's core threads, the tracer, anything a library starts).
Threads that ended between the snapshots are not counted (the server's pools live as long as it does). Linux only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from service.operations.threads import INFER, TOKENIZE

PARTS = ("event_loop", "tokenization", "runtime", "other")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class ThreadTime:
    name: str
    cpu_s: float


def snapshot(pid: int) -> dict[int, ThreadTime]:
    """tid -> (kernel name, CPU seconds so far) for every live thread of `pid`."""
    threads: dict[int, ThreadTime] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended while being read
            continue
        # fields after the parenthesised name: state is field 3, utime 14 and stime 15 (1-based)
        fields = stat[stat.rindex(")") + 2 :].split()
        threads[int(task.name)] = ThreadTime(name, (int(fields[11]) + int(fields[12])) * TICK_S)
    return threads


def part_of(pid: int, tid: int, name: str) -> str:
    if tid == pid:
        return "event_loop"
    if name.startswith(TOKENIZE):
        return "tokenization"
    if name.startswith(INFER):
        return "runtime"
    return "other"


def cpu_by_part(pid: int, before: Mapping[int, ThreadTime], after: Mapping[int, ThreadTime]) -> dict[str, float]:
    """CPU seconds per part between two snapshots of `pid` (threads present in `after`; new ones from zero)."""
    parts = dict.fromkeys(PARTS, 0.0)
    for tid, now in after.items():
        start = before.get(tid)
        spent = now.cpu_s - (start.cpu_s if start is not None else 0.0)
        parts[part_of(pid, tid, now.name)] += max(spent, 0.0)
    return parts


def per_answer_ms(parts: Mapping[str, float], answers: int) -> dict[str, float]:
    """Each part's CPU per answer in milliseconds, plus `total` and `outside_runtime_share` (0..1)."""
    total = sum(parts.values())
    result = {part: 1000 * seconds / answers if answers else float("nan") for part, seconds in parts.items()}
    result["total"] = 1000 * total / answers if answers else float("nan")
    result["outside_runtime_share"] = (total - parts["runtime"]) / total if total else float("nan")
    return result
