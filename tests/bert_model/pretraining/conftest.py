"""Fixtures of the pretraining tests: a small synthetic corpus, its trained vocabulary, a data folder built from
it, and a tiny model config (hidden 32, 2 layers, 4 heads) as a config.json."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bert_model.pretraining.build import DataOptions, build_pretraining_data
from bert_model.pretraining.vocab import train_wordpiece
from bert_model.tokenization import BertTokenizer

TOPICS = {
    "sea": "ship sail wave harbour captain storm fish salt deck anchor",
    "farm": "cow field wheat barn tractor harvest farmer hay goat orchard",
    "city": "street tram tower market traffic mayor bridge square office crowd",
    "war": "army siege castle knight sword banner battle king soldier horse",
}
VERBS = ("sees", "likes", "carries", "finds", "watches", "builds", "paints", "follows")


def synthetic_corpus(documents: int, seed: int = 0) -> str:
    """Documents of 3-9 sentences on one topic each, blank lines between documents (so NSP is learnable)."""
    rng = random.Random(seed)
    blocks = []
    for index in range(documents):
        words = TOPICS[rng.choice(sorted(TOPICS))].split()
        sentences = [
            f"The {rng.choice(words)} {rng.choice(VERBS)} the {rng.choice(words)} near the {rng.choice(words)}."
            for _ in range(rng.randint(3, 9))
        ]
        sentences[0] = f"Story{index % 50} begins. " + sentences[0]
        blocks.append(" ".join(sentences[:2]) + "\n" + "\n".join(sentences[2:]))
    return "\n\n".join(blocks) + "\n"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and OpenMP threads that spin-wait on a busy shared machine slow
    them down by 5-10x; subprocesses get OMP_NUM_THREADS=1 for the same reason."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(synthetic_corpus(240), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer(corpus_file: Path) -> BertTokenizer:
    return train_wordpiece([corpus_file], vocab_size=120, model_max_length=64)


@pytest.fixture(scope="session")
def data_folder(corpus_file: Path, tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dynamic masking, 10% of documents held out, sequences of 48 tokens."""
    out = tmp_path_factory.mktemp("data")
    options = DataOptions(max_seq_length=48, dupe_factor=2, dynamic_masking=True, eval_fraction=0.1, seed=3)
    build_pretraining_data([corpus_file], tokenizer, out, options, overwrite=True)
    return out


@pytest.fixture(scope="session")
def tiny_config(tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "config.json"
    config = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "model_type": "bert",
    }
    path.write_text(json.dumps(config))
    return path
