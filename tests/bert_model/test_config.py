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
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError) as error:
        BertConfig.load(tmp_path)
    assert str(error.value) == UNSUPPORTED_GPT2


UNSUPPORTED_GPT2 = (
    "config.json has model_type 'gpt2'; supported: albert, bert, distilbert, electra, roberta, xlm-roberta"
)


def test_an_unsupported_model_type_gets_one_message() -> None:
    with pytest.raises(ValueError) as error:
        BertConfig(model_type="gpt2")
    assert str(error.value) == UNSUPPORTED_GPT2


# A tiny config of each family, in its own config.json key names.
FAMILY_CONFIGS = {
    "roberta": {"hidden_size": 32, "num_attention_heads": 4, "pad_token_id": 1, "type_vocab_size": 1},
    "xlm-roberta": {"hidden_size": 32, "num_attention_heads": 4, "pad_token_id": 1, "type_vocab_size": 1},
    "distilbert": {"dim": 32, "n_heads": 4, "n_layers": 3, "hidden_dim": 37, "activation": "relu", "dropout": 0.2},
    "electra": {"hidden_size": 32, "num_attention_heads": 4, "embedding_size": 16},
    "albert": {"hidden_size": 32, "num_attention_heads": 4, "embedding_size": 16, "classifier_dropout_prob": 0.3},
}


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_each_family_round_trips_through_transformers(family: str, tmp_path) -> None:
    theirs = transformers.AutoConfig.for_model(family, vocab_size=99, **FAMILY_CONFIGS[family])
    theirs.save_pretrained(tmp_path / "hf")
    ours = BertConfig.load(tmp_path / "hf")
    assert ours.model_type == family and ours.hidden_size == 32 and ours.num_attention_heads == 4
    ours.save(tmp_path / "ours", architecture=ours.architecture("ForMaskedLM"))
    again = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    assert type(again) is type(theirs)
    mine, reference = again.to_dict(), theirs.to_dict()
    differing = {
        k
        for k in reference
        if k not in {"architectures", "transformers_version", "_name_or_path"} and mine[k] != reference[k]
    }
    assert differing == set()
    assert BertConfig.load(tmp_path / "ours") == ours


def test_distilbert_and_albert_key_names_are_read_as_ours(tmp_path) -> None:
    distil = BertConfig.from_hf_dict({"model_type": "distilbert", **FAMILY_CONFIGS["distilbert"]})
    assert (distil.hidden_size, distil.num_hidden_layers, distil.intermediate_size) == (32, 3, 37)
    assert (distil.hidden_act, distil.hidden_dropout_prob, distil.type_vocab_size) == ("relu", 0.2, 0)
    assert distil.extra == {} and not distil.family.has_token_types
    albert = BertConfig.from_hf_dict({"model_type": "albert", **FAMILY_CONFIGS["albert"]})
    assert albert.classifier_dropout == 0.3 and albert.embedding_width == 16 and albert.projects_embeddings
    written = albert.to_hf_dict()
    assert written["classifier_dropout_prob"] == 0.3 and "classifier_dropout" not in written


def test_family_derived_values() -> None:
    roberta = BertConfig(model_type="roberta", pad_token_id=1, type_vocab_size=1, max_position_embeddings=514)
    assert roberta.position_offset == 2 and roberta.max_sequence_length == 512
    assert roberta.architecture("ForQuestionAnswering") == "RobertaForQuestionAnswering"
    assert BertConfig().max_sequence_length == 512 and not BertConfig().projects_embeddings
    electra = BertConfig(model_type="electra", hidden_size=32, num_attention_heads=4, embedding_size=32)
    assert not electra.projects_embeddings, "ELECTRA projects only when the embeddings are narrower"
    assert BertConfig(model_type="xlm-roberta", type_vocab_size=1, pad_token_id=1).architecture("Model") == (
        "XLMRobertaModel"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model_type": "distilbert"}, "model_type 'distilbert' has no token types: type_vocab_size must be 0, got 2"),
        ({"model_type": "bert", "type_vocab_size": 0}, "type_vocab_size must be a positive integer, got 0"),
        ({"embedding_size": 128}, r"model_type 'bert' has no embedding projection: embedding_size \(128\)"),
        ({"model_type": "albert", "num_hidden_groups": 2}, "num_hidden_groups=2, inner_group_num=1 is not supported"),
        ({"model_type": "albert", "inner_group_num": 0}, "inner_group_num must be a positive integer"),
        ({"sinusoidal_pos_embds": True}, "sinusoidal_pos_embds is a DistilBERT setting"),
        (
            {"model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 2},
            r"max_position_embeddings \(2\) leaves no position after the padding index",
        ),
        ({"model_type": "distilbert", "type_vocab_size": 0, "layer_norm_eps": 1e-5}, "fixes layer_norm_eps"),
    ],
)
def test_family_nonsense_is_refused(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BertConfig(**values)
