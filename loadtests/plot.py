"""The PNG of a run: accepted-request latency percentiles (top, log scale) and throughput (bottom) over time,
one colour per target, one point per second of completion time; and of the hostile profile, the server's RSS
over its phases. Rendered with matplotlib's Agg backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from loadtests.samples import Sample
from loadtests.summary import timeseries


def plot_run(
    path: Path,
    samples_by_target: Mapping[str, Sequence[Sample]],
    title: str,
    warmup_s: float,
    stages: Sequence[tuple[float, int]] = (),
) -> Path:
    """Write the PNG; `stages` ((end second, users) pairs) of a multi-stage profile are marked on both axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, constrained_layout=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, samples) in enumerate(samples_by_target.items()):
        colour = colours[index % len(colours)]
        series = timeseries(samples)
        top.plot(series["t"], series["p99"], color=colour, label=f"{label} p99")
        top.plot(series["t"], series["p95"], color=colour, linestyle="--", alpha=0.7, label=f"{label} p95")
        top.plot(series["t"], series["p50"], color=colour, linestyle=":", label=f"{label} p50")
        bottom.plot(series["t"], series["ok_rps"], color=colour, label=f"{label} ok/s")
        if any(series["rejected_rps"]):
            bottom.plot(series["t"], series["rejected_rps"], color=colour, linestyle=":", label=f"{label} 429/s")
        if any(series["failed_rps"]):
            bottom.plot(series["t"], series["failed_rps"], color=colour, linestyle="-.", label=f"{label} failed/s")
    for axis in (top, bottom):
        if warmup_s > 0:
            axis.axvspan(0, warmup_s, color="grey", alpha=0.15, label="_warm-up")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small", ncol=3)
    start = 0.0
    for end, users in stages if len(stages) > 1 else ():
        for axis in (top, bottom):
            axis.axvline(end, color="black", alpha=0.2, linewidth=0.8)
        bottom.annotate(f"{users} users", ((start + end) / 2, 1.0), xycoords=("data", "axes fraction"),
                        ha="center", va="top", fontsize="small")  # fmt: skip
        start = end
    top.set_yscale("log")
    top.set_ylabel("latency of accepted requests (ms)")
    bottom.set_ylabel("requests per second")
    bottom.set_xlabel("seconds since start (grey: warm-up, left out of the summary)")
    top.set_title(title)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_rss(
    path: Path, series: Sequence[tuple[float, float]], phases: Sequence[tuple[str, float, float]], title: str
) -> Path | None:
    """The PNG of the server's RSS over a run ((second, MB) points), its phases ((name, start, end)) shaded and
    named; nothing is written without a point."""
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 4), constrained_layout=True)
    axis.plot([t for t, _ in series], [mb for _, mb in series], color="black", linewidth=1)
    for index, (name, start, end) in enumerate(phases):
        axis.axvspan(start, max(end, start), color="grey", alpha=0.08 if index % 2 else 0.18)
        axis.annotate(name, ((start + end) / 2, 1.0), xycoords=("data", "axes fraction"), ha="center", va="top",
                      fontsize="small")  # fmt: skip
    axis.set_xlabel("seconds since the profile started")
    axis.set_ylabel("server RSS (MB)")
    axis.grid(True, alpha=0.3)
    axis.set_title(f"{title}: server RSS by phase")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
