"""REST request and response bodies (pydantic), with the OpenAPI examples users see in /docs.

Shapes follow Hugging Face pipelines: one input in -> its result out; a list in -> a list of results out.
Unknown fields are rejected (a typo in an option name must not be silently ignored). Option defaults are the
task inputs' (`service.engine.pipelines`), so REST and gRPC share them. Rules the service checks itself, with a
message naming the input (non-blank text, at least one input, QA's two forms), are stated in the schema only.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from bert_model.tasks.classification import ScoreFunction
from bert_model.tasks.defaults import AggregationStrategy
from service.engine.inputs import ClassifyInput, NERInput, QAInput

# Non-blank text. The pattern documents the rule in OpenAPI; the service checks it (with a message that says
# which input is blank), so pydantic only checks the type here. Blank is what `str.strip` removes: Python's
# whitespace, which differs from ECMA-262's `\s` (0x1c-0x1f and 0x85 are whitespace, 0xfeff is not).
NOT_WHITESPACE = r"[^\t-\r\x1c- \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
Text = Annotated[StrictStr, Field(json_schema_extra={"pattern": NOT_WHITESPACE})]


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Integer options: JSON Schema counts 5.0 as the integer 5, so it is taken as 5 (a string or a bool is not).
# Bounds go before it in `Annotated`, so that the schema states them as minimum / maximum.
INTEGRAL = BeforeValidator(_integral)

# A list of inputs holds at least one; the service checks it (pydantic would not say which list is empty).
AT_LEAST_ONE = Field(json_schema_extra={"minItems": 1})

# A text pair as a list (TEI's `/predict`): one or two texts.
ONE_OR_TWO = Field(json_schema_extra={"minItems": 1, "maxItems": 2})

TruncationDirection = Literal["right", "Right"]
"""TEI's `truncation_direction`: only the right end is cut here (a cut keeps the text's start)."""


def _texts_or_pairs(schema: dict[str, Any]) -> None:
    """A classify list holds texts only or pairs only (the service says so when mixed): `items: anyOf [text,
    pair]` becomes `anyOf [{items: text}, {items: pair}]`."""
    kinds = schema.pop("items")["anyOf"]
    schema["anyOf"] = [{"items": kind} for kind in kinds]
    schema["minItems"] = 1


def _model_field(example: str) -> Any:
    return Field(
        None,
        description="A loaded model name (GET /models); omitted, null or empty = the task's default model.",
        examples=[example],
    )


TRUNCATE_FIELD = Field(
    None,
    description="Inputs longer than the model's maximum: true = cut them, false = reject them (422); "
    "omitted = the server default.",
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class TextPair(_Body):
    """A sentence pair (entailment, paraphrase): `text` is the first segment, `text_pair` the second."""

    text: Text
    text_pair: Text


class ClassifyRequest(_Body):
    """Classify a text, a list of texts, or text pairs."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"inputs": "a gripping, beautifully acted film"},
                {"inputs": ["loved it", "a tedious mess"], "top_k": 2},
                {"inputs": [{"text": "A man is playing a guitar.", "text_pair": "Someone plays music."}]},
            ]
        },
    )
    inputs: Text | TextPair | Annotated[list[Text | TextPair], Field(json_schema_extra=_texts_or_pairs)] = Field(
        ..., description="A text, a text pair, or a list of them (at most the server's per-request limit)."
    )
    top_k: Annotated[StrictInt, Field(ge=1), INTEGRAL] | None = Field(
        ClassifyInput.top_k, description="Labels per input, best first; null = all labels."
    )
    model: StrictStr | None = _model_field("minilm-sst2")
    truncate: StrictBool | None = TRUNCATE_FIELD
    function_to_apply: ScoreFunction | None = Field(
        ClassifyInput.function_to_apply,
        description="How logits become scores: softmax, sigmoid (independent per label) or none (the raw values); "
        "null = the model's own (GET /models: softmax for single-label heads, sigmoid for multi-label ones, "
        "none for regression).",
    )


class LabelScore(BaseModel):
    label: str = Field(..., examples=["positive"])
    score: float = Field(..., examples=[0.9876])


class QAPair(_Body):
    question: Text
    context: Text


# QA's two forms, as `_one_form` checks them: question and context (both strings) without inputs, or inputs
# without question and context (an absent field and null are the same).
QA_FORMS: list[JsonValue] = [
    {
        "title": "single",
        "required": ["question", "context"],
        "properties": {"question": {"type": "string"}, "context": {"type": "string"}, "inputs": {"type": "null"}},
    },
    {
        "title": "list",
        "required": ["inputs"],
        "properties": {"inputs": {"type": "array"}, "question": {"type": "null"}, "context": {"type": "null"}},
    },
]


class QARequest(_Body):
    """Extract answers from contexts: either `question` + `context`, or `inputs` (a list of pairs)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": QA_FORMS,
            "examples": [
                {
                    "question": "Where do I live?",
                    "context": "My name is Wolfgang and I live in Berlin.",
                },
                {
                    "inputs": [
                        {"question": "Who wrote it?", "context": "The report was written by Ada in 1843."},
                        {"question": "When?", "context": "The report was written by Ada in 1843."},
                    ],
                    "top_k": 2,
                    "max_answer_len": 10,
                },
            ],
        },
    )
    question: Text | None = Field(None, description="The question (single form).")
    context: Text | None = Field(
        None, description="The text holding the answer; longer than one window = several doc_stride windows."
    )
    inputs: Annotated[list[QAPair], AT_LEAST_ONE] | None = Field(
        None, description="Several {question, context} pairs (list form)."
    )
    top_k: Annotated[StrictInt, Field(ge=1, le=20), INTEGRAL] = Field(
        QAInput.top_k, description="Answers per question, best first."
    )
    max_answer_len: Annotated[StrictInt, Field(ge=1, le=512), INTEGRAL] | None = Field(
        None,
        description="Longest answer, in tokens; omitted = the model's (its fine-tuning setting, else 15).",
    )
    handle_impossible_answer: StrictBool = Field(
        QAInput.handle_impossible_answer,
        description="Allow the empty answer {answer: '', start: 0, end: 0} when no span beats it.",
    )
    doc_stride: Annotated[StrictInt, Field(ge=0), INTEGRAL] | None = Field(
        None, description="Tokens shared by consecutive windows of a long context; omitted = model default."
    )
    model: StrictStr | None = _model_field("minilm-squad")
    truncate: StrictBool | None = TRUNCATE_FIELD

    @model_validator(mode="after")
    def _one_form(self) -> QARequest:
        single = self.question is not None or self.context is not None
        if single and self.inputs is not None:
            raise ValueError("give either question + context, or inputs, not both")
        if not single and self.inputs is None:
            raise ValueError("give question + context, or inputs: a list of {question, context}")
        if single and (self.question is None or self.context is None):
            raise ValueError("question and context must be given together")
        return self


class Answer(BaseModel):
    answer: str = Field(..., description="context[start:end]; '' for no answer.", examples=["Berlin"])
    score: float = Field(..., examples=[0.93])
    start: int = Field(..., description="Character offset of the answer in the context.", examples=[34])
    end: int = Field(..., description="Character offset one past the answer's end.", examples=[40])


class NERRequest(_Body):
    """Find named entities in a text or a list of texts."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"inputs": "Ada Lovelace worked with Charles Babbage in London."},
                {"inputs": ["EU rejects German call.", "Peter Blackburn"], "aggregation_strategy": "first"},
            ]
        },
    )
    inputs: Text | Annotated[list[Text], AT_LEAST_ONE] = Field(..., description="A text or a list of texts.")
    aggregation_strategy: AggregationStrategy = Field(
        cast(AggregationStrategy, NERInput.aggregation_strategy),
        description="none = one entry per token with its tag; simple/first/average/max group word pieces "
        "and words into entities (Hugging Face token-classification semantics).",
    )
    model: StrictStr | None = _model_field("minilm-conll03")
    truncate: StrictBool | None = TRUNCATE_FIELD


class Entity(BaseModel):
    entity_group: str = Field(
        ...,
        description="Entity type (PER, ORG, ...); with aggregation none, the token's tag (B-PER).",
        examples=["PER"],
    )
    score: float = Field(..., examples=[0.998])
    word: str = Field(..., description="text[start:end], the exact original characters.", examples=["Ada Lovelace"])
    start: int = Field(..., description="Character offset in the text.", examples=[0])
    end: int = Field(..., description="Character offset one past the entity.", examples=[12])


class VariantChoiceInfo(BaseModel):
    auto: bool = Field(..., description="Whether the variant was chosen by timing at start (`--variant auto`).")
    timings_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Timed candidate -> shape (batch x length) -> milliseconds per call (lower quartile of its "
        "timed calls); empty when not timed.",
        examples=[{"openvino-int8": {"b1x128": 4.7, "b8x128": 31.0}, "cpu-int8": {"b1x128": 5.5, "b8x128": 42.1}}],
    )
    skipped: dict[str, str] = Field(
        default_factory=dict, description="CPU variants not timed (unguarded, not runnable here, failed to load)."
    )
    rounds: int = Field(0, description="Timing rounds (every candidate, every shape).")
    seconds: float = Field(0.0, description="Seconds spent loading and timing the candidates.")


class ModelInfo(BaseModel):
    name: str = Field(..., examples=["minilm-sst2"])
    task: str = Field(..., examples=["classify"])
    family: str = Field(
        ...,
        description="The encoder's family: bert, roberta, xlm-roberta, distilbert, electra or albert.",
        examples=["bert"],
    )
    labels: list[str] = Field(default_factory=list, examples=[["negative", "positive"]])
    variant: str = Field(..., examples=["cpu-int8"])
    max_seq_length: int = Field(
        ..., description="Tokens per window (the model's own, at most its graph's capacity).", examples=[128]
    )
    backend: str = Field(..., examples=["ort"])
    is_default: bool = Field(..., description="Whether requests without `model` get this one for its task.")
    variant_choice: VariantChoiceInfo = Field(..., description="How `variant` was chosen.")
    function_to_apply: ScoreFunction | None = Field(
        None, description="classify models: how logits become scores unless a request says otherwise; null for others."
    )


class ModelList(BaseModel):
    models: list[ModelInfo]


class ErrorDetail(BaseModel):
    code: str = Field(..., examples=["invalid_input"])
    message: str = Field(..., examples=["inputs[0] is empty: send non-blank text"])


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: str = Field(..., examples=["ready"])
    detail: str | None = None
