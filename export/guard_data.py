"""Where the accuracy guards' inputs come from: the real data sets per task, a user's text file, built-in texts.

Data files under the data folder (../shared/data), by task; they are labelled, so `export/task_guard.py` scores
them as eval sets (SQuAD F1, seqeval entity F1, labels) and falls back to their texts alone when the model cannot
score them (e.g. a NER model with other entity types):
- classify / embed / fill-mask: GLUE SST-2 sentences (`sst2/dev.half-a.tsv`, `sentence<TAB>label` with a header;
  not in the pretraining demo's corpus, so held out for a model `bertserve pretrain` wrote);
- ner: CoNLL-2003 validation sentences (`conll2003/iob2/valid.txt`, one `token POS chunk TAG` per line);
- qa: SQuAD v1.1 questions with their paragraphs (`squad_v1.1/dev-v1.1.half-a.json`, official format);
- rerank: the same SQuAD questions, each with a candidate list of its own paragraph and the paragraphs that follow
  it in its article (`ranking_lists`).
embed also retrieves: SQuAD v1.1 questions against the paragraphs they were asked about (`RETRIEVAL_FILE`).
A calibration file given by path is one input per line; a tab separates a text pair (question<TAB>context for
qa, query<TAB>passage for rerank, consecutive lines of one query forming its list). Without any of them, the
built-in sentences below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bert_model.finetuning.recipe import subset
from bert_model.tasks.readers import RankingList, read_ranking_lists

DATA_FILES: dict[str, str] = {
    "classify": "sst2/dev.half-a.tsv",
    "embed": "sst2/dev.half-a.tsv",
    "fill-mask": "sst2/dev.half-a.tsv",
    "ner": "conll2003/iob2/valid.txt",
    "qa": "squad_v1.1/dev-v1.1.half-a.json",
    "rerank": "squad_v1.1/dev-v1.1.half-a.json",
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


def ranking_lists(
    data_dir: Path | None, eval_data: Path | None, calibration: Path | None, limit: int, candidates: int
) -> tuple[list[RankingList], str]:
    """Up to `limit` queries, each with a list of at most `candidates` passages, and a description of their source:
    `eval_data` (SQuAD JSON, or reranking JSON lines), else `calibration` (query<TAB>passage lines), else SQuAD
    under `data_dir`, else the built-in questions against the built-in texts (the Normandy paragraph relevant)."""
    if eval_data is not None:
        path = Path(eval_data)
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            lists = read_ranking_lists(path, candidates - 1)
            return [lists[i] for i in subset(len(lists), limit)], str(path)
        return _squad_lists(path, limit, candidates), str(path)
    if calibration is not None:
        return _calibration_lists(calibration)[:limit], str(calibration)
    default = default_eval_file("rerank", data_dir)
    if default is not None:
        return _squad_lists(default, limit, candidates), str(default)
    passages = [BUILTIN_CONTEXT, *BUILTIN_TEXTS[: candidates - 1]]
    return [RankingList(question, passages) for question in BUILTIN_QUESTIONS], "built-in questions and sentences"


def _squad_lists(path: Path, limit: int, candidates: int) -> list[RankingList]:
    """`limit` questions evenly spaced over the file, each with its paragraph and the next `candidates` - 1
    paragraphs of its article (wrapping around to its first): neighbours on the same subject, the near misses a
    reranker has to order."""
    asked: list[tuple[str, list[str], int]] = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        contexts = [paragraph["context"] for paragraph in article["paragraphs"]]
        for index, paragraph in enumerate(article["paragraphs"]):
            asked += [(qa["question"], contexts, index) for qa in paragraph["qas"]]
    lists = []
    for pick in subset(len(asked), limit):
        question, contexts, index = asked[pick]
        count = min(candidates, len(contexts))
        lists.append(RankingList(question, [contexts[(index + step) % len(contexts)] for step in range(count)]))
    return lists


def _calibration_lists(path: Path) -> list[RankingList]:
    """query<TAB>passage lines; consecutive lines of the same query are one list (no relevant passage known)."""
    if not path.is_file():
        raise FileNotFoundError(f"calibration file {path} does not exist")
    lists: list[RankingList] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        query, tab, passage = line.partition("\t")
        if not tab or not query.strip() or not passage.strip():
            raise ValueError(f"{path}:{number}: a rerank calibration line is query<TAB>passage")
        if lists and lists[-1].query == query:
            lists[-1].passages.append(passage)
        else:
            lists.append(RankingList(query, [passage], gold=None))
    if not lists:
        raise ValueError(f"calibration file {path} holds no input lines")
    return lists
