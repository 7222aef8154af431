"""The embedded default task models: small, loadable by name on a fresh clone, and sensible on easy inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_model.finetuning.default_models import SHIPPED_FILES, SIZE_LIMIT, recipes
from bert_model.registry import PRETRAINED_DIR, TASK_MODELS
from bert_model.tokenization import BertTokenizer


def built(name: str):
    folder = PRETRAINED_DIR / name
    if not (folder / "config.json").is_file():
        pytest.skip(f"{name} is not built: run `make default-models`")
    return folder


def test_every_registered_default_model_has_a_recipe_on_existing_data(data_dir) -> None:
    assert set(recipes()) == set(TASK_MODELS)
    for name, recipe in recipes().items():
        assert recipe.task == TASK_MODELS[name]
        assert (data_dir / recipe.train).is_file() and (data_dir / recipe.eval).is_file()
        assert recipe.training.lora is not None  # composites: a few MB, never full weight copies


@pytest.mark.parametrize("name", sorted(TASK_MODELS))
def test_default_model_folders_are_small_composites(name) -> None:
    folder = built(name)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*SHIPPED_FILES, "training.json"])
    assert sum(p.stat().st_size for p in folder.iterdir()) <= SIZE_LIMIT
    config = json.loads((folder / "config.json").read_text())
    assert config["bertserve"]["base_model"] == "minilm"
    assert config["bertserve"]["task"]["name"] == TASK_MODELS[name]
    record = json.loads((folder / "training.json").read_text())
    assert record["seed"] == 42 and record["validation"]


def features_and_rows(name, build, *args, **kwargs):
    from bert_model.finetuning.inference import predict_rows
    from bert_model.finetuning.recipes import make_recipe
    from bert_model.heads import MODEL_CLASSES

    folder = built(name)
    tokenizer = BertTokenizer.from_pretrained(folder)
    recipe = make_recipe(TASK_MODELS[name], tokenizer, None)
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = MODEL_CLASSES[architecture].from_pretrained(name)
    features = build(tokenizer, *args, **kwargs)
    return features, predict_rows(model, features, recipe.output_names, pad_id=tokenizer.pad_id)


def test_minilm_sst2_reads_obvious_sentiment() -> None:
    from bert_model.tasks import build_classification_features, classification_postprocess

    texts = ["a wonderful , moving film with superb acting .", "a dull , tedious and painfully boring mess ."]
    features, rows = features_and_rows("minilm-sst2", build_classification_features, texts)
    results = classification_postprocess(features, rows["logits"], ["negative", "positive"])
    assert [results[i][0]["label"] for i in range(2)] == ["positive", "negative"]


def test_minilm_conll03_finds_people_and_places() -> None:
    from bert_model.tasks import ner_postprocess

    text = "Angela Merkel met Emmanuel Macron in Paris on Tuesday."
    from bert_model.tasks import build_ner_features

    features, rows = features_and_rows("minilm-conll03", build_ner_features, [text])
    labels = json.loads((PRETRAINED_DIR / "minilm-conll03" / "config.json").read_text())["id2label"]
    entities = ner_postprocess(
        features, rows["logits"], [labels[str(i)] for i in range(len(labels))], aggregation_strategy="first"
    )[0]
    found = {(e["entity_group"], e["word"]) for e in entities}
    assert {("PER", "Angela Merkel"), ("LOC", "Paris")} <= found
    assert all(text[e["start"] : e["end"]] == e["word"] for e in entities)


def test_minilm_squad_answers_a_simple_question() -> None:
    from bert_model.tasks import build_qa_features, qa_postprocess

    context = "The Eiffel Tower was completed in 1889. It stands in Paris and is 330 metres tall."
    features, rows = features_and_rows(
        "minilm-squad", build_qa_features, ["When was the Eiffel Tower completed?"], [context]
    )
    ((answer, *_),) = qa_postprocess(features, rows["start_logits"], rows["end_logits"]).values()
    assert answer["answer"] == "1889" and np.isfinite(answer["score"])


def test_minilm_rerank_puts_the_answering_passage_first() -> None:
    from bert_model.tasks.rerank import build_rerank_features, rerank_postprocess

    query = "When was the Eiffel Tower completed?"
    passages = [
        "The Louvre is the world's most visited museum and holds the Mona Lisa.",
        "The Eiffel Tower was completed in 1889 for the World's Fair and stands 330 metres tall.",
        "Paris hosted the Summer Olympics in 1900, 1924 and 2024.",
        "Construction of Notre-Dame began in 1163 and was largely finished by 1260.",
    ]
    features, rows = features_and_rows("minilm-rerank", build_rerank_features, query, passages)
    ranks = rerank_postprocess(features, rows["logits"])
    assert ranks[0]["index"] == 1 and sorted(rank["index"] for rank in ranks) == [0, 1, 2, 3]
