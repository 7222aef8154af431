"""MLM-only sequences: full sentences packed across document boundaries (the RoBERTa recipe's inputs).

Reference: Liu et al. (2019), "RoBERTa: A Robustly Optimized BERT Pretraining Approach", section 4.2, the
FULL-SENTENCES format: each input is packed with full sentences sampled contiguously from one or more documents,
up to the maximum length; inputs may cross document boundaries, and an extra separator token is added between
documents. There is no sentence pair and no next-sentence label: every token has segment 0.

Layout of one sequence: `[CLS] s1 s2 ... [SEP] t1 t2 ... [SEP]`, where the inner [SEP] ends a document and the
last one ends the sequence (when a document ends exactly at the end of a sequence, one [SEP] does both). A
sequence takes the next sentence while it fits in `max_seq_length`; so every sequence but the last of a call is
full up to the length of the sentence that did not fit. A sentence longer than a whole sequence is cut into pieces
of the largest size that fits. Deterministic: the caller decides the order of the documents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bert_model.pretraining.instances import NO_NSP_LABEL, Segment, TokenizedDocument, TrainingInstance


@dataclass(frozen=True)
class PackOptions:
    """The length of a packed sequence and the special ids it uses."""

    max_seq_length: int
    cls_id: int
    sep_id: int

    def __post_init__(self) -> None:
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8 tokens, got {self.max_seq_length}")

    @property
    def max_content(self) -> int:
        """Tokens between [CLS] and the final [SEP] (document separators included)."""
        return self.max_seq_length - 2


def pack_full_sentences(
    documents: Sequence[TokenizedDocument], options: PackOptions, sources: Sequence[int] | None = None
) -> list[TrainingInstance]:
    """The documents, in the order given, as consecutive full-sentence sequences (see the module docstring). With
    `sources` (the corpus file of each document), a sequence's `source` is that of the document it starts in."""
    if sources is not None and len(sources) != len(documents):
        raise ValueError(f"{len(documents)} documents but {len(sources)} sources")
    packer = _Packer(options)
    for index, document in enumerate(documents):
        packer.source = 0 if sources is None else sources[index]
        for sentence in document:
            for piece in _pieces(sentence, options.max_content):
                packer.add(piece)
        packer.end_document()
    packer.flush()
    return packer.instances


class _Packer:
    """Collects the content of the sequence being filled; `flush` turns it into an instance."""

    def __init__(self, options: PackOptions) -> None:
        self.options = options
        self.ids: list[int] = []
        self.word_start: list[bool] = []
        self.closed = False
        """Whether the content ends with a document separator (which then also ends the sequence)."""
        self.source = 0
        """Corpus file of the document being read."""
        self.first_source = 0
        """Corpus file of the document the sequence being filled starts in."""
        self.instances: list[TrainingInstance] = []

    def add(self, piece: Segment) -> None:
        """Append a sentence (piece), starting a new sequence first when it does not fit."""
        if self.ids and len(self.ids) + len(piece) > self.options.max_content:
            self.flush()
        if not self.ids:
            self.first_source = self.source
        self.ids.extend(piece.ids)
        self.word_start.extend(piece.word_start)
        self.closed = False

    def end_document(self) -> None:
        """Mark a document boundary. The separator may take the final [SEP]'s place, so it always fits."""
        if self.ids and not self.closed:
            self.ids.append(self.options.sep_id)
            self.word_start.append(True)
            self.closed = True

    def flush(self) -> None:
        if not self.ids:
            return
        ending = [] if self.closed else [self.options.sep_id]
        ids = [self.options.cls_id, *self.ids, *ending]
        starts = [True, *self.word_start, *[True] * len(ending)]
        self.instances.append(TrainingInstance(ids, starts, len(ids), NO_NSP_LABEL, self.first_source))
        self.ids, self.word_start, self.closed = [], [], False


def _pieces(sentence: Segment, size: int) -> Iterator[Segment]:
    """The sentence, or consecutive pieces of at most `size` tokens of it; a cut word starts where the cut is."""
    if len(sentence) <= size:
        yield sentence
        return
    for start in range(0, len(sentence), size):
        starts = sentence.word_start[start : start + size]
        yield Segment(sentence.ids[start : start + size], [True, *starts[1:]])
