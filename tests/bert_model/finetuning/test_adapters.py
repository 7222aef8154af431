"""LoRA layers, merging, and composite folders (base + adapter + head) loaded by the checkpoint loader."""

from __future__ import annotations

import json

import pytest
import torch

from bert_model.adapters import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    merge_lora,
    save_composite,
    trainable_parameter_count,
)
from bert_model.config import BertConfig
from bert_model.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bert_model.modeling import BertModel
from bert_model.weights import read_state_dict

TINY = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


@pytest.fixture
def base_folder(tmp_path):
    torch.manual_seed(0)
    BertModel(TINY).save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def perturb_trainable(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.05)


def test_zero_initialised_update_keeps_the_function(base_folder) -> None:
    model = BertForTokenClassification.from_pretrained(base_folder, id2label={0: "O", 1: "B-X"})
    inputs = torch.randint(0, 99, (2, 9))
    before = model(inputs).logits
    replaced = apply_lora(model, LoRAConfig(rank=4))
    assert len(replaced) == 2 * 6  # q, k, v, attention out, intermediate, output per layer
    torch.testing.assert_close(model(inputs).logits, before)


def test_only_adapters_heads_norms_and_biases_train(base_folder) -> None:
    model = BertForQuestionAnswering.from_pretrained(base_folder)
    apply_lora(model, LoRAConfig(rank=4, target_modules=("query", "value"), train_bias=False))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert "qa_outputs.weight" in trainable and "bert.encoder.layer.1.attention.self.query.lora_B" in trainable
    assert "bert.encoder.layer.0.output.LayerNorm.weight" in trainable
    assert "bert.encoder.layer.0.attention.self.query.weight" not in trainable
    assert "bert.encoder.layer.0.attention.self.key.bias" not in trainable
    assert "bert.embeddings.word_embeddings.weight" not in trainable
    lora = 2 * 2 * (4 * 32 + 32 * 4)
    norms = (1 + 2 * 2) * 2 * 32
    assert trainable_parameter_count(model) == lora + norms + 32 * 2 + 2


def test_merge_folds_the_update_into_plain_linears(base_folder) -> None:
    model = BertForSequenceClassification.from_pretrained(base_folder, id2label={0: "a", 1: "b"}).eval()
    apply_lora(model, LoRAConfig(rank=4, alpha=16))
    perturb_trainable(model)
    inputs = torch.randint(0, 99, (3, 7))
    expected = model(inputs).logits
    assert merge_lora(model) == 12
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(inputs).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_composite_round_trip_through_from_pretrained(base_folder, tmp_path, dtype, tolerance) -> None:
    model = BertForSequenceClassification.from_pretrained(base_folder, id2label={0: "neg", 1: "pos"}).eval()
    lora = LoRAConfig(rank=4, alpha=8, extra_modules=("bert.pooler",))
    apply_lora(model, lora)
    perturb_trainable(model)
    inputs = torch.randint(0, 99, (3, 7))
    expected = model(inputs).logits
    folder = save_composite(model, tmp_path / "composite", str(base_folder), read_state_dict(base_folder), lora, dtype)
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.safetensors", "config.json"]
    meta = json.loads((folder / "config.json").read_text())["bertserve"]
    assert meta["base_model"] == str(base_folder) and meta["adapter"]["lora"]["rank"] == 4
    loaded = BertForSequenceClassification.from_pretrained(folder)
    assert loaded.config.id2label == {0: "neg", 1: "pos"}
    torch.testing.assert_close(loaded(inputs).logits, expected, rtol=tolerance, atol=tolerance)


def test_composite_errors_name_the_problem(base_folder, tmp_path) -> None:
    model = BertForSequenceClassification.from_pretrained(base_folder, id2label={0: "a", 1: "b"})
    lora = LoRAConfig(rank=2)
    apply_lora(model, lora)
    folder = save_composite(model, tmp_path / "c", str(base_folder), read_state_dict(base_folder), lora)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"], config["num_attention_heads"] = 64, 4
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_size is 64 but the base model"):
        BertForSequenceClassification.from_pretrained(folder)
    (folder / "adapter.safetensors").unlink()
    config["hidden_size"] = 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match=r"adapter\.safetensors is missing"):
        BertForSequenceClassification.from_pretrained(folder)


def test_bad_lora_settings_are_refused(base_folder) -> None:
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        LoRAConfig(rank=0)
    model = BertForSequenceClassification.from_pretrained(base_folder, id2label={0: "a", 1: "b"})
    with pytest.raises(ValueError, match="no encoder linear layer matches"):
        apply_lora(model, LoRAConfig(target_modules=("nonexistent",)))
