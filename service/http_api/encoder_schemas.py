"""REST bodies of the encoder routes: embeddings in two public dialects, and fill-mask.

- `POST /embed` speaks text-embeddings-inference's (https://huggingface.github.io/text-embeddings-inference/):
  `inputs` a text or a list, `normalize` (default true), `truncate`, `truncation_direction` ("right" only:
  cuts keep the start), `prompt_name` (null only: no prompts are configured), `dimensions`; the answer is a
  list of vectors, one per input, also for a single text.
- `POST /embed_all` speaks text-embeddings-inference's too: `inputs`, `truncate`, `truncation_direction`,
  `prompt_name` as `/embed` takes them; the answer is, per input, the vector of each of its tokens (special tokens
  included), a list per input also for a single text.
- `POST /v1/embeddings` speaks OpenAI's (https://platform.openai.com/docs/api-reference/embeddings): `input`
  a text or a list of texts (token-id arrays are refused), `model`, `encoding_format` float | base64 (the
  little-endian float32 bytes, as OpenAI sends them), `dimensions`, `user` (ignored); the answer is
  `{object: list, data: [{object: embedding, embedding, index}], model, usage}` with our tokenizer's counts.
- `POST /fill-mask` speaks Hugging Face's fill-mask pipeline: `inputs` with one or more mask tokens,
  `top_k`, `targets`.
The texts, `model` and `truncate` fields are the task routes' (`service.http_api.schemas`), with the same checks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator

from service.engine.inputs import FILL_MASK_MAX_TOP_K, FillMaskInput
from service.http_api.schemas import (
    AT_LEAST_ONE,
    INTEGRAL,
    TRUNCATE_FIELD,
    Text,
    TruncationDirection,
    _Body,
    _model_field,
)

EMBED_MODEL_EXAMPLE = "minilm"
DIMENSIONS_FIELD = Field(
    None,
    description="Keep the first `dimensions` components of each vector and L2-normalize them again (at most "
    "the model's size); omitted = the whole vector.",
)


class EmbedRequest(_Body):
    """Embed a text or a list of texts (text-embeddings-inference's `/embed` body)."""

    model_config = _Body.model_config | {
        "json_schema_extra": {
            "examples": [
                {"inputs": "What is Deep Learning?"},
                {"inputs": ["a gripping film", "a tedious mess"], "normalize": True, "truncate": True},
            ]
        }
    }
    inputs: Text | Annotated[list[Text], AT_LEAST_ONE] = Field(..., description="A text or a list of texts.")
    normalize: StrictBool = Field(True, description="L2-normalize each vector (unit length).")
    truncate: StrictBool | None = TRUNCATE_FIELD
    truncation_direction: TruncationDirection = Field(
        "right", description="Which end a cut removes: the right (the text's start is kept)."
    )
    prompt_name: None = Field(None, description="No prompts are configured on this server: null only.")
    dimensions: Annotated[StrictInt, Field(ge=1), INTEGRAL] | None = DIMENSIONS_FIELD
    model: StrictStr | None = _model_field(EMBED_MODEL_EXAMPLE)


class EmbedAllRequest(_Body):
    """Every token's vector of a text or of each text in a list (text-embeddings-inference's `/embed_all` body)."""

    model_config = _Body.model_config | {
        "json_schema_extra": {
            "examples": [{"inputs": "What is Deep Learning?"}, {"inputs": ["a gripping film", "a tedious mess"]}]
        }
    }
    inputs: Text | Annotated[list[Text], AT_LEAST_ONE] = Field(..., description="A text or a list of texts.")
    truncate: StrictBool | None = TRUNCATE_FIELD
    truncation_direction: TruncationDirection = Field(
        "right", description="Which end a cut removes: the right (the text's start is kept)."
    )
    prompt_name: None = Field(None, description="No prompts are configured on this server: null only.")
    model: StrictStr | None = _model_field(EMBED_MODEL_EXAMPLE)


class OpenAIEmbeddingsRequest(_Body):
    """Embed a text or a list of texts (OpenAI's embeddings body)."""

    model_config = _Body.model_config | {
        "json_schema_extra": {
            "examples": [
                {"input": "The food was delicious and the waiter was friendly.", "model": EMBED_MODEL_EXAMPLE},
                {"input": ["first text", "second text"], "encoding_format": "base64", "dimensions": 128},
            ]
        }
    }
    input: Text | Annotated[list[Text], AT_LEAST_ONE] = Field(
        ..., description="A text or a list of texts (token-id arrays are not accepted)."
    )
    model: StrictStr | None = _model_field(EMBED_MODEL_EXAMPLE)
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: each vector's little-endian float32 bytes, base64."
    )
    dimensions: Annotated[StrictInt, Field(ge=1), INTEGRAL] | None = DIMENSIONS_FIELD
    user: StrictStr | None = Field(None, description="Accepted for compatibility, not used.")
    truncate: StrictBool | None = TRUNCATE_FIELD

    @model_validator(mode="before")
    @classmethod
    def _no_token_ids(cls, data: Any) -> Any:
        value = data.get("input") if isinstance(data, dict) else None
        items = value if isinstance(value, list) else []
        if items and all(isinstance(item, int | list) for item in items):
            raise ValueError("input: token-id arrays are not accepted here; send the text (a string or strings)")
        return data


class Embedding(_Body):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str = Field(..., description="The vector, or its float32 bytes in base64.")
    index: int = Field(..., description="Position of its input in `input`.")


class Usage(_Body):
    prompt_tokens: int = Field(..., description="Tokens read, special tokens included (this model's tokenizer).")
    total_tokens: int


class OpenAIEmbeddingsResponse(_Body):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str = Field(..., examples=[EMBED_MODEL_EXAMPLE])
    usage: Usage


class FillMaskRequest(_Body):
    """Predict the tokens at the mask positions of a text or of each text in a list."""

    model_config = _Body.model_config | {
        "json_schema_extra": {
            "examples": [
                {"inputs": "Paris is the [MASK] of France."},
                {"inputs": ["The [MASK] sat on the [MASK]."], "top_k": 2},
                {"inputs": "I feel [MASK] today.", "targets": ["happy", "sad"]},
            ]
        }
    }
    inputs: Text | Annotated[list[Text], AT_LEAST_ONE] = Field(
        ..., description="A text or a list of texts, each with at least one mask token ([MASK])."
    )
    top_k: Annotated[StrictInt, Field(ge=1, le=FILL_MASK_MAX_TOP_K), INTEGRAL] = Field(
        FillMaskInput.top_k, description="Fills per mask."
    )
    targets: Text | Annotated[list[Text], AT_LEAST_ONE] | None = Field(
        None, description="Score only these tokens (each a single vocabulary entry); omitted = the whole vocabulary."
    )
    model: StrictStr | None = _model_field("minilm-mlm")
    truncate: StrictBool | None = TRUNCATE_FIELD


class FillMaskResult(_Body):
    score: float = Field(..., examples=[0.91])
    token: int = Field(..., description="The vocabulary id of the predicted token.", examples=[3007])
    token_str: str = Field(..., examples=["capital"])
    sequence: str = Field(
        ...,
        description="The input with this mask filled (lower-cased by uncased tokenizers; with several masks "
        "the special tokens stay).",
        examples=["paris is the capital of france."],
    )
