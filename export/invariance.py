"""Batch invariance: a variant's answer for an input must not depend on the inputs that share its batch.

The service's batcher computes rows of concurrent requests in one call, padded to the batch's longest row
(`bert_model.tokenization.pad_rows`; OpenVINO variants' batches rounded up to a multiple of `WIDTH_MULTIPLE`). A
graph whose arithmetic mixes rows makes a caller's answer depend on what other callers send at the same moment:
ONNX Runtime's dynamic int8 (`DynamicQuantizeLinear`) takes one activation scale and zero point over the whole
batch tensor. fp32 graphs and int8 graphs with fixed activation scales compute each row on its own, the same up to
the rounding of kernels that block their loops by the batch's shape.

`check_batch_invariance` runs a sample of the accuracy guard's rows (`SAMPLE_ROWS`, evenly spaced) through a
variant opened as the service opens it (`bundles.runtimes.open_variant`), in the shapes the batcher forms:
- alone: one row per call, unpadded (the reference);
- same length: beside other rows of exactly its length, `MAX_BATCH` rows a call (rows of the guard's other inputs,
  cut to that length where too few have it: any token ids are a valid batchmate);
- mixed lengths: short rows beside long ones, padded to the longest, and again padded to the next multiple of
  `WIDTH_MULTIPLE`;
and, for a variant with a copy compiled for lone batches, every shape (alone included) on that copy too. Each
row's outputs (at its own positions: a per-token output's first len(row) positions, fill-mask's first masked rows)
are compared with its lone outputs: the largest |difference| must stay within `TOLERANCES[precision]` and every
arg-max an answer takes (label, tag, start / end position, top token) must be the same. A variant outside it is
refused for batched serving (`bundles.variant_choice`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bert_model.tasks.features import Feature, padded_width
from bert_model.tokenization import pad_rows
from bundles.hardware import read_cpu_info
from bundles.runtimes import OpenedVariant
from export.task_guard import TaskGuard

SAMPLE_ROWS = 32
"""Guard rows judged, evenly spaced over the guard's inputs."""
MAX_BATCH = 8
"""Rows per batched call: the service's default `max_batch_size`."""
WIDTH_MULTIPLE = 16
"""The width multiple the service may pad OpenVINO variants' batches to (`service.backends.ort_backend`)."""
TOLERANCES: Mapping[str, float] = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2, "int8": 1e-2}
"""Precision -> the largest |difference| allowed between a row's outputs alone and batched, in the units of the
task's outputs (logits, embedding components). fp32: rounding only (kernels that sum in another order for another
batch shape). fp16 / bf16: a few units in the last place of a logit of magnitude ~10 (fp16 keeps 11 significant
bits, bf16 8). int8 with fixed activation scales: that fp32 rounding may move an activation across a rounding
boundary of its scale, one level of one element, which moves logits by thousandths; scales taken over the whole
batch move every element's rounding, and logits by hundredths (a tiny random model) to tenths (a real one). A
precision not named here takes fp32's."""

ARGMAX_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "classify": ("logits",),
    "ner": ("logits",),
    "qa": ("start_logits", "end_logits"),
    "fill-mask": ("mask_logits",),
}
"""Per task, the outputs whose arg-max over the last axis an answer takes: the label, each token's tag, the best
start / end position, each masked position's top token. embed answers with the vectors themselves."""

RowOutputs = dict[str, np.ndarray]
"""One row's outputs, its own positions only."""


@dataclass
class Batch:
    """One batched call: its rows, its width, and which of its leading rows are judged (sample indices)."""

    shape: str
    rows: list[Feature]
    width: int
    judged: list[int]


@dataclass
class InvarianceResult:
    """The batch-invariance verdict of one variant, with the figures the manifest records."""

    precision: str
    tolerance: float
    max_abs_diff: float = 0.0
    worst_shape: str = ""
    rows: int = 0
    batches: int = 0
    argmax_total: int = 0
    argmax_same: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def argmax_agreement(self) -> float | None:
        return self.argmax_same / self.argmax_total if self.argmax_total else None

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.argmax_same == self.argmax_total

    def figures(self) -> dict[str, Any]:
        """The manifest's record (`VariantSpec.batch_invariance`)."""
        figures: dict[str, Any] = {
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance,
            "rows": self.rows,
            "batches": self.batches,
            "max_batch_size": MAX_BATCH,
            **self.extra,
        }
        if self.worst_shape:
            figures["worst_shape"] = self.worst_shape
        if self.argmax_total:
            figures["argmax_agreement"] = self.argmax_agreement
        return figures

    @property
    def message(self) -> str:
        where = f" ({self.worst_shape})" if self.worst_shape else ""
        text = (
            f"max |diff| {self.max_abs_diff:.3g} between rows alone and batched{where}, limit {self.tolerance:g} for "
            f"{self.precision}, over {self.rows} rows in {self.batches} batches"
        )
        if self.argmax_total:
            text += f"; {self.argmax_total - self.argmax_same} of {self.argmax_total} arg-max answers changed"
        return text

    def add(self, shape: str, alone: RowOutputs, batched: RowOutputs, argmax: Sequence[str]) -> None:
        """Compare one row's batched outputs with its lone ones."""
        for name, reference in alone.items():
            candidate = batched[name]
            diff = float(np.abs(reference.astype(np.float64) - candidate.astype(np.float64)).max(initial=0.0))
            if diff > self.max_abs_diff:
                self.max_abs_diff, self.worst_shape = diff, shape
            if name in argmax and reference.size:
                self.argmax_total += 1
                self.argmax_same += int(np.array_equal(reference.argmax(-1), candidate.argmax(-1)))


def check_batch_invariance(
    opened: OpenedVariant, guard: TaskGuard, precision: str, *, sample_rows: int = SAMPLE_ROWS
) -> InvarianceResult:
    """Judge `opened` (a variant of `precision`, opened as the service opens it) by batch invariance on
    `sample_rows` of the guard's rows (see the module docstring)."""
    result = InvarianceResult(precision, TOLERANCES.get(precision, TOLERANCES["fp32"]))
    sample = sample_features(guard.features, sample_rows)
    pad_id = guard_pad_id(guard.feeds)
    alone = [lone_outputs(opened, f, pad_id) for f in sample]
    argmax = ARGMAX_OUTPUTS.get(guard.task, ())
    for lone_copy in (False, True) if opened.lone_copy else (False,):
        for batch in batches_of(sample, guard.features, alone=lone_copy):
            feed = pad_rows(
                [f.input_ids for f in batch.rows], [f.token_type_ids for f in batch.rows], batch.width, pad_id
            )
            outputs = opened.run(feed, alone=lone_copy)
            shape = f"{batch.shape}, lone-batch copy" if lone_copy else batch.shape
            for position, index in enumerate(batch.judged):
                result.add(shape, alone[index], corner(outputs, position, alone[index]), argmax)
            result.batches += 1
    result.rows = len(sample)
    result.extra = {"provider": opened.provider, "cpu": _cpu()}
    return result


def sample_features(features: Sequence[Feature], count: int) -> list[Feature]:
    """Up to `count` features, evenly spaced over `features`."""
    if not features:
        raise ValueError("batch invariance is judged on the guard's inputs, and it has none")
    picks = np.linspace(0, len(features) - 1, min(count, len(features))).round().astype(int)
    return [features[i] for i in dict.fromkeys(picks.tolist())]


def guard_pad_id(feeds: Sequence[Mapping[str, np.ndarray]]) -> int:
    """The token id the guard's batches are padded with (the tokenizer's pad id); 0 when none is padded."""
    for feed in feeds:
        padded = feed["input_ids"][feed["attention_mask"] == 0]
        if padded.size:
            return int(padded[0])
    return 0


def batches_of(sample: Sequence[Feature], pool: Sequence[Feature], alone: bool = False) -> Iterator[Batch]:
    """The batches the sample is judged in: (with `alone`, each row by itself, for a copy of the graph other than the
    reference's) same length (batchmates from `pool`), mixed lengths padded to the longest, and mixed lengths padded
    to the next multiple of WIDTH_MULTIPLE (within the pool's longest row)."""
    if alone:
        yield from (Batch("alone", [feature], len(feature), [index]) for index, feature in enumerate(sample))
    yield from same_length_batches(sample, pool)
    longest = max(len(f) for f in pool)
    for judged in mixed_length_groups(sample):
        rows = [sample[i] for i in judged]
        width = max(len(f) for f in rows)
        yield Batch("mixed lengths", rows, width, judged)
        rounded = padded_width(width, WIDTH_MULTIPLE, max(longest, width))
        if rounded != width:
            yield Batch(f"mixed lengths, padded to a multiple of {WIDTH_MULTIPLE}", rows, rounded, judged)


def same_length_batches(sample: Sequence[Feature], pool: Sequence[Feature]) -> Iterator[Batch]:
    """Per length of the sample, its rows MAX_BATCH at a time, each batch filled up to MAX_BATCH rows with other
    rows of `pool` of that length, or longer ones cut to it."""
    by_length: dict[int, list[int]] = {}
    for index, feature in enumerate(sample):
        by_length.setdefault(len(feature), []).append(index)
    for length, indices in by_length.items():
        for start in range(0, len(indices), MAX_BATCH):
            judged = indices[start : start + MAX_BATCH]
            rows = [sample[i] for i in judged]
            rows += batchmates(rows, pool, length, MAX_BATCH - len(rows))
            yield Batch("same length", rows, length, judged)


def batchmates(rows: Sequence[Feature], pool: Sequence[Feature], length: int, count: int) -> list[Feature]:
    """Up to `count` rows of `length` tokens from `pool` other than `rows`: those of that length first, then longer
    ones cut to it."""
    taken = {id(f) for f in rows}
    exact = [f for f in pool if len(f) == length and id(f) not in taken]
    longer = [f for f in pool if len(f) > length and id(f) not in taken]
    cut = [Feature(f.request_index, f.input_ids[:length], f.token_type_ids[:length]) for f in longer]
    return (exact + cut)[:count]


def mixed_length_groups(sample: Sequence[Feature]) -> list[list[int]]:
    """The sample's indices in groups of MAX_BATCH that each hold short and long rows: sorted by length, then
    taken alternately from the short and the long end."""
    ordered = sorted(range(len(sample)), key=lambda i: len(sample[i]))
    mixed: list[int] = []
    while ordered:
        mixed.append(ordered.pop(0))
        if ordered:
            mixed.append(ordered.pop())
    return [mixed[start : start + MAX_BATCH] for start in range(0, len(mixed), MAX_BATCH)]


def lone_outputs(opened: OpenedVariant, feature: Feature, pad_id: int) -> RowOutputs:
    """`feature`'s outputs computed alone, in a call of its own without padding (on the graph that serves batches)."""
    outputs = opened.run(pad_rows([feature.input_ids], [feature.token_type_ids], len(feature), pad_id))
    return {name: np.asarray(values[0]) for name, values in outputs.items()}


def corner(outputs: Mapping[str, np.ndarray], position: int, alone: RowOutputs) -> RowOutputs:
    """Row `position` of a batched call's outputs, cut to the shape of the row's lone outputs: a per-token output's
    real positions, a fill-mask row's own masked positions (the batch's padding and filler rows come after)."""
    cut: RowOutputs = {}
    for name, reference in alone.items():
        row = np.asarray(outputs[name][position])
        if row.ndim != reference.ndim or any(b < a for a, b in zip(reference.shape, row.shape, strict=True)):
            raise ValueError(f"output {name!r} has a row of shape {row.shape} batched and {reference.shape} alone")
        cut[name] = row[tuple(slice(0, size) for size in reference.shape)]
    return cut


def _cpu() -> str:
    """The CPU the judgment ran on: batch invariance is a property of the kernels a CPU runs."""
    info = read_cpu_info()
    arch = f" ({info.microarchitecture})" if info.microarchitecture else ""
    return f"{info.model_name or 'unknown CPU'}{arch}, {info.matrix_family}"
