"""Statically calibrated int8: activations and weights int8 with ranges measured on the task's own inputs.

Reference: NNCF post-training quantization (`nncf.quantize`, OpenVINO's "Basic quantization flow"), transformer
model type and the MIXED preset (symmetric int8 weights per output channel, asymmetric int8 activations per
tensor), SmoothQuant (Xiao et al. 2023) moving activation outliers into the weights, and fast bias correction.

`static_int8` runs NNCF on the unfused (`raw`) ONNX graph and writes a QDQ graph: QuantizeLinear /
DequantizeLinear pairs around the quantized MatMuls, calibrated on up to `CALIBRATION_SIZE` examples of the
accuracy guard's own inputs (the task's data file when a data folder is given, else the calibration texts or
built-in sentences), one unpadded example per calibration call so padding never widens a range. OpenVINO's CPU
plugin turns each QDQ pair into a FakeQuantize and runs the MatMuls in int8 (AMX / VNNI); what stays float runs
in bf16 (`INFERENCE_PRECISION_HINT`). ONNX Runtime runs the same file too (QDQ on its CPU provider).

`KEPT_FLOAT` names the nodes left unquantized, because per-tensor int8 there moves predictions most
(docs/export.md has the measurements): the attention score and context MatMuls (Q·Kᵀ, softmax·V: their
inputs are activations on both sides, a per-tensor range fits neither well, and at 128 tokens they are a small
share of the work), the second feed-forward MatMul of every layer (its input is the GELU output, whose rare large
values set a per-tensor range that leaves the common small ones a few levels), and the task heads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

CALIBRATION_SIZE = 300
"""Calibration examples (NNCF's default subset size)."""
MIN_CALIBRATION_SIZE = 100
"""Fewest examples a static variant is calibrated on. Per-tensor activation ranges measured on a dozen texts (the
built-in sentences an export without data falls back to) need not cover real inputs, and the guard, judging on
those same texts, could not tell; such an export skips the variant and names the reason."""


class TooFewCalibrationExamples(ValueError):
    """The guard's inputs hold fewer than `MIN_CALIBRATION_SIZE` examples."""


_LAYER = r"/model/(bert/)?encoder/layer\.\d+/"
KEPT_FLOAT: tuple[str, ...] = (
    _LAYER + r"attention/self/MatMul(_1)?$",
    _LAYER + r"output/dense/MatMul$",
    r"/model/(bert/pooler|pooler|classifier|qa_outputs|cls)/.*",
)
"""Regular expressions over node names of the unfused graph that stay float (bf16 on OpenVINO). Task models name
the encoder `bert/` (`/model/bert/encoder/...`), an embed bundle's bare encoder does not (`/model/encoder/...`);
the heads: pooler, classifier, qa_outputs, and the masked-LM head `cls/` of fill-mask bundles."""

Feed = dict[str, np.ndarray]


def calibration_samples(
    feeds: Sequence[Feed], limit: int = CALIBRATION_SIZE, minimum: int = MIN_CALIBRATION_SIZE
) -> list[Feed]:
    """Up to `limit` single examples, evenly spaced over the batches `feeds`, each cut to its real length; raises
    TooFewCalibrationExamples when the batches hold fewer than `minimum`."""
    if limit < 1:
        raise ValueError(f"the calibration limit must be a positive integer, got {limit!r}")
    examples: list[Feed] = []
    for feed in feeds:
        lengths = feed["attention_mask"].sum(axis=1)
        for row, length in enumerate(lengths):
            examples.append({name: values[row : row + 1, : int(length)] for name, values in feed.items()})
    if not examples:
        raise ValueError("static int8 quantization needs calibration inputs, and none were given")
    if len(examples) < minimum:
        raise TooFewCalibrationExamples(
            f"static int8 is calibrated on at least {minimum} examples of the task's inputs, and the guard has "
            f"{len(examples)}: give the task's data set (--data-dir or --eval-data) or --calibration FILE"
        )
    picks = np.linspace(0, len(examples) - 1, min(limit, len(examples))).round().astype(int)
    return [examples[i] for i in dict.fromkeys(picks.tolist())]


def static_int8(source: Path, target: Path, feeds: Sequence[Feed], kept_float: Sequence[str] = KEPT_FLOAT) -> Path:
    """Quantize the unfused graph `source` with NNCF (transformer, MIXED) calibrated on `feeds` into `target`."""
    from bundles.runtimes import without_openvino_telemetry

    without_openvino_telemetry()
    import nncf
    from nncf import IgnoredScope, ModelType, QuantizationPreset

    nncf.set_log_level(logging.ERROR)
    samples = calibration_samples(feeds)
    quantized = nncf.quantize(
        onnx.load(str(source)),
        nncf.Dataset(samples),
        preset=QuantizationPreset.MIXED,
        model_type=ModelType.TRANSFORMER,
        subset_size=len(samples),
        ignored_scope=IgnoredScope(patterns=list(kept_float), validate=False) if kept_float else None,
    )
    onnx.save(quantized, str(target))
    return target
