"""Request payloads drawn from real data files, or a small built-in sample when no file is given.

- classify: sentences of a GLUE SST-2 TSV (`sentence<TAB>label` with a header; `.gz` allowed), or a text
  file with one sentence per line.
- qa: question + context pairs of a SQuAD JSON file (official v1.1 / v2.0 format).
- ner: sentences of a CoNLL-2003 file (`token POS chunk NER` lines, blank line between sentences,
  `-DOCSTART-` skipped; `.gz` allowed), tokens joined by single spaces.
Every reader raises FileNotFoundError / ValueError naming the file before any load is sent.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASKS: tuple[str, ...] = ("classify", "qa", "ner")
DEFAULT_LIMIT = 2000

BUILTIN_SENTENCES: tuple[str, ...] = (
    "a gripping, beautifully acted film that stays with you long after the credits.",
    "the plot is thin and the jokes fall flat.",
    "an uneven but often charming comedy.",
    "i have rarely been this bored in a cinema.",
    "the cast is wonderful and the script is sharp.",
    "it looks expensive, yet it feels cheap.",
    "a quiet, moving portrait of a family in crisis.",
    "too long by half an hour, and nobody seems to care.",
)

BUILTIN_QA: tuple[tuple[str, str], ...] = (
    (
        "Where did Ada Lovelace publish her notes?",
        "Ada Lovelace translated an article by Luigi Menabrea about the Analytical Engine and added her own notes. "
        "They were published in 1843 in Taylor's Scientific Memoirs, and include what is often called the first "
        "computer program.",
    ),
    (
        "When was the Eiffel Tower completed?",
        "The Eiffel Tower was designed by the engineering company of Gustave Eiffel and built between 1887 and "
        "1889 as the entrance to the 1889 World's Fair in Paris. It was completed in March 1889.",
    ),
    (
        "What does the mitochondrion produce?",
        "The mitochondrion is an organelle found in most eukaryotic cells. It produces most of the cell's supply "
        "of adenosine triphosphate, which is used as a source of chemical energy.",
    ),
    (
        "Who founded the city of Alexandria?",
        "Alexandria was founded by Alexander the Great in 331 BC and became the capital of Ptolemaic Egypt. Its "
        "library was one of the largest and most significant of the ancient world.",
    ),
)

BUILTIN_NER: tuple[str, ...] = (
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn reported from Brussels on Tuesday .",
    "Ada Lovelace worked with Charles Babbage in London .",
    "Microsoft and Siemens signed an agreement in Munich .",
    "The United Nations met in New York to discuss the crisis in Somalia .",
    "Juventus beat Ajax in the final played in Rome .",
)


@dataclass
class Payloads:
    """What the users send: per task a list of inputs, and where each list came from."""

    classify: list[str] = field(default_factory=list)
    qa: list[tuple[str, str]] = field(default_factory=list)
    ner: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {task: len(getattr(self, task)) for task in TASKS}

    def to_json(self) -> str:
        return json.dumps(
            {"classify": self.classify, "qa": [list(p) for p in self.qa], "ner": self.ner, "sources": self.sources}
        )

    @classmethod
    def from_json(cls, text: str) -> Payloads:
        data = json.loads(text)
        return cls(
            classify=list(data["classify"]),
            qa=[(q, c) for q, c in data["qa"]],
            ner=list(data["ner"]),
            sources=dict(data.get("sources", {})),
        )


def _open_text(path: Path) -> io.TextIOBase:
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"data file {path} is not a file")
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
        return open(path, encoding="utf-8")
    except PermissionError:
        raise PermissionError(f"data file {path} is not readable (permission denied)") from None


def _read_all(path: Path) -> str:
    try:
        with _open_text(path) as handle:
            return handle.read()
    except (UnicodeDecodeError, OSError, EOFError) as error:
        if isinstance(error, FileNotFoundError | PermissionError):
            raise
        raise ValueError(f"data file {path} cannot be read as UTF-8 text (gzip when named .gz): {error}") from None


def read_sentences(path: Path) -> list[str]:
    """SST-2 TSV sentences (header with a `sentence` column), or one sentence per line for other files."""
    text = _read_all(path)
    lines = text.splitlines()
    if lines and "\t" in lines[0] and "sentence" in lines[0].split("\t"):
        reader = csv.DictReader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
        sentences = [(row.get("sentence") or "").strip() for row in reader]
    elif path.name.endswith((".tsv", ".tsv.gz")):
        raise ValueError(f"{path} has no header with a `sentence` column (expected GLUE SST-2 layout)")
    else:
        sentences = [line.strip() for line in lines]
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ValueError(f"no sentences in {path}")
    return sentences


def read_squad(path: Path) -> list[tuple[str, str]]:
    """(question, context) pairs of a SQuAD JSON file."""
    try:
        data: Any = json.loads(_read_all(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise ValueError(f"{path} is not a SQuAD file: expected a JSON object with a `data` list")
    pairs = [
        (str(qa["question"]).strip(), str(paragraph["context"]))
        for article in articles
        for paragraph in article.get("paragraphs", [])
        for qa in paragraph.get("qas", [])
        if str(qa.get("question", "")).strip() and str(paragraph.get("context", "")).strip()
    ]
    if not pairs:
        raise ValueError(f"no questions with contexts in {path}")
    return pairs


def read_conll(path: Path) -> list[str]:
    """Sentences of a CoNLL-2003 file, tokens joined by spaces."""
    sentences: list[str] = []
    tokens: list[str] = []
    for line in _read_all(path).splitlines():
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if tokens:
                sentences.append(" ".join(tokens))
                tokens = []
            continue
        if len(parts) < 2:
            raise ValueError(f"{path} is not CoNLL: line {line!r} has no tag column")
        tokens.append(parts[0])
    if tokens:
        sentences.append(" ".join(tokens))
    if not sentences:
        raise ValueError(f"no sentences in {path}")
    return sentences


def _sample(items: list[Any], limit: int, seed: int) -> list[Any]:
    if len(items) <= limit:
        return items
    return random.Random(seed).sample(items, limit)


def load_payloads(
    sst2: Path | None = None,
    squad: Path | None = None,
    conll: Path | None = None,
    limit: int = DEFAULT_LIMIT,
    seed: int = 0,
) -> Payloads:
    """Payloads from the given files (at most `limit` per task, a seeded sample), built-in samples otherwise."""
    if limit < 1:
        raise ValueError(f"payload limit must be at least 1, got {limit}")
    payloads = Payloads(
        classify=list(BUILTIN_SENTENCES),
        qa=list(BUILTIN_QA),
        ner=list(BUILTIN_NER),
        sources=dict.fromkeys(TASKS, "built-in sample"),
    )
    if sst2 is not None:
        payloads.classify = _sample(read_sentences(Path(sst2)), limit, seed)
        payloads.sources["classify"] = str(sst2)
    if squad is not None:
        payloads.qa = _sample(read_squad(Path(squad)), limit, seed)
        payloads.sources["qa"] = str(squad)
    if conll is not None:
        payloads.ner = _sample(read_conll(Path(conll)), limit, seed)
        payloads.sources["ner"] = str(conll)
    return payloads
