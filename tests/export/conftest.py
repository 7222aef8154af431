"""Fixtures shared by the export tests: tiny task models on disk and bundles built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bert_model.config import BertConfig
from bert_model.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "the",
    "a",
    "film",
    "good",
    "bad",
    "movie",
    "is",
    "was",
    "not",
    "very",
    "plot",
    "acting",
    "great",
    "boring",
    "and",
    "of",
    "to",
    "in",
    "it",
]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def tiny_config(**overrides: object) -> BertConfig:
    """vocab 99, hidden 32, 2 layers, 4 heads; 512 positions so that the benchmark's 384 fits."""
    values: dict = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
    }
    values.update(overrides)
    return BertConfig(**values)


def write_vocab(folder: Path) -> None:
    tokens = SPECIALS + WORDS
    tokens += [f"w{i}" for i in range(99 - len(tokens))]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")


def save_tiny(folder: Path, task: str, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    if task == "classify":
        model: torch.nn.Module = BertForSequenceClassification(tiny_config().with_labels(["negative", "positive"]))
    elif task == "ner":
        model = BertForTokenClassification(tiny_config().with_labels(NER_LABELS))
    else:
        model = BertForQuestionAnswering(tiny_config())
    # Larger head weights give clear margins, so the task-level guards are meaningful on a random model.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith(("classifier", "qa_outputs")) and parameter.dim() == 2:
                parameter.mul_(50)
    model.save_pretrained(folder)  # type: ignore[operator]
    write_vocab(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {task: save_tiny(root / f"tiny-{task}", task) for task in ("classify", "ner", "qa")}


@pytest.fixture(scope="session")
def tiny_bundle(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classify bundle of the tiny model with the three ONNX Runtime variants (built-in guard sentences)."""
    from export.bundle import build_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny-sst2"
    build_bundle(tiny_models["classify"], out, variants="cpu-fp32,cpu-int8,gpu-fp16", data_dir=Path("/nonexistent"))
    return out
