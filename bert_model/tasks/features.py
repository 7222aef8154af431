"""Model inputs of the task functions: one `Feature` per model row, each remembering its request.

Every task follows the same two-step shape, so a serving batcher can mix the features of many requests in one
model batch:

    requests --build_*_features--> [Feature, ...]   (a long input may give several features / windows)
    features + output rows --*_postprocess--> {request_index: result}

`collate` pads any list of features into the int64 arrays named in `bundles.spec.INPUT_NAMES`.
Post-processing accepts each feature's output row with or without padding (rows may come from batches padded
to different lengths). The special tokens and segment ids around a text or a pair are the tokenizer's template
(`BertTokenizer.template`: `[CLS] A [SEP]`, `<s> A </s></s> B </s>`), never written out here.

Character offsets of tokens (`token_spans`) cover the token's characters only: a byte-level BPE or SentencePiece
token carries the space before its word (`Ġworld`, `▁world`), which a tokenizer without `trim_offsets` counts into
its span, and a token of whitespace alone (a lone `Ġ`, `\r`) covers nothing; answers and entities start and end on
text, never on the space around it (`trim_span`). WordPiece tokens never hold whitespace, so BERT's offsets are the
tokenizer's. Spans are then widened to whole grapheme clusters (`bert_model.tasks.offsets`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bert_model.tasks.offsets import whole_clusters
from bert_model.tokenization import pad_rows

OutputRows = np.ndarray | Sequence[np.ndarray]
"""Model outputs for a list of features: one row per feature, as one padded array or a list of rows."""


@dataclass(eq=False)
class Feature:
    """One model input row: token ids and segment ids (specials included), no padding."""

    request_index: int
    """Index of the input (text, question, ...) this row was built from, in the list given to the builder.
    A batcher may overwrite it with its own request number before post-processing."""
    input_ids: list[int]
    """Token ids, [CLS] ... [SEP] included."""
    token_type_ids: list[int]
    """Segment ids: 0 for the first text, 1 for the second."""

    def __len__(self) -> int:
        return len(self.input_ids)


def padded_width(longest: int, multiple: int = 1, max_width: int | None = None) -> int:
    """The width a batch whose longest row is `longest` is padded to: rounded up to `multiple`, within `max_width`
    (never below `longest`)."""
    width = -(-longest // multiple) * multiple
    if max_width is not None:
        width = min(width, max(max_width, longest))
    return width


def collate(
    features: Sequence[Feature],
    pad_id: int = 0,
    *,
    pad_to: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, np.ndarray]:
    """Right-pad features into `input_ids`, `attention_mask`, `token_type_ids` int64 arrays of shape (B, S).

    S is the longest feature, or `pad_to`, rounded up to a multiple of `pad_to_multiple_of` when given.
    """
    if not features:
        raise ValueError("cannot collate an empty list of features")
    longest = max(len(f) for f in features)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest feature ({longest} tokens)")
    if pad_to_multiple_of:
        width = padded_width(width, pad_to_multiple_of)
    return pad_rows([f.input_ids for f in features], [f.token_type_ids for f in features], width, pad_id)


def feature_row(feature: Feature, output: np.ndarray | Sequence[float], name: str = "output") -> np.ndarray:
    """A feature's output row without padding: the first len(feature) positions along axis 0."""
    row = np.asarray(output)
    if row.ndim == 0 or row.shape[0] < len(feature):
        raise ValueError(
            f"{name} row has shape {row.shape}, shorter than its feature ({len(feature)} tokens): "
            "outputs must line up with features one to one"
        )
    return row[: len(feature)]


def check_aligned(features: Sequence[Feature], outputs: OutputRows, name: str) -> None:
    """Raise ValueError unless there is exactly one output row per feature."""
    if len(features) != len(outputs):
        raise ValueError(f"got {len(features)} features but {len(outputs)} {name} rows")


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) of `text` without the whitespace at either end; a span of whitespace alone becomes the empty span
    at its end, and an empty span stays as it is."""
    if end <= start:
        return start, end
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else (end, end)


def trimmed_spans(text: str, offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each token's character span in `text` (from the tokenizer's `offsets`) without surrounding whitespace;
    (0, 0) stays (0, 0)."""
    return [
        trim_span(text, s, e) if e > s and (text[s].isspace() or text[e - 1].isspace()) else (int(s), int(e))
        for s, e in offsets
    ]


def token_spans(text: str, offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`trimmed_spans`, widened to whole grapheme clusters."""
    return whole_clusters(text, trimmed_spans(text, offsets))
