"""Real inputs for the accuracy guards and calibration: texts per task, tokenized into fixed-size batches.

Sources, by task (all optional; built-in sentences are used when a file is absent):
- classify / embed: GLUE SST-2 sentences (`sst2/dev.half-a.tsv`, `sentence<TAB>label` with a header);
- ner: CoNLL-2003 validation sentences (`conll2003/iob2/valid.txt`, one `token POS chunk TAG` per line);
- qa: SQuAD v1.1 questions with their paragraphs (`squad_v1.1/dev-v1.1.half-a.json`, official format).
A user file given by path is one input per line; a tab separates a text pair (question<TAB>context for qa).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert_model.tokenization import BertTokenizer, Truncation

DATA_FILES: dict[str, str] = {
    "classify": "sst2/dev.half-a.tsv",
    "embed": "sst2/dev.half-a.tsv",
    "ner": "conll2003/iob2/valid.txt",
    "qa": "squad_v1.1/dev-v1.1.half-a.json",
}
BUILTIN_TEXTS: tuple[str, ...] = (
    "a gripping, beautifully acted film that stays with you long after the credits roll.",
    "the plot is thin and the jokes fall flat, a tedious two hours.",
    "George Washington was born in Westmoreland County, Virginia, in 1732.",
    "Apple opened a new office in Berlin, Germany, hiring engineers from Siemens and SAP.",
    "it is neither as funny nor as clever as it thinks it is.",
    "The European Commission said on Thursday it disagreed with German advice to consumers.",
    "an utterly charming and hilarious comedy with a heart of gold.",
    "Manchester United beat Arsenal 2-1 at Old Trafford on Saturday.",
    "the performances are uniformly excellent, but the script never finds its footing.",
    "Shares of Toyota Motor Corp rose 3 percent in Tokyo after the earnings report.",
    "a slow, muddled and ultimately pointless exercise in style over substance.",
    "Marie Curie received the Nobel Prize in Physics in 1903 together with Pierre Curie.",
)
BUILTIN_CONTEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in "
    "France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway who, under "
    "their leader Rollo, agreed to swear fealty to King Charles III of West Francia."
)
BUILTIN_QUESTIONS: tuple[str, ...] = (
    "In what country is Normandy located?",
    "When were the Normans in Normandy?",
    "From which countries did the Norse originate?",
    "Who was the Norse leader?",
)


@dataclass
class GuardSet:
    """Tokenized guard inputs: batches of int64 arrays keyed by the graph's input names."""

    task: str
    batches: list[dict[str, np.ndarray]]
    source: str
    """Where the texts came from (a file path or `built-in sentences`)."""
    gold: list[list[list[tuple[int, int]]]] | None = None
    """qa with reference answers: per batch, per row, the gold answers as (start, end) token spans (inclusive)
    inside the window (empty when the answer was truncated away)."""

    @property
    def size(self) -> int:
        return sum(int(batch["input_ids"].shape[0]) for batch in self.batches)


def read_texts(task: str, data_dir: Path | None, path: Path | None, limit: int) -> tuple[list[tuple[str, ...]], str]:
    """Up to `limit` inputs (a text, or a text pair) for `task`, and a description of their source."""
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"calibration file {path} does not exist")
        rows = [tuple(line.split("\t")[:2]) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not rows:
            raise ValueError(f"calibration file {path} holds no input lines")
        return rows[:limit], str(path)
    candidate = data_dir / DATA_FILES[task] if data_dir is not None else None
    if candidate is not None and candidate.is_file():
        reader = {"qa": _squad_pairs, "ner": _conll_sentences}.get(task, _sst2_sentences)
        return reader(candidate, limit), str(candidate)
    builtin: list[tuple[str, ...]] = (
        [(q, BUILTIN_CONTEXT) for q in BUILTIN_QUESTIONS] if task == "qa" else [(text,) for text in BUILTIN_TEXTS]
    )
    return builtin, "built-in sentences"


def _sst2_sentences(path: Path, limit: int) -> list[tuple[str, ...]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    rows: list[tuple[str, ...]] = [(line.split("\t")[0],) for line in lines if line.strip()]
    return rows[:limit]


def _conll_sentences(path: Path, limit: int) -> list[tuple[str, ...]]:
    sentences: list[tuple[str, ...]] = []
    words: list[str] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
        elif words:
            sentences.append((" ".join(words),))
            words = []
        if len(sentences) >= limit:
            break
    return sentences


def _squad_pairs(path: Path, limit: int) -> list[tuple[str, ...]]:
    pairs: list[tuple[str, ...]] = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [[a["answer_start"], a["text"]] for a in qa.get("answers", [])]
                pairs.append((qa["question"], paragraph["context"], json.dumps(answers)))
            if len(pairs) >= limit:
                return pairs[:limit]
    return pairs


def tokenize_batches(
    rows: list[tuple[str, ...]], tokenizer: BertTokenizer, max_seq_len: int, batch_size: int
) -> list[dict[str, np.ndarray]]:
    """Encode rows (pairs truncated on the second text) into batches padded to their longest row."""
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        firsts = [row[0] for row in chunk]
        seconds = [row[1] for row in chunk] if all(len(row) > 1 for row in chunk) else None
        truncation: Truncation = "only_second" if seconds is not None else "longest_first"
        batches.append(tokenizer(firsts, seconds, max_length=max_seq_len, truncation=truncation))
    return batches


def guard_set(
    task: str,
    tokenizer: BertTokenizer,
    max_seq_len: int,
    *,
    data_dir: Path | None = None,
    path: Path | None = None,
    limit: int = 256,
    batch_size: int = 32,
) -> GuardSet:
    """The guard inputs of `task`: a user file, else the real data set under `data_dir`, else built-ins."""
    rows, source = read_texts(task, data_dir, path, limit)
    gold = None
    if task == "qa" and rows and all(len(row) == 3 for row in rows):
        gold = qa_gold_spans(rows, tokenizer, max_seq_len, batch_size)
    return GuardSet(task, tokenize_batches(rows, tokenizer, max_seq_len, batch_size), source, gold)


def qa_gold_spans(
    rows: list[tuple[str, ...]], tokenizer: BertTokenizer, max_seq_len: int, batch_size: int
) -> list[list[list[tuple[int, int]]]]:
    """The gold answers of (question, context, answers-JSON) rows as token spans of their (truncated) window."""
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        encodings = tokenizer.encode_batch(
            [r[0] for r in chunk], [r[1] for r in chunk], max_length=max_seq_len, truncation="only_second"
        )
        spans = []
        for row, encoding in zip(chunk, encodings, strict=True):
            row_spans = []
            for answer_start, text in json.loads(row[2]):
                answer_end = answer_start + len(text)
                tokens = [
                    i
                    for i, ((begin, end), segment) in enumerate(zip(encoding.offsets, encoding.type_ids, strict=True))
                    if segment == 1 and end > begin and begin < answer_end and end > answer_start
                ]
                if tokens:
                    row_spans.append((tokens[0], tokens[-1]))
            spans.append(row_spans)
        batches.append(spans)
    return batches
