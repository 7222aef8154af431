"""Accuracy guards: the rules that accept or refuse an exported variant against the PyTorch fp32 model.

- fp32 graphs: max |diff| <= FP32_MAX_ABS_DIFF on every output, PyTorch and the graph run on the same batches
  (per-token outputs compared at real, non-padding positions only: padded positions carry no answer).
- reduced precision (int8, fp16, bf16): judged at task level, on predictions that `export/task_guard.py` decodes
  from both models' outputs with the task logic of `bertserve evaluate` (`bert_model.tasks`):
  - judgment `eval-set` (labelled data): qa's SQuAD F1 against the gold answers and ner's entity F1 (seqeval)
    against the gold tags may fall at most F1_POINTS below PyTorch fp32's on the same examples; classify: the
    same label as fp32 on >= TASK_AGREEMENT of the examples (accuracy recorded);
  - judgment `agreement-with-fp32` (texts without labels: built-in sentences or a calibration file): fp32's own
    predictions are the reference: qa answers scored with SQuAD's F1 and ner entities with seqeval's F1 must
    reach 100 - F1_POINTS; classify: the same label on >= TASK_AGREEMENT;
  - embed (always by agreement): cosine of the graph's pooled sentence vectors, normalized, to fp32's, mean >=
    COSINE_MEAN and minimum >= COSINE_MIN, and question -> paragraph retrieval picking fp32's paragraph for
    >= RETRIEVAL_AGREEMENT of the questions (when the guard retrieves);
  - fill-mask (always by agreement): at the masked positions, fp32's top-1 token on >= TOP1_AGREEMENT of them and
    on average >= TOP5_OVERLAP of fp32's top-5 tokens among the variant's top 5;
  - score heads (judgment `rank-agreement-with-fp32`: a reranker, and any classifier with one output, whose arg-max
    label always agrees and says nothing): per candidate list (a query's passages; for a one-output classifier,
    consecutive guard texts), the variant's best candidate is fp32's on >= RANK_TOP1_AGREEMENT of the lists, and
    Spearman's rank correlation of its scores with fp32's averages >= RANK_SPEARMAN_MEAN; the largest |score
    difference| is recorded.
Torch-free (numpy; seqeval for the ner agreement, scipy for Spearman's correlation).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bert_model.tasks.metrics import ner_metrics, token_f1

FP32_MAX_ABS_DIFF = 1e-4
TASK_AGREEMENT = 0.99
F1_POINTS = 1.0
COSINE_MEAN = 0.995
COSINE_MIN = 0.98
RETRIEVAL_AGREEMENT = 0.95
"""Of the questions, the share whose nearest paragraph is fp32's: near ties between paragraphs of one article
may flip under reduced precision without the vectors being worse."""
TOP1_AGREEMENT = 0.95
TOP5_OVERLAP = 0.9
RANK_TOP1_AGREEMENT = 0.95
"""Of the candidate lists, the share whose best candidate is fp32's: as for retrieval, two candidates fp32 scores
almost alike may swap under reduced precision without the model being worse."""
RANK_SPEARMAN_MEAN = 0.95
"""Mean over the lists of Spearman's rho between the variant's and fp32's scores. In a list of 10 candidates one
swap of neighbours costs 0.012: the mean allows a few swaps of near ties per list, not a reordered list."""
EVAL_SET = "eval-set"
AGREEMENT = "agreement-with-fp32"
RANKING = "rank-agreement-with-fp32"

Outputs = list[dict[str, np.ndarray]]
"""One dict of output arrays per guard batch."""


@dataclass
class ParityResult:
    """The figures of one variant and whether it passed its guard."""

    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    message: str = ""


@dataclass
class Scored:
    """One model's decoded predictions on the guard examples, and its metrics against gold labels (if any)."""

    predictions: dict[int, Any]
    """Per example index: the label (classify), answer text or span (qa), word tags (ner), [CLS] vector (embed)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """`bertserve evaluate`'s metrics on the examples (eval-set judgment only)."""


class AccuracyGuardError(ValueError):
    """A variant is outside its accuracy guard: it is refused and not written."""


# ---- fp32: outputs ---------------------------------------------------------------------------------------
def max_abs_diff(
    reference: Outputs,
    candidate: Outputs,
    masks: Sequence[np.ndarray] | None = None,
    per_token: Collection[str] | None = None,
) -> float:
    """Largest |difference| over all outputs; per-token outputs (those named in `per_token`; None: any whose leading
    axes are the mask's) only at attended (non-padding) positions."""
    worst = 0.0
    for index, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        for name, value in ref.items():
            diff = np.abs(value.astype(np.float64) - cand[name].astype(np.float64))
            mask = masks[index].astype(bool) if masks is not None else None
            token_rows = per_token is None or name in per_token
            if mask is not None and token_rows and diff.ndim >= 2 and diff.shape[:2] == mask.shape:
                diff = diff[mask]
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst


def judge_fp32(
    reference: Outputs,
    candidate: Outputs,
    masks: Sequence[np.ndarray] | None,
    per_token: Collection[str] | None = None,
) -> ParityResult:
    """The fp32 rule: max |diff| against PyTorch within FP32_MAX_ABS_DIFF (per-token outputs at the attended
    positions of each batch's `masks`, see `max_abs_diff`; everything everywhere without masks)."""
    worst = max_abs_diff(reference, candidate, masks, per_token)
    figures = {"max_abs_diff": worst, "threshold": FP32_MAX_ABS_DIFF}
    message = f"max |diff| {worst:.3g} vs PyTorch (limit {FP32_MAX_ABS_DIFF:.0e})"
    return ParityResult(worst <= FP32_MAX_ABS_DIFF, figures, message)


# ---- reduced precision: decoded predictions --------------------------------------------------------------
def judge_task(task: str, judgment: str, reference: Scored, candidate: Scored) -> ParityResult:
    """Apply the task-level rule of `judgment` (EVAL_SET or AGREEMENT) to a variant's decoded predictions."""
    if judgment == EVAL_SET:
        return _judge_eval_set(task, reference, candidate)
    if judgment == RANKING:
        return judge_rankings(reference, candidate)
    if judgment != AGREEMENT:
        raise ValueError(f"unknown judgment {judgment!r}; expected {EVAL_SET!r}, {AGREEMENT!r} or {RANKING!r}")
    if task == "qa":
        return _judge_answers(reference, candidate)
    if task == "ner":
        return _judge_entities(reference, candidate)
    if task == "classify":
        return _judge_labels(reference, candidate, {})
    if task == "fill-mask":
        return _judge_top_tokens(reference, candidate)
    return _judge_embeddings(reference, candidate)


def prediction_agreement(reference: Scored, candidate: Scored) -> float:
    """Fraction of examples whose prediction (label, answer text, tag sequence) equals fp32's."""
    same = [_key(candidate.predictions.get(i)) == _key(p) for i, p in reference.predictions.items()]
    return float(np.mean(same)) if same else 1.0


def _key(prediction: Any) -> Any:
    if isinstance(prediction, dict):  # classify: {label, score}; qa agreement: {answer, start, end}
        return prediction.get("label", (prediction.get("start"), prediction.get("end")))
    return prediction


def _judge_eval_set(task: str, reference: Scored, candidate: Scored) -> ParityResult:
    count = len(reference.predictions)
    agreement = prediction_agreement(reference, candidate)
    if task == "classify":
        accuracy = {"accuracy_fp32": reference.metrics["accuracy"], "accuracy": candidate.metrics["accuracy"]}
        return _judge_labels(reference, candidate, accuracy)
    ref_f1, f1 = float(reference.metrics["f1"]), float(candidate.metrics["f1"])
    metric = "SQuAD F1" if task == "qa" else "entity F1 (seqeval)"
    figures: dict[str, Any] = {
        "metric": "squad_f1" if task == "qa" else "entity_f1",
        "f1_fp32": ref_f1,
        "f1": f1,
        "f1_delta": f1 - ref_f1,
        "threshold": -F1_POINTS,
        "prediction_agreement": agreement,
        "examples": count,
    }
    if task == "qa":
        figures.update(exact_match_fp32=reference.metrics["exact_match"], exact_match=candidate.metrics["exact_match"])
    unit = "questions" if task == "qa" else "sentences"
    message = f"{metric} {f1:.2f} vs PyTorch fp32 {ref_f1:.2f} on {count} {unit} (may drop at most {F1_POINTS:g} point)"
    return ParityResult(bool(f1 - ref_f1 >= -F1_POINTS), figures, message)


def _judge_labels(reference: Scored, candidate: Scored, extra: dict[str, Any]) -> ParityResult:
    agreement = prediction_agreement(reference, candidate)
    figures = {"label_agreement": agreement, "threshold": TASK_AGREEMENT, "examples": len(reference.predictions)}
    figures.update(extra)
    message = f"label_agreement {agreement:.4g} vs PyTorch fp32 (needs >= {TASK_AGREEMENT:g})"
    return ParityResult(agreement >= TASK_AGREEMENT, figures, message)


def _judge_answers(reference: Scored, candidate: Scored) -> ParityResult:
    """qa without gold answers: SQuAD F1 of the variant's answers with fp32's answers as the references."""
    scores = [
        token_f1(_text(candidate.predictions.get(i)), _text(answer)) for i, answer in reference.predictions.items()
    ]
    f1 = 100.0 * float(np.mean(scores)) if scores else 100.0
    agreement = {"span_agreement": prediction_agreement(reference, candidate)}
    return _f1_vs_fp32("answer", "answers", f1, agreement, len(scores), "questions")


def _text(prediction: Any) -> str:
    return str(prediction.get("answer", "")) if isinstance(prediction, dict) else str(prediction or "")


def _judge_entities(reference: Scored, candidate: Scored) -> ParityResult:
    """ner without gold tags: seqeval entity F1 of the variant's word tags with fp32's tags as the references."""
    indices = sorted(reference.predictions)
    gold = [reference.predictions[i] for i in indices]
    predicted = [candidate.predictions.get(i, ["O"] * len(reference.predictions[i])) for i in indices]
    f1 = entity_f1(gold, predicted)
    agreement = {"sentence_agreement": prediction_agreement(reference, candidate)}
    return _f1_vs_fp32("entity", "entities", f1, agreement, len(indices), "texts")


def _f1_vs_fp32(
    kind: str, references: str, f1: float, agreement: dict[str, float], examples: int, unit: str
) -> ParityResult:
    """The verdict of an F1 whose references are PyTorch fp32's own answers / entities: within F1_POINTS of 100,
    with the figures recorded in the manifest."""
    threshold = 100.0 - F1_POINTS
    figures = {f"{kind}_f1_vs_fp32": f1, **agreement, "threshold": threshold, "examples": examples}
    message = f"{kind} F1 vs PyTorch fp32's {references} {f1:.2f} on {examples} {unit} (needs >= {threshold:g})"
    return ParityResult(f1 >= threshold, figures, message)


def entity_f1(references: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> float:
    """seqeval's entity F1 (percent); 100 when neither side has any entity (nothing to disagree on)."""
    if not any(t != "O" for tags in [*references, *predictions] for t in tags):
        return 100.0
    return float(ner_metrics(references, predictions)["f1"])


def _judge_embeddings(reference: Scored, candidate: Scored) -> ParityResult:
    """Sentence vectors: cosines to fp32's (mean and minimum); retrieval agreement when both retrieved."""
    cosines = np.array([_cosine(a, candidate.predictions[i]) for i, a in reference.predictions.items()])
    mean, worst = (float(cosines.mean()), float(cosines.min())) if cosines.size else (1.0, 1.0)
    figures: dict[str, Any] = {
        "cosine_mean": mean,
        "cosine_min": worst,
        "threshold_mean": COSINE_MEAN,
        "threshold_min": COSINE_MIN,
        "examples": int(cosines.size),
    }
    passed = mean >= COSINE_MEAN and worst >= COSINE_MIN
    message = f"cosine to PyTorch fp32 mean {mean:.5f} (needs >= {COSINE_MEAN:g}), min {worst:.5f} (>= {COSINE_MIN:g})"
    if "retrieved" in reference.metrics:
        ours, theirs = np.asarray(reference.metrics["retrieved"]), np.asarray(candidate.metrics["retrieved"])
        agreement = float(np.mean(ours == theirs))
        figures.update(
            retrieval_top1_agreement=agreement,
            retrieval_threshold=RETRIEVAL_AGREEMENT,
            retrieval_top1_accuracy=candidate.metrics["retrieval_top1_accuracy"],
            retrieval_top1_accuracy_fp32=reference.metrics["retrieval_top1_accuracy"],
            retrieval_questions=int(ours.size),
        )
        passed = passed and agreement >= RETRIEVAL_AGREEMENT
        message += f", retrieval top-1 agreement {agreement:.4f} (>= {RETRIEVAL_AGREEMENT:g})"
    return ParityResult(passed, figures, message)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a64 @ b64 / max(float(np.linalg.norm(a64) * np.linalg.norm(b64)), 1e-30))


def _judge_top_tokens(reference: Scored, candidate: Scored) -> ParityResult:
    """Fill-mask: per masked position, fp32's top-5 token ids against the variant's."""
    pairs = [(best, candidate.predictions[i]) for i, best in reference.predictions.items()]
    top1 = float(np.mean([a[0] == b[0] for a, b in pairs])) if pairs else 1.0
    overlap = float(np.mean([len(set(a) & set(b)) / len(a) for a, b in pairs])) if pairs else 1.0
    figures: dict[str, Any] = {
        "top1_agreement": top1,
        "top5_overlap": overlap,
        "top5_same_set": float(np.mean([set(a) == set(b) for a, b in pairs])) if pairs else 1.0,
        "threshold_top1": TOP1_AGREEMENT,
        "threshold_top5": TOP5_OVERLAP,
        "masked_positions": len(pairs),
    }
    figures.update(_both_metrics(reference, candidate))
    passed = top1 >= TOP1_AGREEMENT and overlap >= TOP5_OVERLAP
    message = (
        f"masked positions: top-1 agreement {top1:.4f} with PyTorch fp32 (needs >= {TOP1_AGREEMENT:g}), "
        f"top-5 overlap {overlap:.4f} (>= {TOP5_OVERLAP:g})"
    )
    return ParityResult(passed, figures, message)


# ---- score heads: rank agreement ----------------------------------------------------------------------------
def judge_rankings(reference: Scored, candidate: Scored) -> ParityResult:
    """Score heads: per candidate list (predictions: list index -> its candidates' scores), the same best candidate
    as fp32 and Spearman's rho of the scores; the largest |score difference| and the metrics of both (recall@1 when
    the relevant candidates are known) are recorded."""
    top1, rhos, worst, candidates = [], [], 0.0, 0
    for index, expected in reference.predictions.items():
        ours = np.asarray(expected, dtype=np.float64).reshape(-1)
        theirs = np.asarray(candidate.predictions[index], dtype=np.float64).reshape(-1)
        top1.append(int(np.argmax(ours)) == int(np.argmax(theirs)))
        rhos.append(spearman(ours, theirs))
        worst = max(worst, float(np.abs(ours - theirs).max(initial=0.0)))
        candidates += ours.size
    agreement = float(np.mean(top1)) if top1 else 1.0
    mean_rho, min_rho = (float(np.mean(rhos)), float(np.min(rhos))) if rhos else (1.0, 1.0)
    figures: dict[str, Any] = {
        "top1_agreement": agreement,
        "spearman_mean": mean_rho,
        "spearman_min": min_rho,
        "max_abs_score_diff": worst,
        "threshold_top1": RANK_TOP1_AGREEMENT,
        "threshold_spearman": RANK_SPEARMAN_MEAN,
        "lists": len(top1),
        "candidates": candidates,
    }
    figures.update(_both_metrics(reference, candidate))
    passed = agreement >= RANK_TOP1_AGREEMENT and mean_rho >= RANK_SPEARMAN_MEAN
    message = (
        f"candidate lists: top-1 agreement {agreement:.4f} with PyTorch fp32 (needs >= {RANK_TOP1_AGREEMENT:g}), "
        f"mean Spearman {mean_rho:.4f} (>= {RANK_SPEARMAN_MEAN:g}), max |score diff| {worst:.3g}"
    )
    return ParityResult(passed, figures, message)


def _both_metrics(reference: Scored, candidate: Scored) -> dict[str, float]:
    """The task metrics of the candidate and, suffixed `_fp32`, of the PyTorch reference, for a judgment's figures."""
    ours = {k: v for k, v in candidate.metrics.items() if isinstance(v, float)}
    return ours | {f"{k}_fp32": v for k, v in reference.metrics.items() if isinstance(v, float)}


def spearman(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Spearman's rank correlation of two score vectors (ties share their mean rank); 1 when both are constant (the
    same order: none), 0 when only one is, and 1 for a single candidate."""
    from scipy.stats import spearmanr

    if reference.size < 2:
        return 1.0
    flat = [bool(np.all(values == values[0])) for values in (reference, candidate)]
    if any(flat):
        return 1.0 if all(flat) else 0.0
    return float(spearmanr(reference, candidate).statistic)
