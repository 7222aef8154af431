"""What both training loops share: the metrics log, the schedule's shape and AdamW's parameter groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bert_model.config import BertConfig
from bert_model.heads import BertForSequenceClassification
from bert_model.training import MetricsLog, lr_multiplier, parameter_groups, read_metrics

TINY = BertConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, id2label={0: "a"}
)


def test_a_new_log_starts_empty_and_a_resumed_one_keeps_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"step": 1, "lr": 1.234567e-7})
    log.write({"step": 2, "eval": {"f1": 50.0}})
    assert read_metrics(path) == [{"step": 1, "lr": 1.234567e-7}, {"step": 2, "eval": {"f1": 50.0}}]
    resumed = MetricsLog(path, append=True)
    resumed.truncate_after(1)
    resumed.write({"step": 2, "lr": 0.5})
    assert read_metrics(path) == [{"step": 1, "lr": 1.234567e-7}, {"step": 2, "lr": 0.5}]
    MetricsLog(path)
    assert read_metrics(path) == []


def test_a_log_without_a_path_writes_nothing(tmp_path: Path) -> None:
    log = MetricsLog(None, append=True)
    log.write({"step": 1})
    log.truncate_after(0)
    assert list(tmp_path.iterdir()) == []


def test_schedule_without_warmup_decays_from_the_peak() -> None:
    assert [lr_multiplier(step, 0, 4) for step in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert lr_multiplier(5, 2, 4) == 0.0


def test_parameter_groups_take_only_trainable_parameters_and_spare_biases_and_layernorm() -> None:
    model = BertForSequenceClassification(TINY)
    for parameter in model.bert.embeddings.parameters():
        parameter.requires_grad = False
    decay, no_decay = parameter_groups(model, 0.01)
    decayed, spared = {id(p) for p in decay["params"]}, {id(p) for p in no_decay["params"]}
    assert decayed | spared == {id(p) for p in model.parameters() if p.requires_grad}
    assert len(decayed) + len(spared) == len(decay["params"]) + len(no_decay["params"])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert id(model.classifier.weight) in decayed and id(model.classifier.bias) in spared
    layer_norm = model.bert.encoder.layer[0].output.LayerNorm
    assert {id(layer_norm.weight), id(layer_norm.bias)} <= spared
    optimizer = torch.optim.AdamW([decay, no_decay], lr=1.0)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]


@pytest.mark.parametrize("steps", [1, 10])
def test_schedule_peaks_at_the_end_of_warmup(steps: int) -> None:
    assert lr_multiplier(steps - 1, steps, 100) == 1.0
