"""Torch-free task logic (numpy + tokenizers only), shared by fine-tuning evaluation and the service.

Every task has the same two steps, so a serving batcher can mix the rows of many requests in one batch:

    build_*_features(tokenizer, inputs, ...) -> [Feature]          one or more rows per input, each with
                                                                    `request_index` = the input's position
    collate(features, pad_id)                -> {input_ids, attention_mask, token_type_ids} (B, S) int64
    *_postprocess(features, outputs, ...)    -> {request_index: result}   output rows in feature order,
                                                                    padded or not

- classification (`classification`): texts / text pairs -> `[{label, score}]`, best first;
- extractive QA (`qa`): SQuAD windows, n-best span decoding -> `[{answer, score, start, end}]` with
  `answer == context[start:end]`; SQuAD 2.0 no-answer by threshold;
- NER (`ner`): label alignment for training, windows, entity grouping (none/simple/first/average/max)
  -> `[{entity_group, score, word, start, end}]` with `word == text[start:end]`;
- data readers (`readers`) and metrics (`metrics`, seqeval imported lazily); the serving-bundle contract
  (`spec`). Nothing under this package may import torch: the serving image has none, and a test enforces it.
"""

from bert_model.tasks.classification import (
    ClassificationFeature,
    LabelScore,
    build_classification_features,
    classification_postprocess,
    classification_scores,
    default_score_function,
    predicted_label_ids,
)
from bert_model.tasks.defaults import AGGREGATION_STRATEGIES
from bert_model.tasks.features import Feature, collate
from bert_model.tasks.ner import (
    Entity,
    NERFeature,
    align_labels,
    bio_labels,
    build_ner_features,
    build_ner_word_features,
    iob1_to_iob2,
    ner_postprocess,
    ner_token_predictions,
    ner_word_predictions,
)
from bert_model.tasks.numeric import log_softmax, sigmoid, softmax, top_k
from bert_model.tasks.qa import (
    Answer,
    QAFeature,
    QAPrediction,
    QASettings,
    answer_token_positions,
    build_qa_features,
    qa_postprocess,
    qa_predictions,
)

__all__ = [
    "AGGREGATION_STRATEGIES",
    "Answer",
    "ClassificationFeature",
    "Entity",
    "Feature",
    "LabelScore",
    "NERFeature",
    "QAFeature",
    "QAPrediction",
    "QASettings",
    "align_labels",
    "answer_token_positions",
    "bio_labels",
    "build_classification_features",
    "build_ner_features",
    "build_ner_word_features",
    "build_qa_features",
    "classification_postprocess",
    "classification_scores",
    "collate",
    "default_score_function",
    "iob1_to_iob2",
    "log_softmax",
    "ner_postprocess",
    "ner_token_predictions",
    "ner_word_predictions",
    "predicted_label_ids",
    "qa_postprocess",
    "qa_predictions",
    "sigmoid",
    "softmax",
    "top_k",
]
