"""Glue between requests and the torch-free task logic of `bert_model.tasks` (never re-implemented here).

Each pipeline turns one validated request into features (each remembering its input's index), and the
features' output rows back into one result per input, in the shapes of Hugging Face pipelines:
classify -> `[{label, score}]`, qa -> `[{answer, score, start, end}]`, ner -> `[{entity_group, score, word,
start, end}]`, fill-mask -> per mask `[{score, token, token_str, sequence}]`; embed -> `{embedding, tokens}`
(the vector, and the tokens read, which OpenAI's `usage` counts), or for every token's vector (`EmbedAllInput`)
`{token_embeddings, tokens}` (a (tokens, hidden) float32 array).
Errors of the task layer caused by the input (ValueError) become `InvalidInput`.

The requests are `service.engine.inputs`; QA and NER windows follow the model's own settings
(`bert_model.tasks.windows`).
Classification scores follow the model's `problem_type` (manifest `task_settings`) as Hugging Face's pipeline
does: softmax for single-label heads, sigmoids for multi-label ones (and a single output), the raw values of a
regression head; a request's `function_to_apply` overrides.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from bert_model.tasks.classification import (
    ScoreFunction,
    build_classification_features,
    classification_postprocess,
    default_score_function,
)
from bert_model.tasks.embeddings import POOLING_MODES, embedding_postprocess
from bert_model.tasks.features import Feature
from bert_model.tasks.fill_mask import (
    DEFAULT_MASK_TOKEN,
    build_fill_mask_features,
    fill_mask_postprocess,
    mask_token_id,
    target_ids,
)
from bert_model.tasks.ner import NERInputs, encode_ner_texts, ner_postprocess, ner_window_features
from bert_model.tasks.qa import QAInputs, encode_qa_inputs, qa_postprocess, qa_window_features
from bert_model.tasks.rerank import ACTIVATIONS, build_rerank_features, rerank_postprocess
from bert_model.tasks.windows import ner_windows, qa_windows
from bert_model.tokenization import InputTooLongError
from bundles.serving import ServingBundle
from bundles.spec import MANIFEST_FILE, reexport_command
from service.engine.inputs import (
    ClassifyInput,
    EmbedAllInput,
    EmbedInput,
    FillMaskInput,
    NERInput,
    QAInput,
    RerankInput,
    TaskInput,
)
from service.errors import BackendError, InputTooLong, InvalidInput

WARMUP_TEXTS: tuple[str, ...] = ("warm up the model", "a second, somewhat longer warm-up sentence " * 4)
"""What the single-text pipelines run at load: a short and a longer text, two sequence lengths."""

NO_ANSWER = {"answer": "", "score": 0.0, "start": 0, "end": 0}
"""QA's empty answer (SQuAD 2.0's no-answer, and the answer of a context without a span to read)."""

FILL_MASK_MAX_FILLS = 1000
"""Most fills one fill-mask request may ask for (its masks, over all its texts, x top_k or the targets if fewer),
refused before the model runs: each fill is its text decoded again (up to ~2 KB and ~0.4 ms of post-processing at
512 tokens), so this bounds an answer at about 2 MB and 0.4 s, far under gRPC's send limit."""
FILL_MASK_OUTPUT_BYTES = 256 * 1024 * 1024
"""Largest (B, M, V) float32 `mask_logits` output of one fill-mask batch (M = its most masks in one row). A row
may be all masks, so M can reach the padded length: the cap bounds a batch's padded tokens (about 2,200 with a
30,522-token vocabulary). One mask per row, a batch of 8 x 128 tokens puts 8 x 30,522 floats out (977 KB)."""
TOKEN_EMBEDDINGS = "token_embeddings"
"""The embed graph's token states (`bundles.spec.ON_REQUEST_OUTPUTS`): fetched for the requests for them only."""
EMBED_ALL_MAX_VALUES = 8 * 1024 * 1024
"""Most floats one token-embeddings answer may hold (its tokens, specials included, x the hidden size), refused
before the model runs: 32 MiB of float32, half of the gRPC front door's send limit, and about 90 MB as JSON. The
default request limits stay under it with MiniLM (64 inputs x 256 tokens x 384 = 6.3 million); a BERT-base model
reaches it at 21 inputs of 512 tokens."""


@dataclass
class Plan:
    """What a request needs of the model, known before its features are built (`Pipeline.plan`)."""

    request: Any
    sequences: int
    """Model rows (token sequences) the request's features will be."""
    tokenized: Any = None
    """What the pipeline tokenized to count them, which `Pipeline.build` cuts the features from (None: nothing)."""
    rows: Sequence[int] = ()
    """QA, NER: the model rows (windows) of each input, in order (empty: one row per input)."""
    unit: str = "sequences"
    """What a row is, for messages: `windows of 256 tokens` (QA, NER), `sequences` else."""

    def too_large(self, limit: int) -> str | None:
        """Why the request cannot fit into a queue of `limit` rows and how to split it; None when it fits."""
        if self.sequences <= limit:
            return None
        head = (
            f"the request needs {self.sequences} {self.unit}, more than this model's queue holds ({limit}, the "
            f"server's max_queue setting)"
        )
        if not self.rows:
            return f"{head}; send fewer or shorter inputs"
        largest = max(range(len(self.rows)), key=lambda index: self.rows[index])
        if self.rows[largest] > limit:
            return (
                f"{head}: input {largest} alone needs {self.rows[largest]}; send it in parts of at most "
                f"{limit / self.rows[largest]:.0%} of its length"
            )
        return (
            f"{head}; split it into requests of at most {limit} {self.unit}: at most {limit // self.rows[largest]} "
            f"inputs as long as its longest (input {largest}: {self.rows[largest]})"
        )


class Pipeline:
    """Task logic for one bundle: features out of an input, results out of output rows.

    Features are made in two steps, so that a server judges a request's model rows against the model's queue
    before it spends time building them: `plan` counts the rows (QA and NER tokenize each input once, without
    windows, and count the windows arithmetically; the other tasks have one row per input), `build` makes them.
    """

    task = ""
    sequence_outputs: tuple[str, ...] = ()
    max_batch_tokens: int | None = None
    """The most padded tokens of one backend call this task allows (None = the server's setting only)."""
    score_function: ScoreFunction | None = None
    """classify: how logits become scores unless a request says otherwise; None for the other tasks."""
    short_requests = True
    """Whether a request of this task may be short, i.e. go before bulk work when it has few tokens
    (`service.engine.batcher.LongBatchGate`); False for a task whose every request is bulk work."""

    def __init__(self, bundle: ServingBundle) -> None:
        self.bundle = bundle
        self.tokenizer = bundle.tokenizer
        self.max_seq_length = bundle.manifest.max_seq_length
        """The longest window this pipeline builds (what `GET /models` reports)."""
        self.labels = list(bundle.manifest.labels)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.bundle.manifest.output_names

    def features(self, request: Any) -> list[Feature]:
        """The features of `request` at once (`build(plan(request))`)."""
        return self.build(self.plan(request))

    def plan(self, request: Any) -> Plan:
        """How many model rows `request` needs, and what was tokenized to know it."""
        with _input_errors():
            return self._plan(request)

    def build(self, plan: Plan) -> list[Feature]:
        """The features (model rows) of a planned request."""
        with _input_errors():
            return self._build(plan)

    def _plan(self, request: Any) -> Plan:
        return Plan(request, self.count(request))

    def _build(self, plan: Plan) -> list[Feature]:
        return self._features(plan.request)

    def postprocess(self, request: Any, features: Sequence[Feature], outputs: list[dict[str, np.ndarray]]) -> list[Any]:
        try:
            by_index = self._postprocess(request, features, outputs)
        except (ValueError, TypeError) as error:  # outputs that do not fit the features: not the caller's fault
            raise BackendError(f"post-processing failed: {error}") from error
        return [by_index.get(index) or self.no_result() for index in range(self.count(request))]

    def no_result(self) -> list[Any]:
        """The result of an input that yields nothing (no token to read): none."""
        return []

    def _features(self, request: Any) -> list[Feature]:
        raise NotImplementedError

    def _postprocess(self, request: Any, features: Sequence[Feature], outputs: list[dict[str, np.ndarray]]) -> dict:
        raise NotImplementedError

    def count(self, request: Any) -> int:
        raise NotImplementedError

    def extra_outputs(self, request: Any) -> tuple[str, ...]:
        """Outputs `request` needs beyond the bundle's `output_names` (fetched for its batches only): none."""
        return ()

    def size(self, request: TaskInput) -> int:
        """The size of a request's tokenization and post-processing, in characters: whether the engine does them
        on the event loop (small) or on a worker thread (large)."""
        return request.characters()

    def warmup_input(self) -> Any:
        raise NotImplementedError

    def filler_batch(self, rows: int, width: int | None = None) -> list[Feature]:
        """`rows` features of `width` tokens (default the longest window this pipeline builds), `[CLS] the the ...
        [SEP]`: warm-up batches of a given shape (the largest, after which the runtime's memory is at its working
        size)."""
        width = self.max_seq_length if width is None else width
        filler = self.tokenizer.token_to_id("the") or self.tokenizer.cls_id
        ids = [self.tokenizer.cls_id] + [filler] * (width - 2) + [self.tokenizer.sep_id]
        return [Feature(index, list(ids), [0] * len(ids)) for index in range(rows)]


@contextmanager
def _input_errors() -> Iterator[None]:
    """Errors of the task layer caused by the input become InvalidInput (InputTooLong for a too long one)."""
    try:
        yield
    except InputTooLongError as error:
        raise InputTooLong(f"{error} (or set truncate=true)") from error
    except ValueError as error:  # the task layer's word for "this input cannot be taken"; a TypeError is a bug
        raise InvalidInput(str(error)) from error


def _truncation(truncate: bool | None) -> str:
    return "none" if truncate is False else "longest_first"


class ClassifyPipeline(Pipeline):
    task = "classify"
    score_function: ScoreFunction

    def __init__(self, bundle: ServingBundle) -> None:
        super().__init__(bundle)
        problem_type = bundle.manifest.task_settings.get("problem_type")
        try:
            self.score_function = default_score_function(problem_type, len(self.labels))
        except ValueError as error:
            raise ValueError(f"manifest task_settings: {error}") from error

    def _features(self, request: ClassifyInput) -> list[Feature]:
        return list(
            build_classification_features(
                self.tokenizer,
                request.texts,
                request.pairs,
                max_seq_length=self.max_seq_length,
                truncation=_truncation(request.truncate),  # type: ignore[arg-type]
            )
        )

    def _postprocess(self, request: ClassifyInput, features: Sequence[Feature], outputs: list[dict]) -> dict:
        logits = [output["logits"] for output in outputs]
        function = request.function_to_apply or self.score_function
        return classification_postprocess(features, logits, self.labels, top_k=request.top_k, function=function)

    def count(self, request: ClassifyInput) -> int:
        return len(request.texts)

    def warmup_input(self) -> ClassifyInput:
        return ClassifyInput(texts=list(WARMUP_TEXTS))


class QAPipeline(Pipeline):
    task = "qa"
    sequence_outputs = ("start_logits", "end_logits")
    # A question over a passage is bulk work, however short the passage: the priority of short requests is for
    # sentences. Were QA requests with short passages short, a QA load would hold back its own longer requests'
    # batches behind them (one at a time, not on all cores, of at most priority_batch_tokens).
    short_requests = False

    def __init__(self, bundle: ServingBundle) -> None:
        super().__init__(bundle)
        specials = self.tokenizer.template.pair_specials
        self.windows = qa_windows(bundle.manifest.task_settings, bundle.manifest.max_seq_length, specials)
        self.max_seq_length = self.windows.max_seq_length

    def _plan(self, request: QAInput) -> Plan:
        stride = self.windows.doc_stride if request.doc_stride is None else request.doc_stride
        if stride >= self.windows.context_room:
            raise InvalidInput(
                f"doc_stride {stride} must be smaller than the context tokens of one window "
                f"({self.windows.context_room} for this model)"
            )
        inputs = encode_qa_inputs(
            self.tokenizer,
            request.questions,
            request.contexts,
            max_seq_length=self.max_seq_length,
            doc_stride=stride,
            max_query_length=self.windows.max_query_length,
        )
        counts = inputs.window_counts()
        if request.truncate is False:
            _reject_windows(counts, "context[{}]", self.max_seq_length)
            _reject_long_questions(inputs.question_lengths, self.windows.max_query_length)
        unit = f"windows of {self.max_seq_length} tokens (doc_stride {stride})"
        return Plan(request, sum(counts), inputs, rows=counts, unit=unit)

    def _build(self, plan: Plan) -> list[Feature]:
        inputs: QAInputs = plan.tokenized
        return list(qa_window_features(self.tokenizer, inputs))

    def _postprocess(self, request: QAInput, features: Sequence[Feature], outputs: list[dict]) -> dict:
        return qa_postprocess(
            features,  # type: ignore[arg-type]
            [output["start_logits"] for output in outputs],
            [output["end_logits"] for output in outputs],
            top_k=request.top_k,
            max_answer_length=self.windows.max_answer_length
            if request.max_answer_len is None
            else request.max_answer_len,
            null_threshold=self.windows.null_threshold if request.handle_impossible_answer else None,
        )

    def count(self, request: QAInput) -> int:
        return len(request.questions)

    def no_result(self) -> list[Any]:
        """A context without a span to read answers the empty answer, over both front doors."""
        return [dict(NO_ANSWER)]

    def warmup_input(self) -> QAInput:
        context = "The service warms up every model once before it reports ready. " * 20
        return QAInput(questions=["What does the service warm up?"], contexts=[context])


class NERPipeline(Pipeline):
    task = "ner"
    sequence_outputs = ("logits",)

    def __init__(self, bundle: ServingBundle) -> None:
        super().__init__(bundle)
        self.max_seq_length, self.stride = ner_windows(
            bundle.manifest.task_settings, bundle.manifest.max_seq_length, self.tokenizer.template.single_specials
        )
        """Window length, and tokens shared by consecutive windows of a long text."""

    def _plan(self, request: NERInput) -> Plan:
        inputs = encode_ner_texts(self.tokenizer, request.texts, max_seq_length=self.max_seq_length, stride=self.stride)
        counts = inputs.window_counts()
        if request.truncate is False:
            _reject_windows(counts, "input {}", self.max_seq_length)
        unit = f"windows of {self.max_seq_length} tokens"
        return Plan(request, sum(counts), inputs, rows=counts, unit=unit)

    def _build(self, plan: Plan) -> list[Feature]:
        inputs: NERInputs = plan.tokenized
        return list(ner_window_features(self.tokenizer, inputs))

    def _postprocess(self, request: NERInput, features: Sequence[Feature], outputs: list[dict]) -> dict:
        logits = [output["logits"] for output in outputs]
        return ner_postprocess(
            features,  # type: ignore[arg-type]
            logits,
            self.labels,
            aggregation_strategy=request.aggregation_strategy,  # type: ignore[arg-type]
            ignore_labels=("O",) if request.ignore_labels is None else request.ignore_labels,
        )

    def count(self, request: NERInput) -> int:
        return len(request.texts)

    def warmup_input(self) -> NERInput:
        return NERInput(texts=["Ada Lovelace worked with Charles Babbage in London."])


class EmbedPipeline(Pipeline):
    """Sentence embeddings: one (cut or refused) sequence per text; the graph pools it (the manifest's `pooling`
    says how) and normalizes the pooled vector, the pipeline picks the vector the request asks for (or cuts the
    pooled one to `dimensions` and renormalizes it). A request for every token's vector (`EmbedAllInput`) gets the
    graph's token states instead, each text's own tokens (special tokens included, as text-embeddings-inference's
    `/embed_all` and sentence-transformers' `output_value="token_embeddings"` answer), raw: neither pooled nor
    normalized."""

    task = "embed"
    sequence_outputs = (TOKEN_EMBEDDINGS,)

    def __init__(self, bundle: ServingBundle) -> None:
        super().__init__(bundle)
        settings = bundle.manifest.task_settings
        self.pooling = settings.get("pooling", "mean")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"manifest task_settings pooling must be one of {POOLING_MODES}, got {self.pooling!r}")
        self.normalize = settings.get("normalize", True)
        if not isinstance(self.normalize, bool):
            raise ValueError(f"manifest task_settings normalize must be true or false, got {self.normalize!r}")
        self.vector_size: int | None = None
        """The graph's vector size, read off its first answer (the warm-up's): from then on a request's
        `dimensions` is checked before its work is done."""

    def _plan(self, request: EmbedInput | EmbedAllInput) -> Plan:
        if isinstance(request, EmbedAllInput) and TOKEN_EMBEDDINGS not in self.bundle.manifest.on_request_outputs:
            manifest = self.bundle.manifest
            command = reexport_command({"source": manifest.source}, self.bundle.path / MANIFEST_FILE)
            raise InvalidInput(
                f"model {manifest.name!r} cannot answer with token embeddings: its bundle was exported before embed "
                f"graphs put out their token states (its graphs output {', '.join(manifest.outputs)}); re-export it "
                f"with this build: {command}"
            )
        return super()._plan(request)

    def extra_outputs(self, request: Any) -> tuple[str, ...]:
        """The token states for a request for every token's vector."""
        return (TOKEN_EMBEDDINGS,) if isinstance(request, EmbedAllInput) else ()

    def _features(self, request: EmbedInput | EmbedAllInput) -> list[Feature]:
        if isinstance(request, EmbedInput):
            self._check_dimensions(request.dimensions)
        features: list[Feature] = list(
            build_classification_features(
                self.tokenizer,
                request.texts,
                max_seq_length=self.max_seq_length,
                truncation=_truncation(request.truncate),  # type: ignore[arg-type]
            )
        )
        if isinstance(request, EmbedAllInput):
            self._check_answer_size(features)
        return features

    def _check_answer_size(self, features: Sequence[Feature]) -> None:
        """A token-embeddings answer holds tokens x hidden floats: at most EMBED_ALL_MAX_VALUES."""
        tokens = sum(len(feature) for feature in features)
        size = self.vector_size
        if size is not None and tokens * size > EMBED_ALL_MAX_VALUES:
            raise InvalidInput(
                f"the answer would hold {tokens} token vectors of {size} floats ({tokens * size:,} floats), more than "
                f"the limit of {EMBED_ALL_MAX_VALUES:,} per request; send fewer or shorter inputs"
            )

    def _postprocess(
        self, request: EmbedInput | EmbedAllInput, features: Sequence[Feature], outputs: list[dict]
    ) -> dict:
        if isinstance(request, EmbedAllInput):
            # each row is its text's own positions already (the batcher cuts sequence outputs to their lengths)
            return {
                feature.request_index: {
                    "token_embeddings": np.ascontiguousarray(output[TOKEN_EMBEDDINGS], dtype=np.float32),
                    "tokens": len(feature),
                }
                for feature, output in zip(features, outputs, strict=True)
            }
        pooled = [output["pooled_embedding"] for output in outputs]
        if pooled:
            self.vector_size = int(np.shape(pooled[0])[-1])
        self._check_dimensions(request.dimensions)
        vectors = embedding_postprocess(
            features,
            pooled,
            [output["normalized_embedding"] for output in outputs],
            normalize=self.normalize if request.normalize is None else request.normalize,
            dimensions=request.dimensions,
        )
        tokens = {feature.request_index: len(feature) for feature in features}
        return {index: {"embedding": vector, "tokens": tokens[index]} for index, vector in vectors.items()}

    def _check_dimensions(self, dimensions: int | None) -> None:
        size = self.vector_size
        if dimensions is not None and size is not None and dimensions > size:
            raise InvalidInput(f"dimensions must be at most {size} (this model's embedding size), got {dimensions}")

    def count(self, request: EmbedInput) -> int:
        return len(request.texts)

    def warmup_input(self) -> EmbedInput:
        return EmbedInput(texts=list(WARMUP_TEXTS))


class FillMaskPipeline(Pipeline):
    """Masked-LM predictions at every mask token of a text (Hugging Face fill-mask semantics). The graph scores the
    mask tokens only: each text's output row is (M, V), its masks' logits in position order first."""

    task = "fill-mask"

    def __init__(self, bundle: ServingBundle) -> None:
        super().__init__(bundle)
        self.mask_token = bundle.manifest.task_settings.get("mask_token", DEFAULT_MASK_TOKEN)
        if not isinstance(self.mask_token, str) or self.tokenizer.token_to_id(self.mask_token) is None:
            raise ValueError(
                f"manifest task_settings mask_token {self.mask_token!r} is not in the tokenizer's vocabulary"
            )
        # M <= the padded length: bounding the padded tokens bounds the (B, M, V) output
        self.max_batch_tokens = max(self.max_seq_length, FILL_MASK_OUTPUT_BYTES // (4 * self.tokenizer.vocab_size))

    def filler_batch(self, rows: int, width: int | None = None) -> list[Feature]:
        """As `Pipeline.filler_batch`, each row with one mask token (the graph scores mask tokens only)."""
        features = super().filler_batch(rows, width)
        mask_id = mask_token_id(self.tokenizer, self.mask_token)
        for feature in features:
            feature.input_ids[1] = mask_id
        return features

    def _features(self, request: FillMaskInput) -> list[Feature]:
        choices = self.tokenizer.vocab_size
        if request.targets is not None:
            choices = len(target_ids(self.tokenizer, request.targets))  # refuses a target that is not one token
        features = build_fill_mask_features(
            self.tokenizer,
            request.texts,
            max_seq_length=self.max_seq_length,
            truncation=_truncation(request.truncate),  # type: ignore[arg-type]
            mask_token=self.mask_token,
        )
        mask_id = mask_token_id(self.tokenizer, self.mask_token)
        masks = 0
        for feature in features:
            masks += list(feature.input_ids).count(mask_id)
        each = min(request.top_k, choices)
        if masks * each > FILL_MASK_MAX_FILLS:
            raise InvalidInput(
                f"the request asks for {masks * each} fills ({masks} masks x {each} each: top_k, or the targets if "
                f"fewer), more than the limit of {FILL_MASK_MAX_FILLS} per request; lower top_k, or split it into "
                "requests with fewer masks or texts"
            )
        return features

    def _postprocess(self, request: FillMaskInput, features: Sequence[Feature], outputs: list[dict]) -> dict:
        return fill_mask_postprocess(
            self.tokenizer,
            features,
            [output["mask_logits"] for output in outputs],
            top_k=request.top_k,
            targets=None if request.targets is None else target_ids(self.tokenizer, request.targets),
            mask_token=self.mask_token,
        )

    def count(self, request: FillMaskInput) -> int:
        return len(request.texts)

    def size(self, request: TaskInput) -> int:
        """What a fill-mask request sends, and what its answer will hold (each fill is its text decoded again), so
        that a request asking for many fills of a short text is post-processed off the event loop."""
        assert isinstance(request, FillMaskInput)
        fills = min(request.top_k, len(request.targets) if request.targets is not None else request.top_k)
        mask = self.mask_token
        return request.characters() + sum(len(text) * fills * max(text.count(mask), 1) for text in request.texts)

    def warmup_input(self) -> FillMaskInput:
        return FillMaskInput(texts=[f"The service warms up every {self.mask_token} before it reports ready."])


class RerankPipeline(Pipeline):
    """A cross-encoder: one `[CLS] query [SEP] passage [SEP]` row per passage, each scored by a one-output head;
    the answer is one ranking per request (`bert_model.tasks.rerank`). The model's own activation is the manifest's
    `task_settings` `activation` (sigmoid unless it says none); `raw_scores` asks for the logits."""

    task = "rerank"

    def __init__(self, bundle: ServingBundle) -> None:
        super().__init__(bundle)
        self.activation = bundle.manifest.task_settings.get("activation", "sigmoid")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"manifest task_settings activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    def _plan(self, request: RerankInput) -> Plan:
        return Plan(request, len(request.texts), unit="passages")

    def _features(self, request: RerankInput) -> list[Feature]:
        return list(
            build_rerank_features(
                self.tokenizer,
                request.query,
                request.texts,
                max_seq_length=self.max_seq_length,
                truncate=request.truncate is not False,
            )
        )

    def postprocess(self, request: Any, features: Sequence[Feature], outputs: list[dict[str, np.ndarray]]) -> list[Any]:
        """One result: `{ranks: [{index, score}] best first, tokens: the pairs' tokens}`."""
        try:
            activation = "none" if request.raw_scores else self.activation
            logits = [output["logits"] for output in outputs]
            ranks = rerank_postprocess(features, logits, activation=activation, top_n=request.top_n)  # type: ignore[arg-type]
        except (ValueError, TypeError) as error:
            raise BackendError(f"post-processing failed: {error}") from error
        return [{"ranks": ranks, "tokens": sum(len(feature) for feature in features)}]

    def count(self, request: RerankInput) -> int:
        return 1

    def warmup_input(self) -> RerankInput:
        return RerankInput(query=WARMUP_TEXTS[0], texts=list(WARMUP_TEXTS))


def _reject_windows(window_counts: Sequence[int], pointer: str, max_seq_length: int) -> None:
    """With truncate=false, an input that needs more than one window is refused (QA contexts, NER texts).
    `pointer` formats the input's index into the message: `context[{}]`, or `input {}` where REST and gRPC name
    the texts differently."""
    for index, count in enumerate(window_counts):
        if count > 1:
            raise InputTooLong(
                f"{pointer.format(index)} does not fit in one window of {max_seq_length} tokens; "
                "shorten it, or send truncate=true to process it in overlapping windows"
            )


def _reject_long_questions(question_lengths: Sequence[int], limit: int) -> None:
    """With truncate=false, a question over the model's question budget is refused (truncate=true cuts it)."""
    for index, length in enumerate(question_lengths):
        if length > limit:
            raise InputTooLong(
                f"question[{index}] has {length} tokens, more than this model's limit of {limit} tokens "
                "for a question; shorten it, or send truncate=true to cut it"
            )


PIPELINES: dict[str, type[Pipeline]] = {
    "classify": ClassifyPipeline,
    "qa": QAPipeline,
    "ner": NERPipeline,
    "embed": EmbedPipeline,
    "fill-mask": FillMaskPipeline,
    "rerank": RerankPipeline,
}


def make_pipeline(bundle: ServingBundle) -> Pipeline:
    """The task pipeline of `bundle`; a manifest whose task_settings cannot be used raises ValueError naming it."""
    try:
        return PIPELINES[bundle.task](bundle)
    except ValueError as error:
        raise ValueError(f"bundle {bundle.path}: {error}") from error
