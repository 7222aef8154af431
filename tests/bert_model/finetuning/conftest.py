"""Fixtures for fine-tuning tests: a tiny random BERT over the real MiniLM vocabulary, and synthetic data sets
that such a model learns in seconds (the point is the pipeline, not the model)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from bert_model.config import BertConfig
from bert_model.modeling import BertModel
from bert_model.tokenization import BertTokenizer

FILLER = "the a of and to in was for on with as by at from his that it were this".split()  # noqa: SIM905
POSITIVE = ["good", "great", "excellent", "wonderful", "superb", "lovely"]
NEGATIVE = ["bad", "awful", "terrible", "boring", "dreadful", "dull"]
PEOPLE = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
PLACES = ["paris", "london", "berlin", "madrid", "rome", "vienna", "oslo", "lisbon"]


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer, 64-wide BERT with MiniLM's uncased vocabulary."""
    try:
        tokenizer = BertTokenizer.from_pretrained("minilm")
    except FileNotFoundError as error:
        pytest.skip(f"the embedded minilm tokenizer is not installed: {error}")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    folder = tmp_path_factory.mktemp("tiny-base")
    BertModel(config).save_pretrained(folder)
    tokenizer.save(folder)
    return folder


def _sentence(rng: random.Random, words: list[str], length: int = 8) -> list[str]:
    return [rng.choice(words) for _ in range(length)]


@pytest.fixture(scope="session")
def sentiment_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("sentiment")
    rng = random.Random(0)
    paths = []
    for name, count in (("train.tsv", 256), ("dev.tsv", 64)):
        lines = ["sentence\tlabel"]
        for index in range(count):
            label = index % 2
            words = _sentence(rng, FILLER, 6)
            words.insert(rng.randrange(len(words)), rng.choice(POSITIVE if label else NEGATIVE))
            lines.append(" ".join(words) + f"\t{label}")
        (folder / name).write_text("\n".join(lines) + "\n")
        paths.append(folder / name)
    return paths[0], paths[1]


@pytest.fixture(scope="session")
def squad_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Questions whose answer is the one place name of the context."""
    folder = tmp_path_factory.mktemp("squad")
    rng = random.Random(1)
    paths = []
    for name, count in (("train.json", 192), ("dev.json", 48)):
        paragraphs = []
        for index in range(count):
            words = _sentence(rng, FILLER + PEOPLE, rng.randrange(10, 40))
            position = rng.randrange(len(words))
            words.insert(position, rng.choice(PLACES))
            context = " ".join(words) + " ."
            start = len(" ".join(words[:position])) + (1 if position else 0)
            qa = {
                "id": f"{name}-{index}",
                "question": "where did it happen ?",
                "answers": [{"text": words[position], "answer_start": start}],
            }
            paragraphs.append({"context": context, "qas": [qa]})
        (folder / name).write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
        paths.append(folder / name)
    return paths[0], paths[1]


@pytest.fixture(scope="session")
def conll_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """IOB1 CoNLL files: person and place names among filler words."""
    folder = tmp_path_factory.mktemp("conll")
    rng = random.Random(2)
    paths = []
    for name, count in (("train.txt", 256), ("valid.txt", 64)):
        lines = ["-DOCSTART- -X- O O", ""]
        for _ in range(count):
            for word in _sentence(rng, FILLER + PEOPLE + PLACES, rng.randrange(4, 12)):
                tag = "I-PER" if word in PEOPLE else "I-LOC" if word in PLACES else "O"
                lines.append(f"{word.capitalize() if tag != 'O' else word} X X {tag}")
            lines.append("")
        (folder / name).write_text("\n".join(lines))
        paths.append(folder / name)
    return paths[0], paths[1]
