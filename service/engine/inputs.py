"""The task inputs both front doors build (`http_api` from REST bodies, `grpc_api` from protobuf messages) and
`InferenceService` runs through a model's pipeline (`service.engine.pipelines`).

Their defaults are the API's defaults (the REST schemas read them, gRPC leaves unset fields to them). `truncate`
None means the server's default: InferenceService fills in `settings.truncate` before a pipeline sees it (a
pipeline used on its own truncates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bert_model.tasks.classification import ScoreFunction
from service.errors import InvalidInput


@dataclass
class ClassifyInput:
    texts: list[str]
    pairs: list[str] | None = None
    top_k: int | None = 1
    """Labels per input (None = all)."""
    truncate: bool | None = None
    function_to_apply: ScoreFunction | None = None
    """softmax, sigmoid or none (the raw logits); None = the model's default (`default_score_function`)."""

    @classmethod
    def from_items(cls, items: Sequence[tuple[str, str | None]], **options: Any) -> ClassifyInput:
        """From (text, text_pair or None) items, all single texts or all pairs; `options` are the other fields."""
        paired = [pair is not None for _, pair in items]
        if any(paired) and not all(paired):
            raise InvalidInput("inputs mix single texts and text pairs; send one kind per request")
        pairs = [pair or "" for _, pair in items] if any(paired) else None
        return cls(texts=[text for text, _ in items], pairs=pairs, **options)


@dataclass
class QAInput:
    questions: list[str]
    contexts: list[str]
    top_k: int = 1
    max_answer_len: int | None = None
    """None: the model's (manifest task_settings), else `service.engine.windows.QA_DEFAULT_MAX_ANSWER_LEN`."""
    handle_impossible_answer: bool = False
    doc_stride: int | None = None
    truncate: bool | None = None


@dataclass
class NERInput:
    texts: list[str]
    aggregation_strategy: str = "simple"
    truncate: bool | None = None


@dataclass
class EmbedInput:
    texts: list[str]
    normalize: bool | None = None
    """L2-normalize the vectors; None = the model's setting (manifest task_settings `normalize`, else true)."""
    dimensions: int | None = None
    """Keep the first `dimensions` components and renormalize (OpenAI's `dimensions`); None = all."""
    truncate: bool | None = None


@dataclass
class FillMaskInput:
    texts: list[str]
    top_k: int = 5
    targets: list[str] | None = None
    """Score only these tokens (each one vocabulary entry); None = the whole vocabulary."""
    truncate: bool | None = None


TaskInput = ClassifyInput | QAInput | NERInput | EmbedInput | FillMaskInput
