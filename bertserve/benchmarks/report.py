"""The one writer of benchmark results: a JSON file and a Markdown page per run, both saying when, where and how.

Every benchmark of this package hands its figures (a JSON-ready dict) and its tables (Markdown) to `write_report`,
which puts the same provenance in front of both: the UTC time of the run, the machine (`bundles.hardware`: CPU
model, code name, cores, clock, int8 / bf16 features; a GPU where one was measured) and the command line that
measured it. The docs' measurement blocks are these Markdown pages (`docgen.pages`), so each figure on the
site carries its date, machine and command. Torch-free.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bundles.hardware import CpuInfo, read_cpu_info


@dataclass(frozen=True)
class Provenance:
    """When, on what and by which command a benchmark's figures were measured."""

    created: str
    """UTC time of the run, ISO 8601 (`2026-12-02T14:03:11Z`)."""
    command: str
    """The command line that measured, as a shell would take it."""
    machine: str
    """The machine in one line: the CPU (`CpuInfo.summary`), and a GPU where the run measured one."""
    cpu: dict[str, Any] = field(default_factory=dict)
    """`CpuInfo.describe()`: vendor, family / model, code name, features, matrix family."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def markdown(self) -> str:
        """One paragraph: `Measured 2026-12-02 14:03 UTC on <machine> by `<command>`.`"""
        when = self.created[:16].replace("T", " ")
        return f"Measured {when} UTC on {self.machine} by `{self.command}`."


def command_line(program: str, argv: Sequence[str] | None = None) -> str:
    """`program` followed by `argv` (default: this process's arguments), quoted for a shell."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([program, shlex.join(args)]) if args else program


def provenance(command: str, cpu: CpuInfo | None = None, gpu: str | None = None) -> Provenance:
    """The provenance of a run measured now by `command` on this machine (or on `cpu`; `gpu` named when given)."""
    info = cpu or read_cpu_info()
    machine = info.summary() + (f"; GPU: {gpu}" if gpu else "")
    return Provenance(
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command=command,
        machine=machine,
        cpu=info.describe(),
    )


def render(origin: Provenance, tables: str) -> str:
    """The Markdown page of a run: its provenance, then the benchmark's own tables."""
    return f"{origin.markdown()}\n\n{tables.strip()}\n"


def report_json(origin: Provenance, figures: dict[str, Any]) -> str:
    """The JSON of a run: the figures, with its provenance under `provenance`."""
    return json.dumps({"provenance": origin.to_dict(), **figures}, indent=2) + "\n"


def write_report(
    out_dir: Path, stem: str, origin: Provenance, figures: dict[str, Any], tables: str
) -> tuple[Path, Path]:
    """Write `<out_dir>/<stem>.json` and `<stem>.md`; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(report_json(origin, figures))
    md_path.write_text(render(origin, tables))
    return json_path, md_path
