"""Hard negatives for reranker training: for each SQuAD question, the other paragraphs of its article, hardest first.

A reranker is trained to reorder what its first stage retrieves, so its negatives should be what that stage ranks
high (Gao et al. 2021, "Rethink Training of BERT Rerankers in Multi-Stage Retrieval Pipeline", section 3: negatives
sampled from the retriever's top results). Two rankings of the article's paragraphs are interleaved, best first:

- `embeddings`: cosine between the question's and each paragraph's sentence vectors from the embedding model the
  reranker sits behind (mean pooling under the attention mask, unit length, as sentence-transformers computes them);
- `bm25`: BM25 (Robertson & Zaragoza 2009; `rank_bm25.BM25Okapi`, k1 1.5, b 0.75) of the question's words over the
  article's paragraphs, the lexical matches a dense retriever misses.

A paragraph that contains one of the question's reference answers (as whole words, case-insensitive) is not a
negative: it may well answer the question too (DPR, Karpukhin et al. 2020, section 5.2, drops such negatives).
When an article has too few paragraphs left, paragraphs of other articles (chosen with a seeded generator) fill
the list up: easy negatives, but the query keeps its full group.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bert_model.finetuning.batching import inference_batches, model_inputs
from bert_model.registry import resolve_model_path
from bert_model.tasks.classification import build_classification_features
from bert_model.tasks.embeddings import l2_normalize, pool
from bert_model.tasks.readers import SquadExample
from bert_model.tokenization import BertTokenizer

EMBEDDING_MAX_SEQ_LENGTH = 256
"""Tokens an embedding model reads when its folder does not say (sentence-transformers' `max_seq_length` of
all-MiniLM-L6-v2)."""
WORD = re.compile(r"\w+")


@dataclass
class Question:
    text: str
    paragraph: int
    """Index of its paragraph in the article."""
    answers: list[str] = field(default_factory=list)


@dataclass
class Article:
    """One article's paragraphs and the questions asked about them."""

    paragraphs: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def squad_articles(examples: Sequence[SquadExample]) -> list[Article]:
    """The examples grouped into articles (by title, in file order), each paragraph once."""
    articles: dict[str, Article] = {}
    places: dict[tuple[str, str], int] = {}
    for example in examples:
        article = articles.setdefault(example.title, Article())
        key = (example.title, example.context)
        if key not in places:
            places[key] = len(article.paragraphs)
            article.paragraphs.append(example.context)
        answers = [answer.text for answer in example.answers]
        article.questions.append(Question(example.question, places[key], answers))
    return list(articles.values())


class NegativeMiner:
    """Ranks each question's candidate negatives within its article (see the module docstring)."""

    def __init__(self, sources: Sequence[str], embedding_model: str = "minilm", seed: int = 0) -> None:
        self.sources = list(sources)
        self.embedding_model = embedding_model
        self.rng = np.random.default_rng(seed)

    def mine(self, articles: Sequence[Article], count: int) -> list[list[list[str]]]:
        """Per article, per question: `count` negative paragraphs, hardest first."""
        rankings = {source: self._rankings(source, articles) for source in self.sources}
        pool_of_all = [(a, p) for a, article in enumerate(articles) for p in range(len(article.paragraphs))]
        mined: list[list[list[str]]] = []
        for a, article in enumerate(articles):
            per_question = []
            for q, question in enumerate(article.questions):
                ranked = interleave([rankings[source][a][q] for source in self.sources])
                negatives = [article.paragraphs[p] for p in ranked if p != question.paragraph]
                negatives = [text for text in negatives if not contains_answer(text, question.answers)][:count]
                negatives += self._others(articles, pool_of_all, a, count - len(negatives))
                per_question.append(negatives)
            mined.append(per_question)
        return mined

    def _rankings(self, source: str, articles: Sequence[Article]) -> list[list[list[int]]]:
        if source == "bm25":
            return [bm25_rankings(article) for article in articles]
        if source == "embeddings":
            return embedding_rankings(articles, self.embedding_model)
        raise ValueError(f"unknown negative source {source!r}")

    def _others(
        self, articles: Sequence[Article], pool_of_all: list[tuple[int, int]], own: int, count: int
    ) -> list[str]:
        """`count` paragraphs of articles other than `own`, drawn without replacement."""
        if count <= 0:
            return []
        others = [item for item in pool_of_all if item[0] != own]
        picks = self.rng.choice(len(others), size=min(count, len(others)), replace=False)
        return [articles[others[i][0]].paragraphs[others[i][1]] for i in picks]


def interleave(rankings: Sequence[Sequence[int]]) -> list[int]:
    """The rankings merged round-robin (first of each, then second of each, ...), each item once."""
    merged: dict[int, None] = {}
    for depth in range(max((len(r) for r in rankings), default=0)):
        for ranking in rankings:
            if depth < len(ranking):
                merged.setdefault(ranking[depth], None)
    return list(merged)


def contains_answer(paragraph: str, answers: Sequence[str]) -> bool:
    """Whether `paragraph` holds one of `answers` as whole words (case-insensitive)."""
    lowered = paragraph.lower()
    for answer in answers:
        text = answer.strip().lower()
        if text and re.search(rf"(?<!\w){re.escape(text)}(?!\w)", lowered):
            return True
    return False


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def bm25_rankings(article: Article) -> list[list[int]]:
    """Per question: the article's paragraph indices by BM25 score of the question, best first."""
    from rank_bm25 import BM25Okapi  # the train extra

    index = BM25Okapi([words(paragraph) for paragraph in article.paragraphs])
    ranked = []
    for question in article.questions:
        scores = index.get_scores(words(question.text))
        ranked.append(np.argsort(-scores, kind="stable").tolist())
    return ranked


def embedding_rankings(articles: Sequence[Article], model: str, batch_size: int = 64) -> list[list[list[int]]]:
    """Per article, per question: the article's paragraph indices by cosine to the question, best first."""
    paragraphs = [p for article in articles for p in article.paragraphs]
    questions = [q.text for article in articles for q in article.questions]
    vectors = embed_texts(model, paragraphs + questions, batch_size=batch_size)
    paragraph_vectors, question_vectors = vectors[: len(paragraphs)], vectors[len(paragraphs) :]
    ranked: list[list[list[int]]] = []
    p0 = q0 = 0
    for article in articles:
        own = paragraph_vectors[p0 : p0 + len(article.paragraphs)]  # (P, H)
        asked = question_vectors[q0 : q0 + len(article.questions)]  # (Q, H)
        ranked.append(np.argsort(-(asked @ own.T), axis=1, kind="stable").tolist())
        p0, q0 = p0 + len(article.paragraphs), q0 + len(article.questions)
    return ranked


def embed_texts(model_name: str, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """(N, H) unit sentence vectors of `texts` from the encoder `model_name` (mean pooling under the mask), each
    cut to the model's sentence length."""
    from bert_model.modeling import BertModel

    folder = resolve_model_path(model_name)
    tokenizer = BertTokenizer.from_pretrained(folder)
    encoder = BertModel.from_pretrained(folder).eval()
    length = min(sentence_length(folder), encoder.config.max_sequence_length)
    features = build_classification_features(tokenizer, list(texts), max_seq_length=length)
    vectors = np.zeros((len(features), encoder.config.hidden_size), dtype=np.float32)
    batches = inference_batches([len(f) for f in features], batch_size)
    with torch.inference_mode():
        for batch in tqdm(batches, desc="embed", unit="batch", leave=False, mininterval=5.0):
            inputs = model_inputs([features[i] for i in batch], tokenizer.pad_id)
            states = encoder(**inputs).last_hidden_state.float().numpy()  # (B, S, H)
            vectors[batch] = pool(states, inputs["attention_mask"].numpy(), "mean")
    return l2_normalize(vectors)


def sentence_length(folder: Path) -> int:
    """The sentence-transformers `max_seq_length` of an encoder folder, else EMBEDDING_MAX_SEQ_LENGTH."""
    config = folder / "sentence_bert_config.json"
    if config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("max_seq_length")
        if isinstance(value, int) and value >= 8:
            return value
    return EMBEDDING_MAX_SEQ_LENGTH
