"""Raw text corpus -> documents -> sentences, streamed file by file (never the whole corpus in memory).

Input convention of Devlin et al. (2019), section 3.1 / google-research/bert `create_pretraining_data.py`: plain
text with one sentence or paragraph per line and blank lines between documents (optionally, every N
blank-line-separated paragraphs form a document, for texts like Tiny Shakespeare whose blank lines only end
speeches). WikiText files (Merity et al. 2016) are recognised by their ` = Title = ` lines: there a top-level
heading starts a new document (an article), section headings (` = = Section = = `) are dropped and blank lines
only end paragraphs. Lines longer than one
sentence are split into sentences with a small rule-based splitter (end punctuation followed by a capitalised
word, not after a known abbreviation or an initial), so that NSP segments end at sentence boundaries.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CorpusFormat = Literal["auto", "plain", "wikitext"]
CORPUS_FORMATS: tuple[str, ...] = ("auto", "plain", "wikitext")

# A top-level WikiText heading (" = Title = "), and any heading (" = = Section = = ").
_WIKI_TITLE = re.compile(r"^\s*=\s+[^=\s].*?\s+=\s*$")
_WIKI_HEADING = re.compile(r"^\s*(=\s+)+[^=].*?(\s+=)+\s*$")
# End punctuation, optional closing quotes/brackets, whitespace, then an optionally quoted capital letter.
_SENTENCE_BREAK = re.compile(r"[.!?]+[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st mt ft jr sr gen col lt sgt capt cpt maj adm gov rev hon vs etc no nos vol fig op pp "  # noqa: SIM905
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s e.g i.e a.m p.m ca approx".split()
)


@dataclass
class Document:
    """One document: its sentences in order, and the index of the corpus file it came from."""

    sentences: list[str]
    source: int = 0


def split_sentences(line: str) -> list[str]:
    """Split a line (a sentence or a paragraph) into sentences; whitespace is normalised at the ends."""
    text = line.strip()
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_BREAK.finditer(text):
        end = match.start() + len(match.group().rstrip())
        if _ends_with_abbreviation(text[start : match.start()]):
            continue
        sentences.append(text[start:end].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


def _ends_with_abbreviation(text: str) -> bool:
    words = text.split()
    if not words:
        return False
    last = words[-1].lower().strip("\"'“‘([")
    return (len(last) == 1 and last.isalpha()) or last in _ABBREVIATIONS


def check_corpus_files(paths: Sequence[str | Path]) -> list[Path]:
    """Validate corpus paths before any work: each must exist, be a file and be readable."""
    if not paths:
        raise ValueError("no corpus file given")
    checked: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"corpus file {path} does not exist")
        if not path.is_file():
            raise ValueError(f"corpus path {path} is not a regular file")
        if not os.access(path, os.R_OK):
            raise PermissionError(f"corpus file {path} is not readable (permission denied)")
        checked.append(path)
    return checked


def detect_format(path: Path) -> Literal["plain", "wikitext"]:
    """`wikitext` if the first non-blank line of the file is a ` = Title = ` heading, else `plain`."""
    for line in _read_lines(path):
        if line.strip():
            return "wikitext" if _WIKI_TITLE.match(line) else "plain"
    return "plain"


def iter_documents(
    paths: Sequence[str | Path], corpus_format: CorpusFormat = "auto", paragraphs_per_document: int = 1
) -> Iterator[Document]:
    """Stream the documents of all files in order; documents without any sentence are skipped.

    In plain files a blank line ends a document, or, with `paragraphs_per_document` N > 1, every N
    blank-line-separated paragraphs form one document: for continuous texts without document markers, such as
    Tiny Shakespeare, whose paragraphs are single speeches (a file's last document may be shorter).
    """
    if corpus_format not in CORPUS_FORMATS:
        raise ValueError(f"corpus format must be one of {CORPUS_FORMATS}, got {corpus_format!r}")
    if paragraphs_per_document < 1:
        raise ValueError(f"paragraphs_per_document must be at least 1, got {paragraphs_per_document}")
    for source, path in enumerate(check_corpus_files(paths)):
        file_format = detect_format(path) if corpus_format == "auto" else corpus_format
        if file_format == "wikitext":
            documents = _wikitext_documents(_read_lines(path))
        else:
            documents = _grouped(_plain_documents(_read_lines(path)), paragraphs_per_document)
        for sentences in documents:
            if sentences:
                yield Document(sentences, source)


def _plain_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    sentences: list[str] = []
    for line in lines:
        if line.strip():
            sentences.extend(split_sentences(line))
        elif sentences:
            yield sentences
            sentences = []
    yield sentences


def _grouped(paragraphs: Iterable[list[str]], size: int) -> Iterator[list[str]]:
    group: list[str] = []
    count = 0
    for paragraph in paragraphs:
        if not paragraph:
            continue
        group.extend(paragraph)
        count += 1
        if count == size:
            yield group
            group, count = [], 0
    yield group


def _wikitext_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    sentences: list[str] = []
    for line in lines:
        if _WIKI_TITLE.match(line):
            yield sentences
            sentences = []
        elif not _WIKI_HEADING.match(line):
            sentences.extend(split_sentences(line))
    yield sentences


def _read_lines(path: Path) -> Iterator[str]:
    try:
        with path.open(encoding="utf-8") as handle:
            yield from _decoded(handle, path)
    except IsADirectoryError as error:
        raise ValueError(f"corpus path {path} is a directory, not a text file") from error


def _decoded(handle: Iterable[str], path: Path) -> Iterator[str]:
    line_number = 0
    iterator = iter(handle)
    while True:
        try:
            line = next(iterator)
        except StopIteration:
            return
        except UnicodeDecodeError as error:
            raise ValueError(
                f"corpus file {path} is not UTF-8 text (undecodable byte after line {line_number}): {error.reason}"
            ) from error
        line_number += 1
        yield line
