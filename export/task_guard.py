"""The accuracy guard's examples, and how any model's outputs on them become predictions: `bertserve evaluate`'s logic.

A `TaskGuard` holds the model batches that PyTorch fp32 and every variant run on, and decodes outputs into
predictions (and metrics) with the code behind `bertserve evaluate`: the fine-tuning recipes of
`bert_model.finetuning` over the torch-free task logic of `bert_model.tasks`, which the service calls too. So
export, evaluation and serving cannot disagree on what an answer is:

- qa: every `doc_stride` window of a question; spans of all windows compete on log-probability (n-best); SQuAD
  exact match / F1 against the gold answers (normalised text, best over the references: Rajpurkar et al. 2016);
- ner: one label per word, read at its first word piece, windows merged; entity F1 with seqeval (conlleval rules);
- classify: the arg-max label (accuracy against the gold labels).
The encoder's own tasks (embed, fill-mask) build theirs in export/encoder_guards.py on this module's `TaskGuard`.

Where the examples come from (the first that applies), and which judgment of export/parity.py follows:
1. `eval_data`, a path: a SQuAD JSON (qa), a CoNLL file (ner) or a labelled TSV / CSV / JSONL (classify): `eval-set`;
2. `calibration`, a path: one text (or tab-separated pair) per line: `agreement-with-fp32`;
3. the task's real data file under `data_dir` (export/guard_data.py): `eval-set`; or, when the model cannot score
   it (tags or labels it does not know), `agreement-with-fp32` on the file's texts;
4. built-in sentences: `agreement-with-fp32`.
At most `limit` examples, evenly spaced over the file exactly as `bertserve evaluate --limit` picks them, so the
guard's PyTorch fp32 figures are `evaluate`'s. Window and decoding settings are the model's own (`bertserve.task`
in its config.json, read as `evaluate` reads them), shrunk to fit the bundle's max_seq_length; the window and
decoding ones the service uses go into the manifest's `task_settings` (`served_task_settings`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.config import BertConfig
from bert_model.finetuning.batching import inference_batches
from bert_model.finetuning.options import ClassifyOptions, NEROptions, QAOptions
from bert_model.finetuning.recipe import subset
from bert_model.finetuning.recipes import default_options, make_recipe, stored_settings
from bert_model.tasks.classification import build_classification_features
from bert_model.tasks.features import Feature, collate
from bert_model.tasks.ner import build_ner_features, ner_word_predictions
from bert_model.tasks.qa import build_qa_features, qa_predictions
from bert_model.tasks.windows import NER_SPECIAL_TOKENS, QA_SPECIAL_TOKENS, fit_ner_window, fit_qa_window
from bert_model.tokenization import BertTokenizer
from export.guard_data import default_eval_file, read_texts
from export.parity import AGREEMENT, EVAL_SET, Outputs, ParityResult, Scored, judge_task

logger = logging.getLogger(__name__)

Rows = dict[str, list[np.ndarray]]
"""Per output name, one row per feature (in feature order), without padding."""
SEQUENCE_OUTPUTS = ("start_logits", "end_logits")
DEFAULT_GUARD_LIMIT = 1000
"""Examples judged by default: a 1-point F1 guard needs hundreds of questions (one weighs 100 / N F1 points), and
a thousand still keep an export short (docs/export.md, "Accuracy guards", has the measurements)."""
TaskOptions = ClassifyOptions | QAOptions | NEROptions


@dataclass
class GuardOptions:
    """Which examples the task-level guard judges on (see the module docstring for the order)."""

    eval_data: Path | None = None
    """Labelled eval set (SQuAD JSON, CoNLL file, labelled TSV/CSV/JSONL): F1 / labels against the gold answers."""
    calibration: Path | None = None
    """Text file, one input per line (question<TAB>context for qa): agreement with PyTorch fp32's predictions."""
    data_dir: Path | None = None
    """Folder of the real data sets; its file for the task is the default eval set."""
    limit: int = DEFAULT_GUARD_LIMIT
    """At most this many examples (questions, sentences, texts), evenly spaced over the file."""
    batch_size: int = 32
    """Features per model batch (batches are grouped by length, as `evaluate` does)."""

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"the guard's example limit must be a positive integer, got {self.limit!r}")
        if self.eval_data is not None and self.calibration is not None:
            raise ValueError("give either an eval set (--eval-data) or calibration texts (--calibration), not both")
        for name in ("eval_data", "calibration"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"{name.replace('_', ' ')} file {path} does not exist")


@dataclass
class TaskGuard:
    """The guard's model batches and the decoding of any model's outputs on them."""

    task: str
    judgment: str
    """EVAL_SET or AGREEMENT (export/parity.py)."""
    source: str
    features: list[Feature]
    order: list[list[int]]
    """Feature indices of each model batch."""
    feeds: list[dict[str, np.ndarray]]
    """The model batches: int64 input_ids / attention_mask / token_type_ids, padded to their longest feature."""
    decode: Callable[[Rows], Scored]
    examples: int
    settings: dict[str, Any]
    note: str = ""
    trim: Callable[[dict[str, np.ndarray], int], dict[str, np.ndarray]] | None = None
    """What of a batch's outputs (and the batch's index) the guard keeps, when not all of it: the rows it keeps
    are then `decode`'s rows, batch after batch (fill-mask keeps the logits of masked positions only)."""

    def keep(self, output: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        """The part of batch `batch`'s outputs that judging needs (all of it unless `trim` says otherwise)."""
        return output if self.trim is None else self.trim(output, batch)

    def score(self, outputs: Outputs) -> Scored:
        """Predictions (and metrics) of a model from its outputs on `feeds` (as `keep` left them)."""
        if self.trim is not None:
            return self.decode({name: [row for output in outputs for row in output[name]] for name in outputs[0]})
        return self.decode(feature_rows(self.features, self.order, outputs))

    def judge(self, reference: Scored, candidate: Scored) -> ParityResult:
        return judge_task(self.task, self.judgment, reference, candidate)

    def describe(self, reference: Scored) -> dict[str, Any]:
        """The manifest's record of the guard inputs, with PyTorch fp32's own figures on them."""
        info: dict[str, Any] = {
            "source": self.source,
            "judgment": self.judgment,
            "count": self.examples,
            "features": len(self.features),
            "settings": self.settings,
        }
        figures = {k: v for k, v in reference.metrics.items() if isinstance(v, int | float)}
        if figures:
            info["pytorch_fp32"] = figures
        if self.note:
            info["note"] = self.note
        return info


def build_guard(
    task: str, config: BertConfig, tokenizer: BertTokenizer, max_len: int, options: GuardOptions
) -> TaskGuard:
    """The guard examples of a `task` model (its `config` carries labels and stored task settings)."""
    if task not in SCORED_TASKS:
        raise ValueError(f"the {task} guard is built by export.encoder_guards, not from task labels")
    fitted = task_options(task, config, max_len, tokenizer)
    if options.eval_data is not None:
        return eval_set_guard(task, config, tokenizer, fitted, Path(options.eval_data), options)
    note = ""
    default = default_eval_file(task, options.data_dir) if options.calibration is None else None
    if default is not None:
        try:
            return eval_set_guard(task, config, tokenizer, fitted, default, options)
        except ValueError as error:
            note = f"{default} cannot be scored by this model ({error}); its texts are judged by agreement with fp32"
            logger.warning(note)
    rows, source = read_texts(task, options.data_dir, options.calibration, options.limit)
    guard = agreement_guard(task, config, tokenizer, fitted, rows, source, options.batch_size)
    guard.note = note
    return guard


SCORED_TASKS = ("classify", "qa", "ner")
"""The tasks whose guard decodes with `bertserve evaluate`'s recipes (a fine-tuned head and its labels)."""


def task_options(task: str, config: BertConfig, max_len: int, tokenizer: BertTokenizer | None = None) -> TaskOptions:
    """The model's stored task settings (as `bertserve evaluate` reads them), shrunk to `max_len` tokens around
    the special tokens of `tokenizer`'s template (BERT's when None)."""
    return fit_options(default_options(task, stored_settings(config)), max_len, tokenizer)


SERVED_SETTINGS: dict[str, tuple[str, ...]] = {
    "qa": ("max_seq_length", "doc_stride", "max_query_length", "max_answer_length"),
    "ner": ("max_seq_length", "stride"),
}
"""Per task, the window and decoding settings the service reads from the manifest (`task_settings`)."""
QA_NULL_SETTINGS = ("version_2", "null_threshold")


def served_task_settings(
    task: str, config: BertConfig, max_len: int, tokenizer: BertTokenizer | None = None
) -> dict[str, Any]:
    """The manifest's `task_settings`: the model's stored settings that the service uses, fitted to `max_len`
    exactly as the guard's (so export, evaluate and serving read the same windows); {} for a model without
    stored settings (a base model with a fresh head), which the service serves with its own defaults.
    A classifier's are its config's `problem_type` when stated (multi-label, regression): it decides how the
    service turns logits into scores (`bert_model.tasks.classification.default_score_function`)."""
    if task == "classify":
        return {} if config.problem_type is None else {"problem_type": config.problem_type}
    stored = stored_settings(config)
    if task not in SERVED_SETTINGS or not stored:
        return {}
    fitted = asdict(task_options(task, config, max_len, tokenizer))
    settings = {name: fitted[name] for name in SERVED_SETTINGS[task]}
    if task == "qa":
        settings.update({name: stored[name] for name in QA_NULL_SETTINGS if name in stored})
    return settings


def fit_options(options: TaskOptions, max_len: int, tokenizer: BertTokenizer | None = None) -> TaskOptions:
    """`options` with windows of at most `max_len` tokens, fitted by `bert_model.tasks.windows` as the service
    fits the manifest's settings (around `tokenizer`'s special tokens; BERT's when None)."""
    pair = tokenizer.template.pair_specials if tokenizer is not None else QA_SPECIAL_TOKENS
    single = tokenizer.template.single_specials if tokenizer is not None else NER_SPECIAL_TOKENS
    if isinstance(options, QAOptions):
        window = fit_qa_window(max_len, options.max_query_length, options.doc_stride, options.max_seq_length, pair)
        return replace(options, **window._asdict())
    if isinstance(options, NEROptions):
        ner_window = fit_ner_window(max_len, options.stride, options.max_seq_length, single)
        return replace(options, **ner_window._asdict())
    return replace(options, max_seq_length=min(options.max_seq_length, max_len))


def eval_set_guard(
    task: str, config: BertConfig, tokenizer: BertTokenizer, fitted: TaskOptions, path: Path, options: GuardOptions
) -> TaskGuard:
    """Judgment `eval-set`: `bertserve evaluate`'s recipe reads, windows, decodes and scores the labelled file."""
    recipe = make_recipe(task, tokenizer, fitted, config)
    eval_set = recipe.load_eval(path)
    indices = subset(len(eval_set.examples), options.limit)
    wanted = set(indices)
    features = [f for f in eval_set.features if f.request_index in wanted]

    def decode(rows: Rows) -> Scored:
        outcome = recipe.score(eval_set, indices, rows, features)
        return Scored(outcome.predictions, outcome.metrics)

    order, feeds = batches(features, tokenizer.pad_id, options.batch_size)
    settings = {k: v for k, v in recipe.settings().items() if k != "name"}
    return TaskGuard(task, EVAL_SET, str(path), features, order, feeds, decode, len(indices), settings)


def agreement_guard(
    task: str,
    config: BertConfig,
    tokenizer: BertTokenizer,
    fitted: TaskOptions,
    rows: list[tuple[str, ...]],
    source: str,
    batch_size: int,
) -> TaskGuard:
    """Judgment `agreement-with-fp32`: texts without labels, decoded with the service's task functions."""
    labels = [config.id2label[i] for i in sorted(config.id2label)]
    if isinstance(fitted, QAOptions):
        features, decode = _qa_answers(tokenizer, fitted, rows, source)
    elif isinstance(fitted, NEROptions):
        features, decode = _ner_tags(tokenizer, fitted, rows, labels)
    else:
        features, decode = _classify_labels(tokenizer, fitted, rows, labels)
    order, feeds = batches(features, tokenizer.pad_id, batch_size)
    settings = {k: v for k, v in asdict(fitted).items() if k in _WINDOW_SETTINGS}
    return TaskGuard(task, AGREEMENT, source, features, order, feeds, decode, len(rows), settings)


_WINDOW_SETTINGS = ("max_seq_length", "doc_stride", "max_query_length", "max_answer_length", "stride")
FeaturesAndDecode = tuple[list[Feature], Callable[[Rows], Scored]]
"""The guard's features, and the function that turns a model's rows on them into predictions."""


def _qa_answers(
    tokenizer: BertTokenizer, fitted: QAOptions, rows: list[tuple[str, ...]], source: str
) -> FeaturesAndDecode:
    if any(len(row) < 2 for row in rows):
        raise ValueError(f"{source}: qa guard inputs need a question and a context on each line, separated by a tab")
    features = build_qa_features(
        tokenizer,
        [row[0] for row in rows],
        [row[1] for row in rows],
        max_seq_length=fitted.max_seq_length,
        doc_stride=fitted.doc_stride,
        max_query_length=fitted.max_query_length,
    )

    def decode(outputs: Rows) -> Scored:
        start, end = outputs["start_logits"], outputs["end_logits"]
        decoded = qa_predictions(features, start, end, max_answer_length=fitted.max_answer_length)
        no_answer = {"answer": "", "start": 0, "end": 0}
        return Scored({i: p.candidates[0] if p.candidates else no_answer for i, p in decoded.items()})

    return list(features), decode


def _ner_tags(
    tokenizer: BertTokenizer, fitted: NEROptions, rows: list[tuple[str, ...]], labels: list[str]
) -> FeaturesAndDecode:
    texts = [row[0] for row in rows]
    features = build_ner_features(tokenizer, texts, max_seq_length=fitted.max_seq_length, stride=fitted.stride)

    def decode(outputs: Rows) -> Scored:
        return Scored(dict(ner_word_predictions(features, outputs["logits"], labels)))

    return list(features), decode


def _classify_labels(
    tokenizer: BertTokenizer, fitted: TaskOptions, rows: list[tuple[str, ...]], labels: list[str]
) -> FeaturesAndDecode:
    pairs = [row[1] for row in rows] if rows and all(len(row) > 1 for row in rows) else None
    texts = [row[0] for row in rows]
    features = build_classification_features(tokenizer, texts, pairs, max_seq_length=fitted.max_seq_length)

    def decode(outputs: Rows) -> Scored:
        best = [int(np.argmax(row)) for row in outputs["logits"]]
        return Scored({f.request_index: {"label": labels[b]} for f, b in zip(features, best, strict=True)})

    return list(features), decode


def batches(
    features: Sequence[Feature], pad_id: int, batch_size: int
) -> tuple[list[list[int]], list[dict[str, np.ndarray]]]:
    """Length-grouped batches of feature indices (as `evaluate` batches), and their padded int64 inputs."""
    if not features:
        raise ValueError("the accuracy guard has no inputs")
    order = inference_batches([len(f) for f in features], batch_size)
    return order, [collate([features[i] for i in batch], pad_id) for batch in order]


def feature_rows(features: Sequence[Feature], order: list[list[int]], outputs: Outputs) -> Rows:
    """Per output name, each feature's row (per-token outputs cut to the feature's length), in feature order."""
    rows: dict[str, list[np.ndarray]] = {}
    for batch, output in zip(order, outputs, strict=True):
        for name, values in output.items():
            column = rows.setdefault(name, [np.empty(0)] * len(features))
            per_token = name in SEQUENCE_OUTPUTS or values.ndim == 3  # (B, S) or (B, S, C); classify is (B, C)
            for position, index in enumerate(batch):
                column[index] = values[position, : len(features[index])] if per_token else values[position]
    return rows
