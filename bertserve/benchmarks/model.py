"""`bench-model`: PyTorch, transformers and every exported variant, side by side in ONE process.

    bertserve bench-model BUNDLE_OR_MODEL [--out artifacts/bench] [--rounds 20] [--variants a,b]
    make bench                    # minilm-sst2, under the shared CPU lock

Results: artifacts/bench/bench-model.{json,md} by `report.write_report` (date, machine, command), with this CPU's
peaks and the matrix-unit probes of the run (`matmul_probe`).

Method: all runners are built first; each shape is then measured in interleaved rounds (every runner takes one
turn per round, in the same order) after warm-up calls. A turn is a short idle pause (so that one runtime's
spinning worker threads never steal the next runner's cores), one untimed call (the runner's weights back in
cache, as in a server that runs one model back to back) and three timed calls; the figure is the median. Inputs are
real text (WikiText-2 paragraphs, else built-in sentences) cut to exactly the sequence length: no padding.

FLOPs per forward (multiply-add = 2 FLOPs), B = batch, S = length, H = hidden, I = intermediate, L = layers:
    L · (2·B·S·(4·H² + 2·H·I)  +  4·B·S²·H)   (Q, K, V, output and feed-forward projections; QK^T and PV)
Peak of this CPU: cores × clock × operations per cycle per core (`cpu_peak`), from /proc/cpuinfo via
`bundles.hardware` (the clock is the one /proc/cpuinfo reports; turbo is not counted). Per core and cycle:
- fp32: two FMA pipes × lanes × 2. AVX-512 on Intel server cores and AMD Zen 5: two 512-bit pipes, 64 FLOP
  (Intel 64 and IA-32 Architectures Optimization Reference Manual; AMD Software Optimization Guide for the
  Zen 5 Microarchitecture, "Floating-Point Unit"). AMD Zen 4 executes AVX-512 on 256-bit datapaths, each
  512-bit instruction in two halves: 32 FLOP (AMD Software Optimization Guide for Family 19h, same section).
  AVX2 + FMA: 32; neither: 8.
- bf16: AMX-BF16 tiles: 1024 FLOP (TDPBF16PS multiplies a 16×32 by a 32×16 tile, 16,384 FLOP, every 16
  cycles; Intel's figure for Sapphire Rapids and later: Architecture Day 2021 and the Optimization Reference
  Manual's AMX chapter). AVX512-BF16 (VDPBF16PS, two products per fp32 lane): twice fp32. Neither: fp32's.
- int8: AMX-INT8 tiles: 2048 op (TDPBUSD multiplies 16×64 by 64×16, 32,768 op, every 16 cycles; same
  sources, which give it as 8× AVX-512 VNNI's 256). AVX512-VNNI / AVX-VNNI (VPDPBUSD, four u8×s8 products
  per int32 lane): four times fp32, so 256 on Intel server cores and 128 on Zen 4. Neither: twice fp32
  (VPMADDUBSW + VPMADDWD).
A precision's peak bounds the runners of that precision from above; int8 graphs still run softmax, layer
norms and GELU in fp32 / bf16, so a BERT stays well below it (AMX most of all).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.config import BertConfig
from bertserve.benchmarks import matmul_probe
from bertserve.benchmarks.report import Provenance, provenance, write_report
from bundles.hardware import FEATURE_FLAGS, read_cpu_info, usable_cores

SHAPES: tuple[tuple[int, int], ...] = ((1, 128), (16, 128), (1, 384))
IDLE_PAUSE_S = 0.02
"""The idle pause before each runner's turn."""
WARMUP_CALLS = 2
"""Untimed calls of each runner on a shape before its rounds."""
TIMED_CALLS_PER_TURN = 3
"""Timed calls of a runner's turn, after its untimed one."""


@dataclass
class CpuPeak:
    cores: int
    ghz: float
    fp32_per_cycle: int
    bf16_per_cycle: int
    int8_per_cycle: int
    flags: list[str] = field(default_factory=list)
    model_name: str = ""
    cpu: dict[str, Any] = field(default_factory=dict)
    """`bundles.hardware.CpuInfo.describe()`: vendor, family/model, code name, features, matrix family."""
    basis: str = ""
    """Which units the per-cycle figures assume (see the module docstring for the sources)."""

    def peak(self, precision: str) -> float:
        """Peak FLOP/s (int8: op/s) of `precision` on all cores."""
        per_cycle = {"bf16": self.bf16_per_cycle, "int8": self.int8_per_cycle}.get(precision, self.fp32_per_cycle)
        return self.cores * self.ghz * 1e9 * per_cycle


def cpu_peak(cpuinfo: str | None = None, cores: int | None = None) -> CpuPeak:
    """This CPU's theoretical peak per precision (see the module docstring for the figures and their sources)."""
    info = read_cpu_info(cpuinfo, cores)
    fp32, vector_basis = _fp32_per_cycle(info.has("avx512f"), info.has("fma"), info.microarchitecture == "Zen 4")
    if info.has("amx_bf16"):
        bf16, bf16_basis = 1024, "AMX-BF16 tiles"
    elif info.has("avx512_bf16"):
        bf16, bf16_basis = 2 * fp32, "AVX512-BF16"
    else:
        bf16, bf16_basis = fp32, "fp32 units"
    if info.has("amx_int8"):
        int8, int8_basis = 2048, "AMX-INT8 tiles"
    elif info.has("avx512_vnni") or info.has("avx_vnni"):
        int8, int8_basis = 4 * fp32, "VNNI"
    else:
        int8, int8_basis = 2 * fp32, "no VNNI"
    return CpuPeak(
        cores=info.cores,
        ghz=info.mhz / 1000,
        fp32_per_cycle=fp32,
        bf16_per_cycle=bf16,
        int8_per_cycle=int8,
        flags=sorted(info.flags & {*FEATURE_FLAGS, "amx_tile"}),
        model_name=info.model_name,
        cpu=info.describe(),
        basis=f"fp32: {vector_basis}; bf16: {bf16_basis}; int8: {int8_basis}",
    )


def _fp32_per_cycle(avx512: bool, fma: bool, half_width: bool) -> tuple[int, str]:
    """fp32 FLOP per cycle per core and what it assumes: two FMA pipes of the widest datapath."""
    if avx512:
        return (32, "AVX-512 on two 256-bit FMA pipes") if half_width else (64, "two 512-bit FMA pipes")
    if fma:
        return 32, "two 256-bit FMA pipes"
    return 8, "SSE"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _busy_seconds() -> float | None:
    """CPU seconds all processes have been busy since boot (/proc/stat), or None off Linux."""
    import os

    fields = _read("/proc/stat").split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """How much CPU other processes used while we measured: a benchmark is only valid when that is ~0."""

    def __enter__(self) -> ForeignLoad:
        import os

        self.start_busy, self.start_own, self.start_wall = _busy_seconds(), sum(os.times()[:2]), time.time()
        self.fraction: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        end_busy = _busy_seconds()
        if end_busy is None or self.start_busy is None:
            return
        own = sum(os.times()[:2]) - self.start_own
        wall = max(time.time() - self.start_wall, 1e-9)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.fraction = max(0.0, (end_busy - self.start_busy - own) / (wall * cores))


def forward_flops(config: BertConfig, batch: int, seq_len: int) -> float:
    h, i = config.hidden_size, config.intermediate_size
    per_layer = 2 * batch * seq_len * (4 * h * h + 2 * h * i) + 4 * batch * seq_len * seq_len * h
    return float(config.num_hidden_layers * per_layer)


@dataclass
class Runner:
    name: str
    precision: str
    call: Callable[[dict[str, np.ndarray]], object]
    """Runs one forward on a feed; built per shape by `prepare`."""


@dataclass
class Row:
    runner: str
    batch: int
    seq_len: int
    median_ms: float
    sequences_per_s: float
    speedup: float
    gflops: float
    peak_fraction: float
    """Achieved FLOP/s over the fp32 peak of this CPU."""
    precision_peak_fraction: float
    """Achieved FLOP/s over the peak of the runner's own precision (bf16, int8)."""


def measure(runners: list[Runner], feed: dict[str, np.ndarray], rounds: int) -> dict[str, float]:
    """Median seconds per call of every runner on `feed`, interleaved round by round.

    Each turn of a runner is an idle pause, one untimed call (its weights back into cache after the other
    runners evicted them: a server runs one model back to back) and `TIMED_CALLS_PER_TURN` timed calls.
    """
    for runner in runners:
        for _ in range(WARMUP_CALLS):
            runner.call(feed)
    times: dict[str, list[float]] = {runner.name: [] for runner in runners}
    for _ in range(rounds):
        for runner in runners:
            time.sleep(IDLE_PAUSE_S)
            runner.call(feed)
            for _ in range(TIMED_CALLS_PER_TURN):
                start = time.perf_counter()
                runner.call(feed)
                times[runner.name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def rows_for_shape(
    medians: dict[str, float], runners: list[Runner], config: BertConfig, batch: int, seq_len: int, peak: CpuPeak
) -> list[Row]:
    baseline = medians[runners[0].name]
    flops = forward_flops(config, batch, seq_len)
    rows = []
    for runner in runners:
        seconds = medians[runner.name]
        achieved = flops / seconds
        rows.append(
            Row(
                runner=runner.name,
                batch=batch,
                seq_len=seq_len,
                median_ms=seconds * 1000,
                sequences_per_s=batch / seconds,
                speedup=baseline / seconds,
                gflops=achieved / 1e9,
                peak_fraction=achieved / peak.peak("fp32") if peak.ghz else 0.0,
                precision_peak_fraction=achieved / peak.peak(runner.precision) if peak.ghz else 0.0,
            )
        )
    return rows


def markdown_table(rows: list[Row]) -> str:
    lines = [
        "| runner | batch × seq | median ms | seq/s | vs PyTorch fp32 | GFLOP/s | % fp32 peak | % own-precision peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.runner} | {row.batch} × {row.seq_len} | {row.median_ms:.1f} | {row.sequences_per_s:.1f} | "
            f"{row.speedup:.2f}× | {row.gflops:.0f} | {100 * row.peak_fraction:.0f}% | "
            f"{100 * row.precision_peak_fraction:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def machine_line(peak: CpuPeak) -> str:
    """What the figures were measured on and the peaks they are divided by, in one sentence."""
    cpu = peak.cpu
    arch = f" ({cpu['microarchitecture']})" if cpu.get("microarchitecture") else ""
    features = ", ".join(name for name, present in cpu.get("features", {}).items() if present) or "none"
    return (
        f"CPU: {peak.model_name or 'unknown'}{arch}, {peak.cores} cores at {peak.ghz:.2f} GHz nominal, "
        f"{cpu.get('matrix_family', '')} (features: {features}); {peaks(peak)}."
    )


def peaks(peak: CpuPeak) -> str:
    """The peaks the figures are divided by: `peak fp32 176 GFLOP/s, bf16 352, int8 704 GOP/s (<basis>)`."""
    return (
        f"peak fp32 {peak.peak('fp32') / 1e9:.0f} GFLOP/s, bf16 {peak.peak('bf16') / 1e9:.0f}, "
        f"int8 {peak.peak('int8') / 1e9:.0f} GOP/s ({peak.basis})"
    )


def probe_sentence(probes: list[dict[str, Any]]) -> str:
    """The matrix-unit probes of a run in one sentence (`matmul_probe`), or "" without probes."""
    if not probes:
        return ""
    ratios = [float(p["bf16_over_fp32"]) for p in probes]
    bf16 = [float(p["bf16_gflops"]) for p in probes]
    fp32 = [float(p["fp32_gflops"]) for p in probes]
    return (
        f" Matrix-unit probe ({len(probes)} times during the run, {matmul_probe.SHAPE[0]}×{matmul_probe.SHAPE[1]} @ "
        f"{matmul_probe.SHAPE[1]}×{matmul_probe.SHAPE[2]} matmul): fp32 {min(fp32):.0f}–{max(fp32):.0f} GFLOP/s, "
        f"bf16 {min(bf16):.0f}–{max(bf16):.0f} GFLOP/s, bf16 / fp32 {min(ratios):.1f}–{max(ratios):.1f}×."
    )


def save_report(rows: list[Row], peak: CpuPeak, meta: dict, out_dir: Path, origin: Provenance) -> tuple[Path, Path]:
    """bench-model.json (meta, the CPU's peaks, the rows) and bench-model.md (the model, load, peaks, table)."""
    foreign = meta.get("foreign_cpu_fraction")
    load = f" Other processes used {100 * foreign:.0f}% of the CPU during the run." if foreign is not None else ""
    on = f"On {peak.cores} cores at {peak.ghz:.2f} GHz nominal: {peaks(peak)}."
    header = f"Model: {meta.get('model')}.{load} {on}{probe_sentence(meta.get('matmul_probe', []))}\n\n"
    figures = {"meta": meta, "cpu": asdict(peak), "rows": [asdict(r) for r in rows]}
    return write_report(out_dir, "bench-model", origin, figures, header + markdown_table(rows))


# ---- building the runners -----------------------------------------------------------------------------------
def torch_runners(folder: Path, task: str, threads: int) -> list[Runner]:
    """Our PyTorch model in fp32 (the baseline, first), transformers' model in fp32, ours under bf16 autocast."""
    import torch

    from bundles.spec import OUTPUT_NAMES
    from export.wrapper import TASK_CLASSES

    torch.set_num_threads(threads)
    ours = TASK_CLASSES[task].from_pretrained(folder).eval()  # type: ignore[attr-defined]
    peer = transformers_model(ours, task)
    output = OUTPUT_NAMES[task][0]

    def call(model: object, bf16: bool) -> Callable[[dict[str, np.ndarray]], object]:
        def run(feed: dict[str, np.ndarray]) -> object:
            tensors = {name: torch.from_numpy(value) for name, value in feed.items()}
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                return getattr(model(**tensors), output)  # type: ignore[operator]

        return run

    return [
        Runner("PyTorch fp32 (ours)", "fp32", call(ours, False)),
        Runner("transformers fp32", "fp32", call(peer, False)),
        Runner("PyTorch bf16 autocast (ours)", "bf16", call(ours, True)),
    ]


def transformers_model(ours: object, task: str) -> object:
    """The same weights in Hugging Face transformers' BERT class (its default attention), in eval mode."""
    import transformers

    classes = {
        "classify": transformers.BertForSequenceClassification,
        "qa": transformers.BertForQuestionAnswering,
        "ner": transformers.BertForTokenClassification,
        "embed": transformers.BertModel,
    }
    hf_config = transformers.BertConfig(**ours.config.to_hf_dict())  # type: ignore[attr-defined]
    model = classes[task](hf_config) if task != "embed" else transformers.BertModel(hf_config, add_pooling_layer=True)
    missing, unexpected = model.load_state_dict(ours.checkpoint_tensors(), strict=False)  # type: ignore[attr-defined]
    if [k for k in missing if "position_ids" not in k] or unexpected:
        raise ValueError(f"transformers model does not take our weights: missing {missing}, unexpected {unexpected}")
    return model.eval()


def variant_runners(bundle_dir: Path, names: list[str] | None, threads: int) -> list[Runner]:
    """Every variant of the bundle (or those in `names`) this process runs, on `threads` threads and one stream: one
    call at a time, all cores on it."""
    from bundles.runtimes import OPENVINO_PROVIDER, RuntimeSettings, can_run, open_variant
    from bundles.spec import BundleManifest

    manifest = BundleManifest.read(bundle_dir)
    settings = RuntimeSettings(intra_op_threads=threads, openvino_streams=1)
    runners = []
    for name, spec in manifest.variants.items():
        if names is not None and name not in names:
            continue
        if spec.provider == OPENVINO_PROVIDER and not can_run(spec.provider):
            continue
        opened = open_variant(bundle_dir / spec.file, spec, manifest.output_names, settings)
        on = opened.provider.removesuffix("ExecutionProvider")
        runtime = "OpenVINO" if spec.provider == OPENVINO_PROVIDER else f"ONNX Runtime {on}"
        runners.append(Runner(f"{name} ({runtime})", spec.precision, opened.run))
    return runners


def bench_feed(tokenizer_dir: Path, batch: int, seq_len: int, data_dir: Path | None) -> dict[str, np.ndarray]:
    """`batch` rows of exactly `seq_len` real tokens ([CLS] text [SEP]), no padding."""
    from bert_model.tokenization import BertTokenizer
    from export.guard_data import BUILTIN_TEXTS

    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    wiki = data_dir / "wikitext-2-raw" / "wiki.valid.raw" if data_dir is not None else None
    if wiki is not None and wiki.is_file():
        texts = [line for line in wiki.read_text(encoding="utf-8").splitlines() if len(line) > 2500][:batch]
    else:
        texts = []
    while len(texts) < batch:
        texts.append(" ".join(BUILTIN_TEXTS[len(texts) % len(BUILTIN_TEXTS) :] * 8))
    rows = []
    for text in texts:
        ids = tokenizer.backend.encode(text, add_special_tokens=False).ids
        while len(ids) < seq_len - 2:
            ids = ids + ids
        rows.append([tokenizer.cls_id, *ids[: seq_len - 2], tokenizer.sep_id])
    input_ids = np.array(rows, dtype=np.int64)
    return {
        "input_ids": input_ids,
        "attention_mask": np.ones_like(input_ids),
        "token_type_ids": np.zeros_like(input_ids),
    }


def run_benchmark(
    bundle_dir: Path,
    out_dir: Path,
    *,
    rounds: int = 20,
    variants: list[str] | None = None,
    data_dir: Path | None = None,
    log: Callable[[str], None] = print,
    command: str = "bertserve bench-model",
) -> list[Row]:
    """Benchmark a bundle against its source PyTorch model; writes bench-model.json and .md into `out_dir`
    (`command`: the command line the report names)."""
    from bundles.spec import TOKENIZER_DIR, BundleManifest

    manifest = BundleManifest.read(bundle_dir)
    folder = Path(manifest.source.get("model", ""))
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"bundle {bundle_dir} names source model {folder}, which is not a model folder")
    threads = usable_cores()
    config = BertConfig.load(folder)
    runners = torch_runners(folder, manifest.task, threads) + variant_runners(bundle_dir, variants, threads)
    peak = cpu_peak(cores=threads)
    origin = provenance(command, cpu=read_cpu_info(cores=threads))
    log(machine_line(peak))
    rows: list[Row] = []
    probes: list[dict[str, object]] = []

    def probe_matrix_units(when: str) -> None:
        rates = matmul_probe.probe(threads=threads)
        probes.append({"when": when, **asdict(rates), "bf16_over_fp32": rates.bf16_over_fp32})
        log(f"matrix units {when}: {rates.describe()}")

    with ForeignLoad() as foreign:
        for batch, seq_len in SHAPES:
            probe_matrix_units(f"before {batch} × {seq_len}")
            feed = bench_feed(bundle_dir / TOKENIZER_DIR, batch, seq_len, data_dir)
            shape_rounds = max(3, rounds // 3) if batch * seq_len >= 2048 else rounds
            medians = measure(runners, feed, shape_rounds)
            shape_rows = rows_for_shape(medians, runners, config, batch, seq_len, peak)
            log(markdown_table(shape_rows))
            rows.extend(shape_rows)
        probe_matrix_units("at the end")
    if foreign.fraction is not None and foreign.fraction > 0.05:
        log(f"warning: other processes used {100 * foreign.fraction:.0f}% of the CPU meanwhile: figures are not valid")
    meta = {
        "model": manifest.name,
        "bundle": str(bundle_dir),
        "task": manifest.task,
        "threads": threads,
        "rounds": rounds,
        "method": "one process, interleaved rounds; per turn: 20 ms idle, 1 untimed + 3 timed calls; median",
        "foreign_cpu_fraction": foreign.fraction,
        "matmul_probe": probes,
    }
    save_report(rows, peak, meta, out_dir, origin)
    return rows
