"""Reranker fine-tuning: the listwise loss, hard negatives mined from SQuAD articles, the reranking-list files, and a
tiny end-to-end run whose MRR@10 must beat the untrained head (read back by `evaluate` to the same figure)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_model.finetuning.negatives import (
    NegativeMiner,
    contains_answer,
    embed_texts,
    interleave,
    squad_articles,
)
from bert_model.finetuning.options import FinetuneRun, RerankOptions, TrainingOptions
from bert_model.finetuning.recipe import TrainSet
from bert_model.finetuning.rerank import RerankRecipe, read_rerank_groups
from bert_model.finetuning.run import evaluate_model, finetune
from bert_model.tasks.features import Feature
from bert_model.tasks.readers import SquadAnswer, SquadExample, read_ranking_lists
from bert_model.tokenization import BertTokenizer
from tests.bert_model.finetuning.conftest import FILLER, NEGATIVE, PLACES, POSITIVE

OPTIONS = RerankOptions(max_seq_length=48, negatives=3, eval_candidates=4, negatives_from="bm25")


def _passage(rng: random.Random, marker: list[str]) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randrange(6, 12))]
    words.insert(rng.randrange(len(words)), rng.choice(marker))
    return " ".join(words)


@pytest.fixture(scope="module")
def ranking_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Reranking lists whose relevant passage holds a positive word and whose negatives a negative one."""
    folder = tmp_path_factory.mktemp("rerank")
    rng = random.Random(3)
    paths = []
    for name, count in (("train.jsonl", 96), ("dev.jsonl", 48)):
        lines = []
        for _ in range(count):
            query = f"what happened in {rng.choice(PLACES)} ?"
            negatives = [_passage(rng, NEGATIVE) for _ in range(3)]
            lines.append(json.dumps({"query": query, "positive": _passage(rng, POSITIVE), "negatives": negatives}))
        (folder / name).write_text("\n".join(lines) + "\n")
        paths.append(folder / name)
    return paths[0], paths[1]


def test_tiny_rerank_finetune_beats_the_untrained_head(tiny_base, ranking_files, tmp_path) -> None:
    train, dev = ranking_files
    recipe = RerankRecipe(BertTokenizer.from_pretrained(tiny_base), OPTIONS)
    torch.manual_seed(42)
    untrained = recipe.model_class().from_pretrained(tiny_base, **recipe.config_overrides())
    before = recipe.evaluate(untrained, recipe.load_eval(dev)).metrics["mrr@10"]
    training = TrainingOptions(epochs=6, batch_size=8, learning_rate=1e-3, seed=42, log_every=10)
    summary = finetune(FinetuneRun("rerank", str(tiny_base), str(train), str(tmp_path), str(dev), training, OPTIONS))
    after = summary["eval"]["mrr@10"]
    assert after > before + 25, (before, after)
    assert summary["eval"]["recall@1"] > 80 and summary["eval"]["candidates"] == 4
    assert summary["train_features"] == 96 * 4  # every query trains with its positive and its three negatives
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["id2label"] == {"0": "LABEL_0"} and config["bertserve"]["task"]["name"] == "rerank"
    assert config["bertserve"]["task"]["max_seq_length"] == 48
    again = evaluate_model(str(tmp_path), None, dev, predictions=tmp_path / "rankings.jsonl")
    assert again["task"] == "rerank" and again["mrr@10"] == pytest.approx(after, abs=1e-6)
    first = json.loads((tmp_path / "rankings.jsonl").read_text().splitlines()[0])
    assert sorted(first["ranking"]) == [0, 1, 2, 3] and first["gold"] == 0


class FixedScores(torch.nn.Module):
    """A model whose logit for a row is the row's first token id (as a float)."""

    def forward(self, input_ids: torch.Tensor, attention_mask=None, token_type_ids=None):  # type: ignore[no-untyped-def]
        class Output:
            logits = input_ids[:, :1].float()

        return Output()


def test_the_loss_is_a_softmax_over_each_group_with_the_positive_as_target(tiny_base) -> None:
    """Groups of unequal size: the shorter one's padding takes no probability; the positive comes first whatever
    its place among the group's features."""
    recipe = RerankRecipe(BertTokenizer.from_pretrained(tiny_base))
    features = [Feature(0, [value], [0]) for value in (3, 1, 2, 5, 4)]
    train = TrainSet(features, [0, 1], 2, groups=[[0, 1, 2], [3, 4]])  # group 2's positive is its second feature
    inputs = recipe.batch(train, [0, 1])
    assert inputs["group_index"].tolist() == [[0, 1, 2], [3, 4, -1]]
    loss = recipe.loss(FixedScores(), inputs)
    expected = (
        -torch.log_softmax(torch.tensor([3.0, 1, 2]), 0)[0] - torch.log_softmax(torch.tensor([4.0, 5]), 0)[0]
    ) / 2
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


ARTICLES = {
    "rivers": [
        "The Danube flows through Vienna and Budapest before reaching the Black Sea.",
        "The Rhine rises in the Swiss Alps and flows to the North Sea near Rotterdam.",
        "The Rhine carries barges past Cologne; its delta lies in the Netherlands.",
        "Rivers in Europe were trade routes for centuries.",
        "The Thames flows through London.",
        "The Seine crosses Paris on its way to the Channel.",
    ],
    "planets": [
        "Mars has two moons, Phobos and Deimos.",
        "Jupiter is the largest planet of the solar system.",
    ],
}
QUESTIONS = [
    ("rivers", 0, "Which sea does the Danube reach?", "Black Sea"),
    ("rivers", 1, "Where does the Rhine rise?", "Swiss Alps"),
    ("rivers", 2, "Which city do the barges pass?", "Cologne"),
    ("rivers", 3, "What were the rivers of Europe used for?", "trade routes"),
    ("rivers", 4, "Which city does the Thames flow through?", "London"),
    ("rivers", 5, "Which city does the Seine cross?", "Paris"),
    ("planets", 0, "How many moons does Mars have?", "two"),
    ("planets", 1, "Which is the largest planet?", "Jupiter"),
]


@pytest.fixture(scope="module")
def squad_articles_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = []
    for title, paragraphs in ARTICLES.items():
        entries = []
        for index, context in enumerate(paragraphs):
            qas = [
                {
                    "id": question,
                    "question": question,
                    "answers": [{"text": answer, "answer_start": context.find(answer)}],
                }
                for t, p, question, answer in QUESTIONS
                if t == title and p == index
            ]
            entries.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": entries})
    path = tmp_path_factory.mktemp("squad") / "articles.json"
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


def test_bm25_negatives_come_from_the_article_first_and_never_hold_the_answer(squad_articles_file: Path) -> None:
    groups = read_rerank_groups(squad_articles_file, 3, OPTIONS)
    rivers, planets = ARTICLES["rivers"], ARTICLES["planets"]
    by_query = {group.query: group for group in groups}
    rhine = by_query["Where does the Rhine rise?"]
    # its own paragraph first; then the other Rhine paragraph (BM25's best match), then others of the article
    assert rhine.passages[:2] == [rivers[1], rivers[2]] and set(rhine.passages[2:]) <= set(rivers) - {rivers[1]}
    danube = by_query["Which sea does the Danube reach?"]
    assert danube.passages[0] == rivers[0] and set(danube.passages[1:]) <= set(rivers[1:])
    mars = by_query["How many moons does Mars have?"]
    # the article's one other paragraph, then two paragraphs of the other article to fill the group
    assert mars.passages[:2] == [planets[0], planets[1]] and set(mars.passages[2:]) <= set(rivers)
    assert all(len(group.passages) == 4 and group.gold == 0 for group in groups)


def test_a_paragraph_holding_the_answer_is_not_a_negative() -> None:
    assert contains_answer("It reached the Black Sea in spring.", ["black sea"])
    assert not contains_answer("There were 12 boats.", ["2"])  # whole words only
    examples = read_squad_like(
        ["Rome is in Italy.", "Italy borders France.", "Spain is sunny."], "Where is Rome?", "Italy"
    )
    (article,) = squad_articles(examples)
    negatives = NegativeMiner(["bm25"]).mine([article], 2)[0][0]  # the first question's, of the only article
    assert negatives == ["Spain is sunny."]  # the article has no other paragraph, and there is no other article


def read_squad_like(paragraphs: list[str], question: str, answer: str) -> list[SquadExample]:
    """One article: the question about the first paragraph, and a filler question about each other one."""
    start = paragraphs[0].find(answer)
    return [SquadExample("q", question, paragraphs[0], [SquadAnswer(answer, start)], False, "t")] + [
        SquadExample(f"x{i}", "filler?", text, [SquadAnswer(text[:4], 0)], False, "t")
        for i, text in enumerate(paragraphs[1:])
    ]


def test_interleave_takes_each_ranking_in_turn_once() -> None:
    assert interleave([[3, 1, 2], [1, 4]]) == [3, 1, 4, 2]
    assert interleave([]) == []


def test_embedding_negatives_follow_the_embedding_models_cosine(tiny_base, squad_articles_file: Path) -> None:
    options = RerankOptions(max_seq_length=48, negatives=3, negatives_from="embeddings", embedding_model=str(tiny_base))
    groups = read_rerank_groups(squad_articles_file, 3, options)
    danube = next(group for group in groups if group.query.startswith("Which sea"))
    rivers = ARTICLES["rivers"]
    vectors = embed_texts(str(tiny_base), [danube.query, *rivers])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = vectors[1:] @ vectors[0]
    expected = [rivers[i] for i in np.argsort(-cosine, kind="stable") if i != 0]
    assert danube.passages[1:] == expected[:3]


def test_ranking_list_files_name_the_bad_line(tmp_path) -> None:
    path = tmp_path / "lists.jsonl"
    path.write_text('{"query": "q", "positive": "p", "negatives": ["a", "b", "c"]}\n\n{"query": "q", "positive": ""}\n')
    with pytest.raises(ValueError, match=r"lists.jsonl:3: query and positive must be non-empty strings"):
        read_ranking_lists(path)
    path.write_text('{"query": "q", "positive": "p", "negatives": ["a", "b", "c"]}\n')
    (only,) = read_ranking_lists(path, negatives=2)
    assert only.passages == ["p", "a", "b"] and only.gold == 0
