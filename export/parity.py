"""Accuracy guards: every exported variant against the PyTorch fp32 model on the same real inputs.

Rules (issue 5): fp32 graphs must match within max |diff| <= 1e-4 on every output (per-token outputs at real,
non-padding positions: padded positions carry no answer and are dropped by post-processing); reduced-precision graphs
(int8, fp16, bf16) are judged at task level against PyTorch fp32's own predictions:
- classify / embed: the same arg-max label on >= 99% of inputs (embed: cosine of the [CLS] vectors >= 0.99);
- ner: token-label F1 >= 99 (agreement of the per-token arg-max labels on real tokens, specials excluded);
- qa: with gold answers (SQuAD guard inputs), the gold F1 (token-overlap F1 of the best start/end span, as
  SQuAD's F1 but over word pieces) may drop at most 1 point below PyTorch fp32's; without gold answers,
  span F1 >= 99 with the PyTorch span as reference.
Scoring a variant against PyTorch's predictions bounds how far its F1 on any gold set can move: a variant
that agrees with fp32 at F1 >= 99 changes a gold F1 by at most about one point. Torch-free (numpy): the
PyTorch outputs are computed by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FP32_MAX_ABS_DIFF = 1e-4
TASK_AGREEMENT = 0.99
F1_POINTS = 1.0
MAX_ANSWER_TOKENS = 30

Outputs = list[dict[str, np.ndarray]]
"""One dict of output arrays per guard batch."""


@dataclass
class ParityResult:
    """The figures of one variant and whether it passed its guard."""

    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    message: str = ""


class AccuracyGuardError(ValueError):
    """A variant is outside its accuracy guard: it is refused and not written."""


def max_abs_diff(reference: Outputs, candidate: Outputs, masks: Sequence[np.ndarray] | None = None) -> float:
    """Largest |difference| over all outputs; per-token outputs only at attended (non-padding) positions."""
    worst = 0.0
    for index, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        for name, value in ref.items():
            diff = np.abs(value.astype(np.float64) - cand[name].astype(np.float64))
            mask = masks[index].astype(bool) if masks is not None else None
            if mask is not None and diff.ndim >= 2 and diff.shape[:2] == mask.shape:
                diff = diff[mask]
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst


def _real_token_mask(mask: np.ndarray) -> np.ndarray:
    """Attended tokens without [CLS] (first) and the final [SEP] of each row."""
    real = mask.astype(bool).copy()
    real[:, 0] = False
    lengths = mask.sum(axis=1)
    real[np.arange(len(mask)), lengths - 1] = False
    return real


def label_agreement(reference: Outputs, candidate: Outputs) -> float:
    same = [np.argmax(r["logits"], -1) == np.argmax(c["logits"], -1) for r, c in zip(reference, candidate, strict=True)]
    return float(np.concatenate(same).mean())


def token_label_agreement(reference: Outputs, candidate: Outputs, masks: Sequence[np.ndarray]) -> float:
    agree, total = 0, 0
    for ref, cand, mask in zip(reference, candidate, masks, strict=True):
        real = _real_token_mask(mask)
        same = np.argmax(ref["logits"], -1) == np.argmax(cand["logits"], -1)
        agree += int(same[real].sum())
        total += int(real.sum())
    return agree / max(total, 1)


def best_span(start: np.ndarray, end: np.ndarray, allowed: np.ndarray) -> tuple[int, int]:
    """The (start, end) maximising start + end logits with start <= end < start + MAX_ANSWER_TOKENS."""
    s = np.where(allowed, start, -np.inf)
    e = np.where(allowed, end, -np.inf)
    scores = s[:, None] + e[None, :]
    length = np.arange(len(s))[None, :] - np.arange(len(s))[:, None]
    scores = np.where((length >= 0) & (length < MAX_ANSWER_TOKENS), scores, -np.inf)
    flat = int(np.argmax(scores))
    return flat // len(s), flat % len(s)


def span_f1(reference: tuple[int, int], candidate: tuple[int, int]) -> float:
    overlap = min(reference[1], candidate[1]) - max(reference[0], candidate[0]) + 1
    if overlap <= 0:
        return 0.0
    precision = overlap / (candidate[1] - candidate[0] + 1)
    recall = overlap / (reference[1] - reference[0] + 1)
    return 2 * precision * recall / (precision + recall)


def qa_span_f1(
    reference: Outputs, candidate: Outputs, masks: Sequence[np.ndarray], segments: Sequence[np.ndarray]
) -> float:
    """Mean token-overlap F1 (0..100) of the candidate's best context span against the reference's."""
    scores = []
    for ref, cand, mask, segment in zip(reference, candidate, masks, segments, strict=True):
        allowed = _real_token_mask(mask) & (segment == 1)
        for row in range(mask.shape[0]):
            ref_span = best_span(ref["start_logits"][row], ref["end_logits"][row], allowed[row])
            cand_span = best_span(cand["start_logits"][row], cand["end_logits"][row], allowed[row])
            scores.append(span_f1(ref_span, cand_span))
    return 100.0 * float(np.mean(scores))


def qa_gold_f1(outputs: Outputs, feeds: Sequence[dict[str, np.ndarray]], gold: list) -> float:
    """Token-overlap F1 (0..100) of the best span against the gold answers (max over answers), over the rows
    whose answer lies inside the window: SQuAD's F1 counted over word pieces."""
    scores = []
    for out, feed, rows in zip(outputs, feeds, gold, strict=True):
        allowed = _real_token_mask(feed["attention_mask"]) & (feed["token_type_ids"] == 1)
        for row, answers in enumerate(rows):
            if answers:
                span = best_span(out["start_logits"][row], out["end_logits"][row], allowed[row])
                scores.append(max(span_f1(answer, span) for answer in answers))
    return 100.0 * float(np.mean(scores)) if scores else float("nan")


def cls_cosine(reference: Outputs, candidate: Outputs) -> float:
    cosines = []
    for ref, cand in zip(reference, candidate, strict=True):
        a, b = ref["last_hidden_state"][:, 0], cand["last_hidden_state"][:, 0]
        cosines.append((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)))
    return float(np.concatenate(cosines).min())


def task_figures(task: str, reference: Outputs, candidate: Outputs, feeds: Sequence[dict[str, np.ndarray]]) -> dict:
    """The task-level agreement figure of `candidate` (name -> value) and its threshold."""
    masks = [feed["attention_mask"] for feed in feeds]
    if task == "classify":
        return {"label_agreement": label_agreement(reference, candidate), "threshold": TASK_AGREEMENT}
    if task == "ner":
        return {"token_f1_vs_fp32": 100 * token_label_agreement(reference, candidate, masks), "threshold": 99.0}
    if task == "qa":
        segments = [feed["token_type_ids"] for feed in feeds]
        return {"span_f1_vs_fp32": qa_span_f1(reference, candidate, masks, segments), "threshold": 99.0}
    return {"cls_cosine_min": cls_cosine(reference, candidate), "threshold": TASK_AGREEMENT}


def judge(
    task: str,
    precision: str,
    reference: Outputs,
    candidate: Outputs,
    feeds: Sequence[dict[str, np.ndarray]],
    gold: list | None = None,
) -> ParityResult:
    """Apply the guard of `precision` to a variant's outputs; the figures go into the manifest.

    qa with gold answers (`gold`, see GuardSet.gold) is judged on the gold F1: within F1_POINTS of fp32's."""
    masks = [feed["attention_mask"] for feed in feeds]
    figures: dict[str, Any] = {"max_abs_diff": max_abs_diff(reference, candidate, masks), "inputs": _count(feeds)}
    if precision == "fp32":
        figures["threshold"] = FP32_MAX_ABS_DIFF
        passed = figures["max_abs_diff"] <= FP32_MAX_ABS_DIFF
        message = f"max |diff| {figures['max_abs_diff']:.3g} vs PyTorch (limit {FP32_MAX_ABS_DIFF:.0e})"
        return ParityResult(passed, figures, message)
    figures.update(task_figures(task, reference, candidate, feeds))
    if task == "qa" and gold is not None:
        return _judge_qa_gold(figures, reference, candidate, feeds, gold)
    metric = next(k for k in figures if k not in ("max_abs_diff", "inputs", "threshold"))
    passed = figures[metric] >= figures["threshold"]
    message = f"{metric} {figures[metric]:.4g} vs PyTorch fp32 (needs >= {figures['threshold']:g})"
    return ParityResult(passed, figures, message)


def _judge_qa_gold(
    figures: dict[str, Any], reference: Outputs, candidate: Outputs, feeds: Sequence[dict[str, np.ndarray]], gold: list
) -> ParityResult:
    f1_fp32, f1 = qa_gold_f1(reference, feeds, gold), qa_gold_f1(candidate, feeds, gold)
    figures.update({"gold_f1_fp32": f1_fp32, "gold_f1": f1, "f1_delta": f1 - f1_fp32, "threshold": -F1_POINTS})
    passed = bool(f1 - f1_fp32 >= -F1_POINTS)
    message = f"gold F1 {f1:.2f} vs PyTorch fp32 {f1_fp32:.2f} (may drop at most {F1_POINTS:g} point)"
    return ParityResult(passed, figures, message)


def _count(feeds: Sequence[dict[str, np.ndarray]]) -> int:
    return sum(int(feed["input_ids"].shape[0]) for feed in feeds)
