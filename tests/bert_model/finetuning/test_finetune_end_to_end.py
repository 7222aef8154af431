"""A tiny end-to-end fine-tune per task: the metric must beat the untrained head, and `evaluate` must read the
saved model back to the same figure (it uses the same bert_model.tasks code as the service)."""

from __future__ import annotations

import json

import pytest
import torch

from bert_model.finetuning.options import ClassifyOptions, FinetuneRun, NEROptions, QAOptions, TrainingOptions
from bert_model.finetuning.recipes import make_recipe
from bert_model.finetuning.run import evaluate_model, finetune
from bert_model.heads import BertForSequenceClassification
from bert_model.tokenization import BertTokenizer
from bert_model.weights import read_state_dict

CASES = {
    "classify": ("sentiment_files", ClassifyOptions(max_seq_length=32, label_map={"0": "negative", "1": "positive"})),
    "qa": ("squad_files", QAOptions(max_seq_length=64, doc_stride=16, max_query_length=16)),
    "ner": ("conll_files", NEROptions(max_seq_length=32, stride=8)),
}
PRIMARY = {"classify": "accuracy", "qa": "f1", "ner": "f1"}


def untrained_score(task, base, options, train, dev) -> float:
    recipe = make_recipe(task, BertTokenizer.from_pretrained(base), options)
    recipe.load_train(train)
    torch.manual_seed(42)
    model = recipe.model_class().from_pretrained(base, **recipe.config_overrides())
    return float(recipe.evaluate(model, recipe.load_eval(dev)).metrics[PRIMARY[task]])


@pytest.mark.parametrize("task", sorted(CASES))
def test_tiny_finetune_beats_the_untrained_head(task, tiny_base, request, tmp_path) -> None:
    fixture, options = CASES[task]
    train, dev = request.getfixturevalue(fixture)
    before = untrained_score(task, tiny_base, options, train, dev)
    training = TrainingOptions(epochs=4, batch_size=16, learning_rate=1e-3, seed=42, log_every=10)
    summary = finetune(FinetuneRun(task, str(tiny_base), str(train), str(tmp_path), str(dev), training, options))
    after = summary["eval"][PRIMARY[task]]
    assert after > before + 25, (before, after)
    assert summary["best_step"] is not None
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("train_loss" in line for line in lines) and lines[-1]["final"] is True
    assert len([line for line in lines if "eval" in line and not line.get("final")]) == 4  # one per epoch
    again = evaluate_model(str(tmp_path), None, dev, predictions=tmp_path / "predictions.out")
    assert again[PRIMARY[task]] == pytest.approx(after, abs=1e-6)
    assert (tmp_path / "predictions.out").stat().st_size > 0


def test_lora_composite_is_small_and_loads_by_path(tiny_base, sentiment_files, tmp_path) -> None:
    from bert_model.adapters import LoRAConfig

    train, dev = sentiment_files
    options = ClassifyOptions(max_seq_length=32, label_map={"0": "negative", "1": "positive"})
    training = TrainingOptions(epochs=4, batch_size=16, learning_rate=3e-3, lora=LoRAConfig(rank=4, alpha=8))
    summary = finetune(FinetuneRun("classify", str(tiny_base), str(train), str(tmp_path), str(dev), training, options))
    base_parameters = sum(t.numel() for t in read_state_dict(tiny_base).values())
    assert 0 < summary["trainable_parameters"] < 0.1 * base_parameters
    assert not (tmp_path / "model.safetensors").exists()
    assert (tmp_path / "adapter.safetensors").stat().st_size < 0.1 * (tiny_base / "model.safetensors").stat().st_size
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["bertserve"]["base_model"] == str(tiny_base) and config["id2label"] == {
        "0": "negative",
        "1": "positive",
    }
    model = BertForSequenceClassification.from_pretrained(tmp_path)
    assert model.load_report is not None and not model.load_report.missing_head_keys
    again = evaluate_model(str(tmp_path), "classify", dev)
    assert again["accuracy"] == pytest.approx(summary["eval"]["accuracy"], abs=2.0)  # float16 storage


def test_evaluate_reports_unknown_labels_and_wrong_task(tiny_base, sentiment_files, conll_files, tmp_path) -> None:
    train = sentiment_files[0]
    training = TrainingOptions(max_steps=2, batch_size=8)
    finetune(
        FinetuneRun(
            "classify", str(tiny_base), str(train), str(tmp_path), None, training, ClassifyOptions(max_seq_length=32)
        )
    )
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\nfine\t1\nodd\t7\n")
    with pytest.raises(
        ValueError, match=r"bad.tsv: 1 example\(s\) have labels the model does not know \(line 3: '7'\)"
    ):
        evaluate_model(str(tmp_path), None, bad)
    with pytest.raises(ValueError, match="fine-tuned for 'classify', not 'ner'"):
        evaluate_model(str(tmp_path), "ner", conll_files[1])
