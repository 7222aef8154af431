"""Evaluation metrics: classification accuracy / F1, SQuAD exact match / F1, entity-level NER scores.

- SQuAD (Rajpurkar et al. 2016, section 6; 2018 for 2.0): answers are normalised (lower-case, punctuation
  removed, the articles a/an/the removed, whitespace collapsed); exact match and bag-of-tokens F1 take the
  maximum over the reference answers and are averaged over questions. An unanswerable question's only
  reference is the empty answer. Written from that definition, not copied from the official script.
- NER: entity-level micro precision / recall / F1 over exact (type, span) matches, computed by `seqeval`
  (Nakayama 2018) in its default, conlleval-compatible mode, after converting both sides to IOB2. seqeval is
  imported inside the function: the service never computes metrics and does not install it.

All scores are percentages (0-100). Torch-free.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bert_model.tasks.ner import iob1_to_iob2

if TYPE_CHECKING:
    from bert_model.tasks.readers import SquadExample

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


# ---- classification ------------------------------------------------------------------------------------
def classification_metrics(
    predictions: Sequence[str], references: Sequence[str], labels: Sequence[str] | None = None
) -> dict[str, float]:
    """Accuracy; with exactly two `labels`, also F1 of the second one (the positive class, GLUE's habit)."""
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    if not references:
        raise ValueError("cannot score an empty data set")
    correct = sum(p == r for p, r in zip(predictions, references, strict=True))
    metrics = {"accuracy": 100.0 * correct / len(references), "total": float(len(references))}
    if labels is not None and len(labels) == 2:
        metrics["f1"] = binary_f1(predictions, references, positive=labels[1])
    return metrics


def binary_f1(predictions: Sequence[str], references: Sequence[str], positive: str) -> float:
    """F1 of the `positive` class (0 when it is never predicted nor present)."""
    tp = sum(p == positive and r == positive for p, r in zip(predictions, references, strict=True))
    fp = sum(p == positive and r != positive for p, r in zip(predictions, references, strict=True))
    fn = sum(p != positive and r == positive for p, r in zip(predictions, references, strict=True))
    return 100.0 * 2 * tp / (2 * tp + fp + fn) if tp else 0.0


# ---- SQuAD ---------------------------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """F1 between the bags of normalised tokens (1.0 if both are empty, 0.0 if only one is)."""
    predicted = normalize_answer(prediction).split()
    gold = normalize_answer(reference).split()
    if not predicted or not gold:
        return float(predicted == gold)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def best_scores(prediction: str, references: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of a prediction: the maximum over the references ("" if there are none)."""
    golds = [r for r in references if normalize_answer(r)] or [""]
    return max(exact_match(prediction, g) for g in golds), max(token_f1(prediction, g) for g in golds)


def squad_metrics(predictions: Mapping[str, str], examples: Sequence[SquadExample]) -> dict[str, float]:
    """Exact match and F1 (percent) over `examples`; a missing prediction scores 0.

    With SQuAD 2.0 data (any unanswerable question) the HasAns_* / NoAns_* breakdown is added.
    """
    if not examples:
        raise ValueError("cannot score an empty data set")
    scores = {
        e.id: best_scores(predictions[e.id], [a.text for a in e.answers]) if e.id in predictions else (0.0, 0.0)
        for e in examples
    }
    metrics = _averages("", [scores[e.id] for e in examples])
    metrics["missing"] = float(sum(e.id not in predictions for e in examples))
    if any(e.is_impossible or not e.answers for e in examples):
        has = [scores[e.id] for e in examples if e.answers]
        none = [scores[e.id] for e in examples if not e.answers]
        metrics.update(_averages("HasAns_", has))
        metrics.update(_averages("NoAns_", none))
    return metrics


def _averages(prefix: str, scores: Sequence[tuple[float, float]]) -> dict[str, float]:
    count = len(scores)
    em = 100.0 * sum(s[0] for s in scores) / count if count else 0.0
    f1 = 100.0 * sum(s[1] for s in scores) / count if count else 0.0
    return {f"{prefix}exact_match": em, f"{prefix}f1": f1, f"{prefix}total": float(count)}


def best_null_threshold(
    examples: Sequence[SquadExample], best_spans: Mapping[str, str], null_score_diffs: Mapping[str, float]
) -> tuple[float, float]:
    """The no-answer threshold that maximises F1 on `examples`, and that F1 (percent).

    A question is answered "" when its null_score_diff exceeds the threshold (SQuAD 2.0, Devlin et al. 4.3).
    """
    if not examples:
        raise ValueError("cannot tune a threshold on an empty data set")
    gains = []  # (diff, F1 change when this question switches from its span to no answer)
    total = 0.0
    for e in examples:
        references = [a.text for a in e.answers]
        span_f1 = best_scores(best_spans.get(e.id, ""), references)[1]
        total += span_f1
        gains.append((null_score_diffs.get(e.id, float("inf")), best_scores("", references)[1] - span_f1))
    gains.sort(key=lambda item: -item[0])
    # Lowering the threshold below each diff in turn switches the questions one by one to no answer.
    best_total, best_threshold, running = total, min(gains[0][0], 1e9), total
    for k, (diff, gain) in enumerate(gains):
        running += gain
        next_diff = gains[k + 1][0] if k + 1 < len(gains) else diff - 1.0
        if next_diff < diff and running > best_total:
            best_total, best_threshold = running, next_diff
    return float(best_threshold), 100.0 * best_total / len(examples)


# ---- NER -----------------------------------------------------------------------------------------------
def ner_metrics(references: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Entity-level micro precision / recall / F1 (percent) and per-type figures, via seqeval.

    Either side may be IOB1 or IOB2: both are converted to IOB2 first.
    """
    from seqeval.metrics import classification_report  # local import: training-side dependency only

    if len(references) != len(predictions):
        raise ValueError(f"got {len(predictions)} predicted sentences for {len(references)} references")
    if not references:
        raise ValueError("cannot score an empty data set")
    for index, (gold, predicted) in enumerate(zip(references, predictions, strict=True)):
        if len(gold) != len(predicted):
            raise ValueError(f"sentence {index}: {len(predicted)} predicted tags for {len(gold)} words")
    gold_tags = [iob1_to_iob2(tags) for tags in references]
    predicted_tags = [iob1_to_iob2(tags) for tags in predictions]
    report = classification_report(gold_tags, predicted_tags, output_dict=True, zero_division=0)
    micro = report.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0})
    per_type = {
        name: {"precision": 100.0 * v["precision"], "recall": 100.0 * v["recall"], "f1": 100.0 * v["f1-score"]}
        for name, v in report.items()
        if not name.endswith(" avg")
    }
    return {
        "precision": 100.0 * micro["precision"],
        "recall": 100.0 * micro["recall"],
        "f1": 100.0 * micro["f1-score"],
        "entities": float(micro["support"]),
        "per_type": per_type,
    }
