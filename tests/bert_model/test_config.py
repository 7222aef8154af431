"""BertConfig: presets, validation with clear errors, Hugging Face config.json round trip."""

from __future__ import annotations

import json

import pytest
import transformers

from bert_model.config import PRESETS, BertConfig
from bert_model.registry import minilm_path


def test_defaults_are_bert_base() -> None:
    config = BertConfig()
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (768, 12, 12)
    assert config.intermediate_size == 3072 and config.vocab_size == 30522 and config.head_dim == 64


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name: str) -> None:
    config = BertConfig.preset(name, vocab_size=1000)
    assert config.hidden_size % config.num_attention_heads == 0
    assert config.vocab_size == 1000


def test_large_preset() -> None:
    assert BertConfig.preset("large").num_hidden_layers == 24


def test_hidden_not_divisible_by_heads_is_refused_with_hint() -> None:
    with pytest.raises(ValueError, match=r"hidden_size \(100\) must be divisible by num_attention_heads \(12\)"):
        BertConfig(hidden_size=100, num_attention_heads=12)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_hidden_layers", 0, "num_hidden_layers must be a positive integer"),
        ("vocab_size", -5, "vocab_size must be a positive integer"),
        ("hidden_dropout_prob", 1.5, "hidden_dropout_prob must be in"),
        ("hidden_act", "swish2", "hidden_act 'swish2' is not one of"),
        ("attn_implementation", "flash", "attn_implementation 'flash'"),
        ("position_embedding_type", "relative_key", "not supported"),
        ("problem_type", "multi_class", "problem_type 'multi_class' is not one of"),
    ],
)
def test_nonsense_is_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BertConfig(**{field: value})


def test_unknown_preset_and_field() -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown BertConfig field"):
        BertConfig().replace(hiden_size=3)


def test_reads_the_minilm_config() -> None:
    config = BertConfig.load(minilm_path())
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (384, 6, 12)
    assert config.intermediate_size == 1536


def test_round_trip_through_transformers(tmp_path) -> None:
    ours = BertConfig.preset("mini", vocab_size=99).with_labels(["neg", "pos"])
    ours.save(tmp_path, architecture="BertForSequenceClassification")
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    assert theirs.hidden_size == 256 and theirs.num_hidden_layers == 4
    assert theirs.id2label == {0: "neg", 1: "pos"} and theirs.label2id == {"neg": 0, "pos": 1}
    theirs.save_pretrained(tmp_path / "hf")
    back = BertConfig.load(tmp_path / "hf")
    assert back.hidden_size == 256 and back.id2label == {0: "neg", 1: "pos"}
    assert back.vocab_size == 99


def test_unknown_keys_survive_a_round_trip(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "my_key": 1}))
    config = BertConfig.load(path)
    assert config.extra == {"my_key": 1}
    config.save(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["my_key"] == 1


def test_bad_config_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        BertConfig.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        BertConfig.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(ValueError, match="only 'bert'"):
        BertConfig.load(tmp_path)
