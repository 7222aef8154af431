"""The task inputs both front doors build (`http_api` from REST bodies, `grpc_api` from protobuf messages) and the
engine runs through a model's pipeline (`service.engine.pipelines`), with the checks every input passes before any
work is done (`check`).

Defaults are the task defaults (`bert_model.tasks.defaults`); the REST schemas and the gRPC mapping read them and
the limits here, so both transports take the same requests and refuse the same ones with the same message.
`truncate` None means the server's default: the engine fills in `settings.truncate` before a pipeline sees it (a
pipeline used on its own truncates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import bert_model.tasks.defaults as defaults
from bert_model.tasks.classification import ScoreFunction
from bert_model.tasks.defaults import AGGREGATION_STRATEGIES
from service.errors import InvalidInput

QA_MAX_TOP_K = 20
"""Most answers per question one request may ask for."""
MAX_ANSWER_LEN = 512
"""Longest answer a request may ask for, in tokens (the longest window a BERT graph takes)."""
MAX_IGNORE_LABELS = 100
"""Most `ignore_labels` one NER request may give (a model has a few labels)."""
FILL_MASK_MAX_TOP_K = 100
"""Most fills per mask one request may ask for (each is a decoded sequence in the response)."""
FILL_MASK_MAX_TARGETS = 1000
"""Most `targets` in one fill-mask request (each is looked up, or tokenized, to find its vocabulary id)."""
FILL_MASK_MAX_TARGET_CHARS = 100
"""Longest fill-mask target in characters: a target is one vocabulary token (the longest of a BERT vocabulary has
about 20), so a longer one is refused before it is tokenized."""


@dataclass(frozen=True)
class Limits:
    """The server's per-request limits (`ServiceSettings.max_inputs_per_request`, `max_text_chars`)."""

    max_inputs: int
    max_text_chars: int
    max_documents: int = 256
    """Most passages one rerank request may rank (each is one model row)."""


@dataclass
class ClassifyInput:
    texts: list[str]
    pairs: list[str] | None = None
    top_k: int | None = defaults.CLASSIFY_TOP_K
    """Labels per input (None = all)."""
    truncate: bool | None = None
    function_to_apply: ScoreFunction | None = None
    """softmax, sigmoid or none (the raw logits); None = the model's default (`default_score_function`)."""

    task: ClassVar[str] = "classify"

    @classmethod
    def from_items(cls, items: Sequence[tuple[str, str | None]], **options: Any) -> ClassifyInput:
        """From (text, text_pair or None) items, all single texts or all pairs; `options` are the other fields."""
        paired = [pair is not None for _, pair in items]
        if any(paired) and not all(paired):
            raise InvalidInput("inputs mix single texts and text pairs; send one kind per request")
        pairs = [pair or "" for _, pair in items] if any(paired) else None
        return cls(texts=[text for text, _ in items], pairs=pairs, **options)

    def check(self, limits: Limits, field: str) -> None:
        check_texts(self.texts, field, limits)
        if self.pairs is not None:
            check_texts(self.pairs, "text_pair", limits)
        if self.top_k is not None and self.top_k < 1:
            raise InvalidInput(f"top_k must be at least 1 (or null for all labels), got {self.top_k}")

    def characters(self) -> int:
        return sum(map(len, self.texts)) + sum(map(len, self.pairs or []))


@dataclass
class QAInput:
    questions: list[str]
    contexts: list[str]
    top_k: int = defaults.QA_TOP_K
    max_answer_len: int | None = None
    """None: the model's (manifest task_settings), else `bert_model.tasks.defaults.QA_MAX_ANSWER_LENGTH`."""
    handle_impossible_answer: bool = False
    doc_stride: int | None = None
    truncate: bool | None = None

    task: ClassVar[str] = "qa"

    def check(self, limits: Limits, field: str) -> None:
        """`field` names the pairs (REST `inputs`); a single pair's fields are `question` and `context`."""
        if not self.questions:
            raise InvalidInput(f"{field}: give at least one question and context")
        check_texts(self.questions, "question", limits)
        check_texts(self.contexts, "context", limits, count=False)
        if not 1 <= self.top_k <= QA_MAX_TOP_K:
            raise InvalidInput(f"top_k must be between 1 and {QA_MAX_TOP_K}, got {self.top_k}")
        if self.max_answer_len is not None and not 1 <= self.max_answer_len <= MAX_ANSWER_LEN:
            raise InvalidInput(
                f"max_answer_len must be between 1 and {MAX_ANSWER_LEN} tokens, got {self.max_answer_len}"
            )
        if self.doc_stride is not None and self.doc_stride < 0:
            raise InvalidInput(f"doc_stride must be >= 0, got {self.doc_stride}")

    def characters(self) -> int:
        return sum(map(len, self.questions)) + sum(map(len, self.contexts))


@dataclass
class NERInput:
    texts: list[str]
    aggregation_strategy: str = defaults.NER_AGGREGATION
    truncate: bool | None = None
    ignore_labels: list[str] | None = None
    """Entity types (with `none`, tags) left out of the answer; None = the outside tag `O` only."""

    task: ClassVar[str] = "ner"

    def check(self, limits: Limits, field: str) -> None:
        check_texts(self.texts, field, limits)
        if self.aggregation_strategy not in AGGREGATION_STRATEGIES:
            raise InvalidInput(
                f"aggregation_strategy must be one of {', '.join(AGGREGATION_STRATEGIES)}, "
                f"got {self.aggregation_strategy!r}"
            )
        labels = self.ignore_labels or []
        if len(labels) > MAX_IGNORE_LABELS or any(not isinstance(x, str) or len(x) > 100 for x in labels):
            raise InvalidInput(
                f"ignore_labels: at most {MAX_IGNORE_LABELS} labels of at most 100 characters each, got {len(labels)}"
            )

    def characters(self) -> int:
        return sum(map(len, self.texts))


@dataclass
class EmbedInput:
    texts: list[str]
    normalize: bool | None = None
    """L2-normalize the vectors; None = the model's setting (manifest task_settings `normalize`, else true)."""
    dimensions: int | None = None
    """Keep the first `dimensions` components and renormalize (OpenAI's `dimensions`); None = all."""
    truncate: bool | None = None

    task: ClassVar[str] = "embed"

    def check(self, limits: Limits, field: str) -> None:
        check_texts(self.texts, field, limits)
        if self.dimensions is not None and self.dimensions < 1:
            raise InvalidInput(f"dimensions must be at least 1, got {self.dimensions}")

    def characters(self) -> int:
        return sum(map(len, self.texts))


@dataclass
class EmbedAllInput:
    """Every token's vector of each text (TEI's `/embed_all`): the embedding model's token states, served by the
    embed models (`task`) whose bundle puts them out."""

    texts: list[str]
    truncate: bool | None = None

    task: ClassVar[str] = "embed"

    def check(self, limits: Limits, field: str) -> None:
        check_texts(self.texts, field, limits)

    def characters(self) -> int:
        return sum(map(len, self.texts))


@dataclass
class FillMaskInput:
    texts: list[str]
    top_k: int = defaults.FILL_MASK_TOP_K
    targets: list[str] | None = None
    """Score only these tokens (each one vocabulary entry); None = the whole vocabulary."""
    truncate: bool | None = None

    task: ClassVar[str] = "fill-mask"

    def check(self, limits: Limits, field: str) -> None:
        check_texts(self.texts, field, limits)
        if not 1 <= self.top_k <= FILL_MASK_MAX_TOP_K:
            raise InvalidInput(f"top_k must be between 1 and {FILL_MASK_MAX_TOP_K}, got {self.top_k}")
        if self.targets is not None:
            _check_targets(self.targets)

    def characters(self) -> int:
        return sum(map(len, self.texts)) + sum(map(len, self.targets or []))


@dataclass
class RerankInput:
    query: str
    texts: list[str]
    """The passages to rank for the query: one model row each."""
    raw_scores: bool = False
    """The head's raw logits instead of the model's activation (sigmoid)."""
    top_n: int | None = None
    """Only the best `top_n` passages (None = all, ranked)."""
    truncate: bool | None = None

    task: ClassVar[str] = "rerank"

    def check(self, limits: Limits, field: str) -> None:
        check_texts([self.query], "query", limits)
        check_texts(self.texts, field, limits, count=False)
        if len(self.texts) > limits.max_documents:
            raise InvalidInput(
                f"{field}: {len(self.texts)} passages in one request, more than the limit of {limits.max_documents} "
                "(the server's max_rerank_documents); split it, or narrow the candidates first"
            )
        if self.top_n is not None and self.top_n < 1:
            raise InvalidInput(f"top_n must be at least 1 (or null for all passages), got {self.top_n}")

    def characters(self) -> int:
        return len(self.query) * len(self.texts) + sum(map(len, self.texts))


TaskInput = ClassifyInput | QAInput | NERInput | EmbedInput | EmbedAllInput | FillMaskInput | RerankInput


def check_texts(texts: list[str], name: str, limits: Limits, *, count: bool = True) -> None:
    """At least one text, at most `limits.max_inputs` (unless `count` is False: QA's contexts go with its
    questions), each a non-blank string of at most `limits.max_text_chars` valid Unicode characters; the
    message names the input (`name[index]`)."""
    if not texts:
        raise InvalidInput(f"{name}: give at least one input")
    if count and len(texts) > limits.max_inputs:
        raise InvalidInput(
            f"{name}: {len(texts)} inputs in one request, more than the limit of {limits.max_inputs}; split it"
        )
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"{name}[{index}] must be a string, got {type(text).__name__}")
        if not text.strip():
            raise InvalidInput(f"{name}[{index}] is empty: send non-blank text")
        if len(text) > limits.max_text_chars:
            raise InvalidInput(
                f"{name}[{index}] has {len(text)} characters, more than the limit of {limits.max_text_chars}; "
                "shorten it"
            )
        if not text.isascii():  # after the length check: this encodes the whole text
            _check_unicode(text, f"{name}[{index}]")


def _check_unicode(text: str, where: str) -> None:
    """A JSON string may escape a lone surrogate (`"\\ud800"`), which is no character and which no tokenizer
    takes: refuse it here, saying where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidInput(
            f"{where} is not valid Unicode text: character {error.start} is a lone surrogate "
            f"({text[error.start]!r}); send UTF-8 text"
        ) from None


def _check_targets(targets: list[str]) -> None:
    if len(targets) > FILL_MASK_MAX_TARGETS:
        raise InvalidInput(
            f"targets: {len(targets)} targets in one request, more than the limit of {FILL_MASK_MAX_TARGETS}; "
            "give fewer (each is one vocabulary token), or leave targets out to score the whole vocabulary"
        )
    for index, target in enumerate(targets):
        if isinstance(target, str) and len(target) > FILL_MASK_MAX_TARGET_CHARS:
            raise InvalidInput(
                f"targets[{index}] has {len(target)} characters, more than the limit of {FILL_MASK_MAX_TARGET_CHARS}; "
                "a target is one vocabulary token"
            )
