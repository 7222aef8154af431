"""Where the accuracy guards' inputs come from: the real data sets per task, a user's text file, built-in texts.

Data files under the data folder (../shared/data), by task; they are labelled, so `export/task_guard.py` scores
them as eval sets (SQuAD F1, seqeval entity F1, labels) and falls back to their texts alone when the model cannot
score them (e.g. a NER model with other entity types):
- classify / embed / fill-mask: GLUE SST-2 sentences (`sst2/dev.half-a.tsv`, `sentence<TAB>label` with a header;
  not in the pretraining demo's corpus, so held out for a model `bertserve pretrain` wrote);
- ner: CoNLL-2003 validation sentences (`conll2003/iob2/valid.txt`, one `token POS chunk TAG` per line);
- qa: SQuAD v1.1 questions with their paragraphs (`squad_v1.1/dev-v1.1.half-a.json`, official format).
embed also retrieves: SQuAD v1.1 questions against the paragraphs they were asked about (`RETRIEVAL_FILE`).
A calibration file given by path is one input per line; a tab separates a text pair (question<TAB>context for
qa). Without any of them, the built-in sentences below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA_FILES: dict[str, str] = {
    "classify": "sst2/dev.half-a.tsv",
    "embed": "sst2/dev.half-a.tsv",
    "fill-mask": "sst2/dev.half-a.tsv",
    "ner": "conll2003/iob2/valid.txt",
    "qa": "squad_v1.1/dev-v1.1.half-a.json",
}
RETRIEVAL_FILE = "squad_v1.1/dev-v1.1.half-a.json"
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


def default_eval_file(task: str, data_dir: Path | None) -> Path | None:
    """The real data file of `task` under `data_dir`, when it exists."""
    candidate = data_dir / DATA_FILES[task] if data_dir is not None and task in DATA_FILES else None
    return candidate if candidate is not None and candidate.is_file() else None


def read_texts(task: str, data_dir: Path | None, path: Path | None, limit: int) -> tuple[list[tuple[str, ...]], str]:
    """Up to `limit` inputs (a text, or a text pair) for `task`, and a description of their source."""
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"calibration file {path} does not exist")
        rows = [tuple(line.split("\t")[:2]) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not rows:
            raise ValueError(f"calibration file {path} holds no input lines")
        return rows[:limit], str(path)
    candidate = default_eval_file(task, data_dir)
    if candidate is not None:
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
                pairs.append((qa["question"], paragraph["context"]))
            if len(pairs) >= limit:
                return pairs[:limit]
    return pairs


@dataclass
class RetrievalSample:
    """Questions, the paragraphs they were asked about, and which paragraph answers each question."""

    questions: list[str]
    paragraphs: list[str]
    gold: list[int]
    """Per question, the index of its paragraph in `paragraphs`."""
    source: str


def retrieval_sample(data_dir: Path | None, paragraphs: int, questions: int) -> RetrievalSample | None:
    """The first `paragraphs` paragraphs of SQuAD v1.1 dev-half-a (neighbouring paragraphs of one article are
    the hard negatives) and up to `questions` of their questions, spread over the paragraphs; None without the file."""
    path = data_dir / RETRIEVAL_FILE if data_dir is not None else None
    if path is None or not path.is_file():
        return None
    contexts: list[str] = []
    asked: list[list[str]] = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            contexts.append(paragraph["context"])
            asked.append([qa["question"] for qa in paragraph["qas"]])
            if len(contexts) == paragraphs:
                break
        if len(contexts) == paragraphs:
            break
    sample = RetrievalSample([], contexts, [], str(path))
    for depth in range(max(len(q) for q in asked)):  # round robin: each paragraph's first question, then second...
        for index, texts in enumerate(asked):
            if depth < len(texts) and len(sample.questions) < questions:
                sample.questions.append(texts[depth])
                sample.gold.append(index)
    return sample
