"""Fine-tuning from a folder of every family that `transformers` saves: RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA,
ALBERT (random tiny models, a few steps each).

A full fine-tune saves the family's own layout: our loader and `transformers` read it back to the trained model's
logits. A LoRA fine-tune saves a composite (base + adapter + head) that names the family's architecture and reloads
to the trained model's logits. The tokenizer is a WordPiece one saved beside the model with BERT's special tokens,
[PAD] at the model's pad_token_id (1 for RoBERTa and XLM-R, whose positions count from it): `BertTokenizer` does not
read the families' own byte-level BPE / Unigram tokenizer.json files yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import nn

from bert_model.adapters import LoRAConfig
from bert_model.config import FAMILIES, BertConfig
from bert_model.finetuning import run as run_module
from bert_model.finetuning.options import ClassifyOptions, FinetuneRun, NEROptions, QAOptions, TrainingOptions
from bert_model.finetuning.recipes import make_recipe
from bert_model.heads import BertForSequenceClassification
from bert_model.tokenization import BertTokenizer
from tests.bert_model.finetuning.conftest import FILLER, NEGATIVE, PEOPLE, PLACES, POSITIVE

transformers.utils.logging.disable_progress_bar()

SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "roberta": {**SIZES, "pad_token_id": 1, "type_vocab_size": 1, "max_position_embeddings": 66},
    "xlm-roberta": {**SIZES, "pad_token_id": 1, "type_vocab_size": 1, "max_position_embeddings": 66},
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37, "max_position_embeddings": 64},
    "electra": {**SIZES, "embedding_size": 16, "max_position_embeddings": 64},
    "albert": {**SIZES, "embedding_size": 16, "max_position_embeddings": 64},
}
WORDS = sorted({*FILLER, *POSITIVE, *NEGATIVE, *PEOPLE, *PLACES, "where", "did", "happen", ".", "?"})
TASKS = {
    "classify": ("sentiment_files", ClassifyOptions(max_seq_length=32, label_map={"0": "negative", "1": "positive"})),
    "qa": ("squad_files", QAOptions(max_seq_length=48, doc_stride=16, max_query_length=16)),
    "ner": ("conll_files", NEROptions(max_seq_length=32, stride=8)),
}


def family_folder(root: Path, family: str) -> Path:
    """A random tiny `<Family>ForMaskedLM` saved by transformers, and a WordPiece tokenizer with [PAD] at its
    pad_token_id."""
    folder = root / family
    if (folder / "config.json").is_file():
        return folder
    pad = FAMILY_CONFIGS[family].get("pad_token_id", 0)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if pad == 1:
        specials = ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"]  # RoBERTa's order: <s> <pad> </s> <unk>
    vocab = [*specials, *WORDS]
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizer.from_vocab(folder / "vocab.txt", model_max_length=64)
    assert tokenizer.pad_id == pad
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, vocab_size=len(vocab), **FAMILY_CONFIGS[family])
    model_class = getattr(transformers, FAMILIES[family].class_prefix + "ForMaskedLM")
    model_class(config).save_pretrained(folder)
    tokenizer.save(folder)
    return folder


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


def finetune_capturing(
    monkeypatch: pytest.MonkeyPatch, run: FinetuneRun
) -> tuple[dict[str, Any], nn.Module, BertTokenizer]:
    """Run `finetune` and keep the trained model as it was handed to `save_model`."""
    captured: dict[str, Any] = {}
    save_model = run_module.save_model

    def keep(model: nn.Module, *args: Any) -> None:
        captured["model"], captured["tokenizer"] = model, args[3]
        save_model(model, *args)

    monkeypatch.setattr(run_module, "save_model", keep)
    summary = run_module.finetune(run)
    return summary, captured["model"].eval(), captured["tokenizer"]


def task_run(task: str, model: Path, out: Path, request: pytest.FixtureRequest, lora: bool) -> FinetuneRun:
    fixture, options = TASKS[task]
    train, dev = request.getfixturevalue(fixture)
    training = TrainingOptions(
        max_steps=4, batch_size=16, learning_rate=3e-3, seed=1, lora=LoRAConfig(rank=2, alpha=4) if lora else None
    )
    return FinetuneRun(task, str(model), str(train), str(out), str(dev), training, options)


def sample_inputs(tokenizer: BertTokenizer, config: BertConfig) -> dict[str, torch.Tensor]:
    """A padded batch of two texts (single texts: every token in segment 0), with token types where the family
    has them."""
    arrays = tokenizer(["the good deck", "of and to in was awful for on"])
    names = ("input_ids", "attention_mask") + (("token_type_ids",) if config.family.has_token_types else ())
    return {name: torch.from_numpy(arrays[name]) for name in names}


def outputs(model: nn.Module, inputs: dict[str, torch.Tensor], task: str) -> torch.Tensor:
    with torch.no_grad():
        result = model(**inputs)
    if task == "qa":
        return torch.stack([result.start_logits, result.end_logits])
    return result.logits


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_full_finetune_saves_the_family_layout_that_transformers_reads(
    family: str, families: Path, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = family_folder(families, family)
    summary, trained, tokenizer = finetune_capturing(monkeypatch, task_run("classify", base, tmp_path, request, False))
    assert summary["steps"] == 4 and summary["eval"]["accuracy"] >= 0
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == family and saved["architectures"] == [trained.architecture]
    assert saved["architectures"][0].startswith(FAMILIES[family].class_prefix)
    inputs = sample_inputs(tokenizer, trained.config)
    expected = outputs(trained, inputs, "classify")
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    torch.testing.assert_close(outputs(ours, inputs, "classify"), expected, atol=1e-5, rtol=0)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(theirs(**inputs).logits.detach(), expected, atol=1e-4, rtol=0)


LORA_CASES = [(family, "classify") for family in sorted(FAMILY_CONFIGS)] + [
    (family, task) for family in ("roberta", "distilbert") for task in ("qa", "ner")
]


@pytest.mark.parametrize(("family", "task"), LORA_CASES)
def test_lora_composite_names_the_family_and_reloads_to_the_same_logits(
    family: str,
    task: str,
    families: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = family_folder(families, family)
    summary, trained, tokenizer = finetune_capturing(monkeypatch, task_run(task, base, tmp_path, request, True))
    assert summary["steps"] == 4
    assert not (tmp_path / "model.safetensors").exists() and (tmp_path / "adapter.safetensors").is_file()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [trained.architecture] and saved["model_type"] == family
    trainable = {name for name, p in trained.named_parameters() if p.requires_grad}
    if task == "classify" and FAMILIES[family].classifier_activation is not None:
        assert {"classifier.dense.weight", "classifier.out_proj.weight"} <= trainable  # the first-token head
    config = BertConfig.load(tmp_path)
    recipe = make_recipe(task, tokenizer, TASKS[task][1], config)
    reloaded = recipe.model_class().from_pretrained(tmp_path)
    assert reloaded.load_report.missing_head_keys == []
    inputs = sample_inputs(tokenizer, trained.config)
    # The adapter file stores factors, deltas and the head in float16.
    torch.testing.assert_close(outputs(reloaded, inputs, task), outputs(trained, inputs, task), atol=2e-3, rtol=0)


def test_pair_inputs_of_a_one_segment_family_are_read_as_one_segment(
    families: Path, squad_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """The BERT pair template gives the context segment id 1, which a RoBERTa model has no embedding for:
    fine-tuning and evaluation feed it segment 0 throughout, as RoBERTa's own tokenizer does."""
    base = family_folder(families, "roberta")
    training = TrainingOptions(max_steps=2, batch_size=8, seed=1)
    train, dev = (str(path) for path in squad_files)
    run = FinetuneRun("qa", str(base), train, str(tmp_path), dev, training, TASKS["qa"][1])
    summary = run_module.finetune(run)
    assert summary["eval"]["f1"] >= 0
    again = run_module.evaluate_model(str(tmp_path), None, squad_files[1])
    assert again["f1"] == pytest.approx(summary["eval"]["f1"], abs=1e-6)


def test_a_tokenizer_that_pads_with_another_id_is_refused(
    families: Path, sentiment_files: tuple[Path, Path], tmp_path: Path
) -> None:
    base = family_folder(families, "roberta")
    other = tmp_path / "other-tokenizer"
    other.mkdir()
    for name in ("config.json", "model.safetensors"):
        (other / name).write_bytes((base / name).read_bytes())
    (other / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    options = ClassifyOptions(max_seq_length=32)
    train, out = str(sentiment_files[0]), str(tmp_path / "out")
    run = FinetuneRun("classify", str(other), train, out, None, TrainingOptions(max_steps=1), options)
    with pytest.raises(ValueError, match="pads with id 0"):
        run_module.finetune(run)
    long = FinetuneRun("classify", str(base), train, out, None, TrainingOptions(max_steps=1), ClassifyOptions())
    with pytest.raises(ValueError, match="accepts \\(64 tokens\\)"):
        run_module.finetune(long)


def test_the_command_fine_tunes_a_distilbert_folder_with_lora(
    families: Path, sentiment_files: tuple[Path, Path], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from bertserve.cli import build_app

    base = family_folder(families, "distilbert")
    train, dev = (str(path) for path in sentiment_files)
    args = ["finetune", "classify", "--model", str(base), "--train", train, "--eval", dev, "--out", str(tmp_path)]
    args += ["--lora", "--lora-rank", "2", "--max-steps", "3", "--batch-size", "8", "--max-seq-length", "32"]
    result = CliRunner().invoke(build_app(), [*args, "--label-map", "0=negative,1=positive"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["steps"] == 3
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DistilBertForSequenceClassification"]
    result = CliRunner().invoke(build_app(), ["evaluate", str(tmp_path), "--data", dev])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["task"] == "classify"
