"""Batch invariance: the guard refuses a variant whose rows depend on their batchmates, in the batcher's shapes, and
the export records its verdict so that the service never batches such a variant by default."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from bert_model.tasks.features import Feature
from bundles.hardware import read_cpu_info
from bundles.runtimes import OpenedVariant
from bundles.spec import BundleManifest
from bundles.variant_choice import AVX2, VNNI, choose_variant, timing_candidates
from export.bundle import build_bundle
from export.invariance import (
    MAX_BATCH,
    TOLERANCES,
    WIDTH_MULTIPLE,
    batchmates,
    check_batch_invariance,
    corner,
    mixed_length_groups,
)
from export.parity import AGREEMENT, Scored
from export.task_guard import TaskGuard, batches

NO_DATA = Path("/nonexistent")
PAD = 0
LABELS = 3


class RowWise(OpenedVariant):
    """Per-token logits from each token's own id and position, and per-input logits from the row's own tokens: what
    a batch-invariant graph computes. `shift_by_batch` adds the batch's largest id to every output, the way a scale
    taken over the whole batch tensor moves every row."""

    provider = "fake"

    def __init__(self, per_token: bool = True, shift_by_batch: float = 0.0, lone_copy: bool = False) -> None:
        self.input_names = ["input_ids", "attention_mask", "token_type_ids"]
        self.output_names = ["logits"]
        self.per_token = per_token
        self.shift_by_batch = shift_by_batch
        self.lone_copy = lone_copy
        self.calls: list[tuple[tuple[int, ...], bool]] = []

    def run(self, feed, alone=False):  # type: ignore[no-untyped-def]
        ids, mask = feed["input_ids"].astype(np.float32), feed["attention_mask"].astype(np.float32)
        self.calls.append((ids.shape, alone))
        shift = self.shift_by_batch * float(ids.max())
        if self.per_token:
            positions = np.arange(ids.shape[1], dtype=np.float32)
            token = np.stack([np.sin(ids + k * positions) for k in range(LABELS)], axis=-1)  # (B, S, C)
            return {"logits": token * mask[..., None] + shift}
        pooled = (ids * mask).sum(axis=1) / mask.sum(axis=1)  # (B,)
        return {"logits": np.stack([np.sin(pooled * (k + 1)) for k in range(LABELS)], axis=-1) + shift}


def guard_of(task: str, lengths: list[int]) -> TaskGuard:
    rng = np.random.default_rng(0)
    features = [Feature(i, [2, *rng.integers(5, 99, n - 2).tolist(), 3], [0] * n) for i, n in enumerate(lengths)]
    order, feeds = batches(features, PAD, 32)
    return TaskGuard(task, AGREEMENT, "test", features, order, feeds, lambda rows: Scored({}), len(features), {})


LENGTHS = [5, 9, 9, 12, 30, 7, 9, 21, 44, 5, 16, 33, 9, 60, 12, 8]


@pytest.mark.parametrize("per_token", [True, False], ids=["per-token", "per-input"])
def test_a_row_wise_graph_passes_in_every_batch_shape(per_token: bool) -> None:
    variant = RowWise(per_token)
    result = check_batch_invariance(variant, guard_of("ner" if per_token else "classify", LENGTHS), "fp32")
    assert result.passed and result.max_abs_diff == 0.0 and result.argmax_agreement == 1.0
    assert result.rows == len(LENGTHS) and result.batches == len(variant.calls) - len(LENGTHS)
    shapes = [shape for shape, _ in variant.calls]
    assert shapes[: len(LENGTHS)] == [(1, n) for n in LENGTHS]  # alone: one row, no padding
    batched = shapes[len(LENGTHS) :]
    assert max(rows for rows, _ in batched) == MAX_BATCH
    assert any(width % WIDTH_MULTIPLE == 0 and width not in LENGTHS for _, width in batched)  # rounded widths
    figures = result.figures()
    assert figures["tolerance"] == TOLERANCES["fp32"] and figures["provider"] == "fake"
    assert figures["cpu"].startswith(read_cpu_info().model_name or "unknown CPU")


def test_a_graph_whose_rows_move_with_their_batchmates_is_refused() -> None:
    result = check_batch_invariance(RowWise(shift_by_batch=0.01), guard_of("ner", LENGTHS), "int8")
    assert not result.passed
    assert result.max_abs_diff > TOLERANCES["int8"] and result.worst_shape
    assert result.message.startswith(f"max |diff| {result.max_abs_diff:.3g} between rows alone and batched")
    tiny_shift = check_batch_invariance(RowWise(shift_by_batch=1e-6), guard_of("ner", LENGTHS), "int8")
    assert tiny_shift.passed  # rounding-sized differences are within the int8 tolerance...
    assert not check_batch_invariance(
        RowWise(shift_by_batch=1e-6), guard_of("ner", LENGTHS), "fp32"
    ).passed  # not fp32's


def test_the_copy_for_lone_batches_is_judged_too() -> None:
    variant = RowWise(lone_copy=True)
    result = check_batch_invariance(variant, guard_of("ner", LENGTHS), "fp32")
    lone = [shape for shape, alone in variant.calls if alone]
    assert result.passed and len(lone) == (result.batches + len(LENGTHS)) // 2  # and each row alone on that copy
    assert lone[: len(LENGTHS)] == [(1, n) for n in LENGTHS]


def test_batch_shapes_mix_lengths_and_fill_same_length_batches() -> None:
    sample = [Feature(i, [2] * n, [0] * n) for i, n in enumerate([3, 4, 5, 6, 7, 8, 9, 10, 11, 12])]
    groups = mixed_length_groups(sample)
    assert [len(sample[i]) for i in groups[0]] == [3, 12, 4, 11, 5, 10, 6, 9]
    pool = [*sample, Feature(20, [2, 7, 7, 7], [0, 0, 1, 1])]
    mates = batchmates([sample[1]], pool, 4, MAX_BATCH - 1)
    assert [f.request_index for f in mates][:1] == [20]  # the one of exactly that length first
    assert all(len(f) == 4 for f in mates) and len(mates) == MAX_BATCH - 1  # then longer rows, cut


def test_rows_are_compared_at_their_own_positions() -> None:
    alone = {"mask_logits": np.ones((2, 5)), "start_logits": np.ones(4)}
    outputs = {"mask_logits": np.zeros((3, 4, 5)), "start_logits": np.zeros((3, 9))}
    outputs["mask_logits"][1, :2] = 1.0
    outputs["start_logits"][1, :4] = 1.0
    cut = corner(outputs, 1, alone)
    assert cut["mask_logits"].shape == (2, 5) and cut["start_logits"].shape == (4,)
    assert all(np.array_equal(cut[name], alone[name]) for name in alone)
    with pytest.raises(ValueError, match="has a row of shape"):
        corner({"mask_logits": np.zeros((3, 1, 5)), "start_logits": outputs["start_logits"]}, 1, alone)


def test_the_export_refuses_dynamic_int8_for_batched_serving_and_says_so(
    tiny_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails without the invariance guard: ONNX Runtime's dynamic int8 moves a row's tags with its batchmates; fp32 is
    exact. The verdicts are in the manifest, and the service's choice never batches the dependent variant."""
    with caplog.at_level(logging.WARNING, logger="export.bundle"):
        result = build_bundle(tiny_models["ner"], tmp_path / "b", "cpu-fp32,cpu-int8", max_seq_len=64, data_dir=NO_DATA)
    manifest = BundleManifest.read(tmp_path / "b")
    fp32, dynamic = manifest.variants["cpu-fp32"], manifest.variants["cpu-int8"]
    assert fp32.batch_invariant is True and fp32.batch_invariance["max_abs_diff"] <= TOLERANCES["fp32"]
    assert dynamic.batch_invariant is False and dynamic.batch_invariance["max_abs_diff"] > TOLERANCES["int8"]
    assert dynamic.batch_invariance["rows"] > 0 and dynamic.batch_invariance["batches"] > 0
    assert set(result.batch_dependent) == {"cpu-int8"} and not result.refused
    assert "variant cpu-int8 is not batch invariant (written, refused for batched serving" in caplog.text
    assert choose_variant(manifest, "cpu", family=AVX2) == "cpu-fp32"
    assert timing_candidates(manifest, family=VNNI)[0] == ["cpu-fp32"]


def test_static_int8_is_batch_invariant_and_serves_by_default_on_avx2(
    tiny_models: dict[str, Path], data_dir: Path, tmp_path: Path
) -> None:
    variants = "cpu-fp32,cpu-int8,cpu-int8-static"
    result = build_bundle(
        tiny_models["ner"], tmp_path / "b", variants, max_seq_len=64, data_dir=data_dir, guard_limit=120
    )
    assert not result.refused, result.refused
    static = result.manifest.variants["cpu-int8-static"]
    assert static.batch_invariant is True and static.batch_invariance["max_abs_diff"] <= TOLERANCES["int8"]
    assert "judgment" in static.parity and static.fused_ops["MatMulIntegerToFloat"] > 0
    assert choose_variant(result.manifest, "cpu", family=AVX2) == "cpu-int8-static"
